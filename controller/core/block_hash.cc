#include "controller/core/block_hash.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace vamp {
namespace {

inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline void SipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = Rotl(v1, 13);
  v1 ^= v0;
  v0 = Rotl(v0, 32);
  v2 += v3;
  v3 = Rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = Rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = Rotl(v1, 17);
  v1 ^= v2;
  v2 = Rotl(v2, 32);
}

// SipHash-2-4-128's state with the message words fed in whole; SipHash128 adds the byte stream.
struct SipState {
  uint64_t v0, v1, v2, v3;
  SipState(uint64_t k0, uint64_t k1)
      : v0(k0 ^ 0x736f6d6570736575ULL),
        v1(k1 ^ 0x646f72616e646f6dULL ^ 0xee),  // 0xee selects the 128-bit output variant
        v2(k0 ^ 0x6c7967656e657261ULL),
        v3(k1 ^ 0x7465646279746573ULL) {}
  void Compress(uint64_t m) {
    v3 ^= m;
    SipRound(v0, v1, v2, v3);  // c = 2 compression rounds
    SipRound(v0, v1, v2, v3);
    v0 ^= m;
  }
  // `last`: the pending bytes little-endian, the message length mod 256 in the top byte.
  BlockHash Finish(uint64_t last) {
    Compress(last);
    v2 ^= 0xee;
    for (int i = 0; i < 4; ++i) SipRound(v0, v1, v2, v3);  // d = 4 finalization rounds
    BlockHash out;
    out.lo = v0 ^ v1 ^ v2 ^ v3;
    v1 ^= 0xdd;
    for (int i = 0; i < 4; ++i) SipRound(v0, v1, v2, v3);
    out.hi = v0 ^ v1 ^ v2 ^ v3;
    return out;
  }
};

}  // namespace

std::string BlockHash::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

SipHash128::SipHash128(uint64_t k0, uint64_t k1) {
  const SipState s(k0, k1);
  v0_ = s.v0;
  v1_ = s.v1;
  v2_ = s.v2;
  v3_ = s.v3;
}

void SipHash128::Compress(uint64_t m) {
  SipState s(0, 0);
  s.v0 = v0_;
  s.v1 = v1_;
  s.v2 = v2_;
  s.v3 = v3_;
  s.Compress(m);
  v0_ = s.v0;
  v1_ = s.v1;
  v2_ = s.v2;
  v3_ = s.v3;
}

void SipHash128::AddBytes(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += n;
  // Fill the pending word first.
  while (tail_bytes_ != 0 && n > 0) {
    tail_ |= static_cast<uint64_t>(*p++) << (8 * tail_bytes_);
    --n;
    if (++tail_bytes_ == 8) {
      Compress(tail_);
      tail_ = 0;
      tail_bytes_ = 0;
    }
  }
  while (n >= 8) {
    uint64_t m = 0;
    for (int i = 7; i >= 0; --i) m = (m << 8) | p[i];  // little-endian on any host
    Compress(m);
    p += 8;
    n -= 8;
  }
  for (size_t i = 0; i < n; ++i) tail_ |= static_cast<uint64_t>(p[i]) << (8 * tail_bytes_++);
}

void SipHash128::AddU64(uint64_t v) {
  if (tail_bytes_ == 0) {
    total_bytes_ += 8;
    Compress(v);
    return;
  }
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  AddBytes(b, 8);
}

void SipHash128::AddU32(uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  AddBytes(b, 4);
}

BlockHash SipHash128::Finish() {
  SipState s(0, 0);
  s.v0 = v0_;
  s.v1 = v1_;
  s.v2 = v2_;
  s.v3 = v3_;
  return s.Finish(tail_ | (static_cast<uint64_t>(total_bytes_ & 0xff) << 56));
}

BlockHash BlockHasher::Hash(const BlockHash& parent, absl::Span<const TokenId> tokens,
                            absl::string_view extra) const {
  if (!extra.empty()) {
    // Blocks with extra keys (a salted chain's first block) are rare: the streaming path.
    SipHash128 h(key0_, key1_);
    h.AddU64(parent.lo);
    h.AddU64(parent.hi);
    size_t i = 0;
    for (; i + 1 < tokens.size(); i += 2) {
      h.AddU64(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
               (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32));
    }
    if (i < tokens.size()) h.AddU32(static_cast<uint32_t>(tokens[i]));
    h.AddU32(static_cast<uint32_t>(extra.size()));
    h.AddBytes(extra.data(), extra.size());
    return h.Finish();
  }
  // The common block, SipHash's state in registers: the same message, hence the same hash, as the
  // streaming path above (the tests pin the two together). The message stays word-aligned through
  // the parent and the token pairs (two int32 tokens per little-endian word); then come an odd
  // last token, if any, and the extra length 0 as u32.
  SipState s(key0_, key1_);
  s.Compress(parent.lo);
  s.Compress(parent.hi);
  const size_t n = tokens.size();
  size_t i = 0;
  for (; i + 1 < n; i += 2) {
    s.Compress(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
               (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32));
  }
  if (i < n) {
    s.Compress(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])));  // token, length 0
  }
  // Pending now: nothing, or the 4 zero bytes of the length; either way zero bits.
  const uint64_t total_bytes = 16 + 4 * static_cast<uint64_t>(n) + 4;
  return s.Finish((total_bytes & 0xff) << 56);
}

void BlockHasher::ExtendChain(absl::Span<const TokenId> tokens, int32_t block_size,
                              absl::string_view cache_salt, size_t num_blocks,
                              std::vector<BlockHash>* chain) const {
  VAMP_CHECK(block_size > 0 && num_blocks * static_cast<size_t>(block_size) <= tokens.size())
      << num_blocks << " full blocks of " << block_size << " need more than " << tokens.size()
      << " tokens";
  if (chain->size() >= num_blocks) return;
  if (chain->empty()) chain->reserve(num_blocks);  // (not when extending: keep growth geometric)
  const size_t bs = static_cast<size_t>(block_size);
  for (size_t i = chain->size(); i < num_blocks; ++i) {
    const BlockHash parent = i == 0 ? BlockHash{} : (*chain)[i - 1];
    chain->push_back(Hash(parent, tokens.subspan(i * bs, bs), i == 0 ? cache_salt : ""));
  }
}

}  // namespace vamp
