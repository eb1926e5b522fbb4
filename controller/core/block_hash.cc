#include "controller/core/block_hash.h"

#include <cstring>

#include "absl/strings/str_format.h"

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

}  // namespace

std::string BlockHash::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

SipHash128::SipHash128(uint64_t k0, uint64_t k1)
    : v0_(k0 ^ 0x736f6d6570736575ULL),
      v1_(k1 ^ 0x646f72616e646f6dULL ^ 0xee),  // 0xee selects the 128-bit output variant
      v2_(k0 ^ 0x6c7967656e657261ULL),
      v3_(k1 ^ 0x7465646279746573ULL) {}

void SipHash128::Compress(uint64_t m) {
  v3_ ^= m;
  SipRound(v0_, v1_, v2_, v3_);  // c = 2 compression rounds
  SipRound(v0_, v1_, v2_, v3_);
  v0_ ^= m;
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
  const uint64_t last = tail_ | (static_cast<uint64_t>(total_bytes_ & 0xff) << 56);
  Compress(last);
  v2_ ^= 0xee;
  for (int i = 0; i < 4; ++i) SipRound(v0_, v1_, v2_, v3_);  // d = 4 finalization rounds
  BlockHash out;
  out.lo = v0_ ^ v1_ ^ v2_ ^ v3_;
  v1_ ^= 0xdd;
  for (int i = 0; i < 4; ++i) SipRound(v0_, v1_, v2_, v3_);
  out.hi = v0_ ^ v1_ ^ v2_ ^ v3_;
  return out;
}

BlockHash BlockHasher::Hash(const BlockHash& parent, absl::Span<const TokenId> tokens,
                            absl::string_view extra) const {
  SipHash128 h(key0_, key1_);
  h.AddU64(parent.lo);
  h.AddU64(parent.hi);
  size_t i = 0;
  // Two int32 tokens per little-endian word: identical to hashing their bytes, but word-at-a-time.
  for (; i + 1 < tokens.size(); i += 2) {
    h.AddU64(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
             (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32));
  }
  if (i < tokens.size()) h.AddU32(static_cast<uint32_t>(tokens[i]));
  h.AddU32(static_cast<uint32_t>(extra.size()));
  if (!extra.empty()) h.AddBytes(extra.data(), extra.size());
  return h.Finish();
}

}  // namespace vamp
