#include "controller/core/block_hash.h"

#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vamp {
namespace {

constexpr uint64_t kRefK0 = 0x0706050403020100ULL;  // key bytes 00..0f
constexpr uint64_t kRefK1 = 0x0f0e0d0c0b0a0908ULL;

BlockHash FromBytes(const uint8_t (&b)[16]) {
  BlockHash h;
  for (int i = 7; i >= 0; --i) h.lo = (h.lo << 8) | b[i];
  for (int i = 15; i >= 8; --i) h.hi = (h.hi << 8) | b[i];
  return h;
}

// SipHash-2-4-128 reference vectors (veorq/SipHash vectors.h, vectors_sip128): key 00..0f,
// message 00 01 .. (len-1).
TEST(SipHash128Test, MatchesReferenceVectors) {
  const std::map<int, std::vector<uint8_t>> vectors = {
      {0,
       {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02,
        0x93}},
      {1,
       {0xda, 0x87, 0xc1, 0xd8, 0x6b, 0x99, 0xaf, 0x44, 0x34, 0x76, 0x59, 0x11, 0x9b, 0x22, 0xfc,
        0x45}},
      {2,
       {0x81, 0x77, 0x22, 0x8d, 0xa4, 0xa4, 0x5d, 0xc7, 0xfc, 0xa3, 0x8b, 0xde, 0xf6, 0x0a, 0xff,
        0xe4}},
      {7,
       {0xa1, 0xf1, 0xeb, 0xbe, 0xd8, 0xdb, 0xc1, 0x53, 0xc0, 0xb8, 0x4a, 0xa6, 0x1f, 0xf0, 0x82,
        0x39}},
      {8,
       {0x3b, 0x62, 0xa9, 0xba, 0x62, 0x58, 0xf5, 0x61, 0x0f, 0x83, 0xe2, 0x64, 0xf3, 0x14, 0x97,
        0xb4}},
      {9,
       {0x26, 0x44, 0x99, 0x06, 0x0a, 0xd9, 0xba, 0xab, 0xc4, 0x7f, 0x8b, 0x02, 0xbb, 0x6d, 0x71,
        0xed}},
      {15,
       {0x54, 0x93, 0xe9, 0x99, 0x33, 0xb0, 0xa8, 0x11, 0x7e, 0x08, 0xec, 0x0f, 0x97, 0xcf, 0xc3,
        0xd9}},
      {16,
       {0x6e, 0xe2, 0xa4, 0xca, 0x67, 0xb0, 0x54, 0xbb, 0xfd, 0x33, 0x15, 0xbf, 0x85, 0x23, 0x05,
        0x77}},
      {17,
       {0x47, 0x3d, 0x06, 0xe8, 0x73, 0x8d, 0xb8, 0x98, 0x54, 0xc0, 0x66, 0xc4, 0x7a, 0xe4, 0x77,
        0x40}},
      {63,
       {0x51, 0x50, 0xd1, 0x77, 0x2f, 0x50, 0x83, 0x4a, 0x50, 0x3e, 0x06, 0x9a, 0x97, 0x3f, 0xbd,
        0x7c}},
  };
  for (const auto& [len, bytes] : vectors) {
    std::vector<uint8_t> msg(len);
    for (int i = 0; i < len; ++i) msg[i] = static_cast<uint8_t>(i);
    uint8_t want_bytes[16];
    for (int i = 0; i < 16; ++i) want_bytes[i] = bytes[i];
    const BlockHash want = FromBytes(want_bytes);
    SipHash128 one_shot(kRefK0, kRefK1);
    one_shot.AddBytes(msg.data(), msg.size());
    EXPECT_EQ(one_shot.Finish(), want) << "length " << len;
    // Any split of the input gives the same hash.
    for (int split = 0; split <= len; split += 3) {
      SipHash128 h(kRefK0, kRefK1);
      h.AddBytes(msg.data(), split);
      h.AddBytes(msg.data() + split, len - split);
      EXPECT_EQ(h.Finish(), want) << "length " << len << " split " << split;
    }
  }
}

TEST(SipHash128Test, WordHelpersEqualTheirLittleEndianBytes) {
  const uint8_t bytes[] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
                           0x99, 0xaa, 0xbb, 0xcc, 0x01, 0x02, 0x03, 0x04};
  SipHash128 a(1, 2);
  a.AddBytes(bytes, sizeof(bytes));
  SipHash128 b(1, 2);
  b.AddU32(0x44332211u);  // unaligned U64 follows
  b.AddU64(0xccbbaa9988776655ULL);
  b.AddU32(0x04030201u);
  EXPECT_EQ(a.Finish(), b.Finish());
}

TEST(BlockHasherTest, HashesTheDocumentedByteLayout) {
  const BlockHasher hasher(7, 9);
  const BlockHash parent{0x0102030405060708ULL, 0x1112131415161718ULL};
  const std::vector<TokenId> tokens = {5, -1, 70000};  // odd count: exercises the 4-byte tail
  const std::string extra = "salt";
  std::vector<uint8_t> bytes;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put(parent.lo, 8);
  put(parent.hi, 8);
  for (TokenId t : tokens) put(static_cast<uint32_t>(t), 4);
  put(extra.size(), 4);
  for (char c : extra) bytes.push_back(static_cast<uint8_t>(c));
  SipHash128 ref(7, 9);
  ref.AddBytes(bytes.data(), bytes.size());
  EXPECT_EQ(hasher.Hash(parent, tokens, extra), ref.Finish());
}

TEST(BlockHasherTest, DependsOnParentTokensOrderExtraAndKey) {
  const BlockHasher hasher;
  const std::vector<TokenId> a = {1, 2, 3, 4};
  const std::vector<TokenId> swapped = {2, 1, 3, 4};
  const BlockHash base = hasher.Hash(BlockHash{}, a, "");
  EXPECT_EQ(base, hasher.Hash(BlockHash{}, a, ""));  // deterministic
  EXPECT_NE(base, hasher.Hash(BlockHash{}, swapped, ""));
  EXPECT_NE(base, hasher.Hash(BlockHash{1, 0}, a, ""));
  EXPECT_NE(base, hasher.Hash(BlockHash{}, a, "tenant-a"));
  EXPECT_NE(hasher.Hash(BlockHash{}, a, "tenant-a"), hasher.Hash(BlockHash{}, a, "tenant-b"));
  EXPECT_NE(base, BlockHasher(1, 2).Hash(BlockHash{}, a, ""));
  EXPECT_EQ(base.ToHex().size(), 32u);
}

// The reference's streaming layout (parent, tokens as int32 LE, extra length as u32 LE, extra).
BlockHash StreamingReference(uint64_t k0, uint64_t k1, const BlockHash& parent,
                             const std::vector<TokenId>& tokens, const std::string& extra) {
  SipHash128 h(k0, k1);
  h.AddU64(parent.lo);
  h.AddU64(parent.hi);
  for (TokenId t : tokens) h.AddU32(static_cast<uint32_t>(t));
  h.AddU32(static_cast<uint32_t>(extra.size()));
  h.AddBytes(extra.data(), extra.size());
  return h.Finish();
}

TEST(BlockHasherTest, RegisterPathEqualsTheStreamingLayoutForAnyBlockLength) {
  // Unsalted blocks take BlockHasher's register-resident path; salted ones the streaming one.
  const BlockHasher hasher(11, 13);
  std::mt19937 rng(5);
  for (int n = 0; n <= 33; ++n) {
    std::vector<TokenId> tokens(n);
    for (TokenId& t : tokens) t = static_cast<TokenId>(rng());  // negative ones too
    const BlockHash parent{rng(), rng()};
    for (const std::string& extra : {std::string(), std::string("x"), std::string("salt-123")}) {
      EXPECT_EQ(hasher.Hash(parent, tokens, extra),
                StreamingReference(11, 13, parent, tokens, extra))
          << n << " tokens, extra '" << extra << "'";
    }
  }
}

TEST(BlockHasherTest, DefaultKeyHashesArePinned) {
  // Independently computed (a Python SipHash-2-4-128 that matches the reference vectors above):
  // the scheme (layout, key, chain rule) must not change across releases or processes.
  std::vector<TokenId> tokens(47);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<BlockHash> chain;
  const BlockHasher hasher;
  hasher.ExtendChain(tokens, 16, "tenant", 2, &chain);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0].ToHex(), "e9f09f10cf1c5bfb649dae5d27d383ad");
  EXPECT_EQ(chain[1].ToHex(), "8018219fbf276072b0aeb0080315cbdc");
  // An odd token count (15) through the register path.
  const std::vector<TokenId> odd(tokens.begin() + 32, tokens.end());
  EXPECT_EQ(hasher.Hash(chain[1], odd, "").ToHex(), "746481ae0de429a0f8f443095eb67252");
}

TEST(BlockHasherTest, ChainGrownBlockByBlockEqualsOneComputedAtOnce) {
  const BlockHasher hasher;
  constexpr int32_t kBlock = 4;
  std::vector<TokenId> tokens(41);
  std::iota(tokens.begin(), tokens.end(), 1000);
  std::vector<BlockHash> at_once;
  hasher.ExtendChain(tokens, kBlock, "salt", tokens.size() / kBlock, &at_once);
  ASSERT_EQ(at_once.size(), 10u);
  // The same tokens arriving one at a time, the chain extended whenever a block fills.
  std::vector<TokenId> arriving;
  std::vector<BlockHash> incremental;
  for (TokenId t : tokens) {
    arriving.push_back(t);
    hasher.ExtendChain(arriving, kBlock, "salt", arriving.size() / kBlock, &incremental);
  }
  EXPECT_EQ(incremental, at_once);
  // And in uneven steps (a prompt prefix first, then the rest), extending to fewer blocks than
  // are already there changing nothing.
  std::vector<BlockHash> uneven;
  hasher.ExtendChain(tokens, kBlock, "salt", 3, &uneven);
  hasher.ExtendChain(tokens, kBlock, "salt", 1, &uneven);
  hasher.ExtendChain(tokens, kBlock, "salt", 10, &uneven);
  EXPECT_EQ(uneven, at_once);
  // Each link is Hash(parent, its tokens, salt on the first block only).
  EXPECT_EQ(at_once[0], hasher.Hash(BlockHash{}, {1000, 1001, 1002, 1003}, "salt"));
  EXPECT_EQ(at_once[1], hasher.Hash(at_once[0], {1004, 1005, 1006, 1007}, ""));
}

TEST(BlockHasherTest, SaltAndKeySeparateWholeChains) {
  std::vector<TokenId> tokens(32);
  std::iota(tokens.begin(), tokens.end(), 7);
  auto chain = [&](const BlockHasher& hasher, const std::string& salt) {
    std::vector<BlockHash> c;
    hasher.ExtendChain(tokens, 4, salt, 8, &c);
    return c;
  };
  const BlockHasher hasher;
  const std::vector<BlockHash> plain = chain(hasher, "");
  const std::vector<BlockHash> a = chain(hasher, "tenant-a");
  const std::vector<BlockHash> b = chain(hasher, "tenant-b");
  const std::vector<BlockHash> other_key = chain(BlockHasher(1, 2), "");
  EXPECT_EQ(chain(hasher, "tenant-a"), a);  // deterministic
  for (size_t i = 0; i < plain.size(); ++i) {
    // The salt enters the first block only, yet no block of the chains is shared.
    EXPECT_NE(plain[i], a[i]) << i;
    EXPECT_NE(a[i], b[i]) << i;
    EXPECT_NE(plain[i], other_key[i]) << i;
  }
}

}  // namespace
}  // namespace vamp
