// Chained content hashes of full KV blocks, the keys of the prefix cache.
//
// A full block's hash covers its parent block's hash, its `block_size` token ids and optional extra
// keys (for now the request's cache salt, hashed into the first block only, so that two tenants
// with different salts never share KV). Because the parent hash is part of the input, equal hashes
// mean equal whole prefixes, not just equal blocks.
//
// The hash is SipHash-2-4 with 128-bit output (Aumasson & Bernstein), implemented here so that it
// is deterministic across processes, runs and machines (absl::Hash is seeded per process). 128 bits
// make accidental collisions negligible (~2^-64 even after 2^32 cached blocks). SipHash is a keyed
// PRF: with the default fixed key the hashes are reproducible (tests, the simulator, replays); a
// deployment that serves mutually untrusted tenants should set a secret key so nobody can craft
// colliding prompts.
#ifndef VAMP_CONTROLLER_CORE_BLOCK_HASH_H_
#define VAMP_CONTROLLER_CORE_BLOCK_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace vamp {

using TokenId = int32_t;

// A 128-bit block hash. The all-zero value stands for "no parent" (the first block of a sequence).
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
  // 32 lowercase hex digits, high word first.
  std::string ToHex() const;
};

// Hash-table hasher for BlockHash keys. The key already is a uniformly distributed PRF output, so
// its low word is a good table hash; this keeps map lookups cheap and independent of absl::Hash.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi >> 7)); }
};

// Streaming SipHash-2-4 with 128-bit output over a byte stream. Words are read little-endian, as in
// the reference implementation, so the result matches its test vectors for any split of the input.
class SipHash128 {
 public:
  SipHash128(uint64_t k0, uint64_t k1);
  void AddBytes(const void* data, size_t n);
  // Same as AddBytes of the value's 8 little-endian bytes (fast path when the stream is aligned).
  void AddU64(uint64_t v);
  void AddU32(uint32_t v);
  BlockHash Finish();

 private:
  void Compress(uint64_t m);
  uint64_t v0_, v1_, v2_, v3_;
  uint64_t tail_ = 0;      // pending bytes, little-endian
  size_t tail_bytes_ = 0;  // 0..7
  uint64_t total_bytes_ = 0;
};

// Hashes full blocks for one pool geometry and key.
class BlockHasher {
 public:
  // The key used when none is configured (reproducible hashes).
  static constexpr uint64_t kDefaultKey0 = 0x76616d702d6b7630ULL;  // "vamp-kv0"
  static constexpr uint64_t kDefaultKey1 = 0x7072656669782d31ULL;  // "prefix-1"

  explicit BlockHasher(uint64_t key0 = kDefaultKey0, uint64_t key1 = kDefaultKey1)
      : key0_(key0), key1_(key1) {}

  // Hash of a full block. `parent` is the previous block's hash or BlockHash{} for the first block;
  // `tokens` are exactly the block's tokens; `extra` are extra keys (empty for most blocks).
  // Input layout (unambiguous for a fixed block size): parent.lo, parent.hi, tokens as int32 LE,
  // extra length as u32 LE, extra bytes. Thread-safe (const, no state).
  BlockHash Hash(const BlockHash& parent, absl::Span<const TokenId> tokens,
                 absl::string_view extra) const;

  // The chain rule over a token sequence, the one place it is written down: full block i hashes
  // block i-1's hash (BlockHash{} for i = 0), its `block_size` tokens and, for block 0 only,
  // `cache_salt`, which thereby separates the whole chain. Extends `chain` (the hashes of the first
  // chain->size() full blocks of `tokens`) to the first `num_blocks` full blocks; requires
  // num_blocks * block_size <= tokens.size(). The result depends on the tokens alone, not on how
  // they arrived: a chain extended a block at a time as tokens come equals one computed at once.
  void ExtendChain(absl::Span<const TokenId> tokens, int32_t block_size,
                   absl::string_view cache_salt, size_t num_blocks,
                   std::vector<BlockHash>* chain) const;

 private:
  uint64_t key0_;
  uint64_t key1_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_BLOCK_HASH_H_
