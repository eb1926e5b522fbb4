#include "controller/core/request.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vamp {
namespace {

constexpr int32_t kMaxLen = 100;

Request Make(SamplingParams params, std::optional<TokenId> eos = 2, int prompt_len = 4) {
  RequestSpec spec;
  spec.id = 7;
  spec.prompt_token_ids.assign(prompt_len, 5);
  spec.sampling_params = std::move(params);
  spec.eos_token_id = eos;
  return Request(std::move(spec), 0, 0);
}

TEST(RequestTest, MaxTokensCapsLength) {
  SamplingParams p;
  p.max_tokens = 2;
  Request r = Make(p);
  EXPECT_EQ(r.RemainingOutputBudget(kMaxLen), 2);
  EXPECT_FALSE(r.AppendOutputToken(9, kMaxLen));
  EXPECT_EQ(r.RemainingOutputBudget(kMaxLen), 1);
  EXPECT_TRUE(r.AppendOutputToken(9, kMaxLen));
  EXPECT_EQ(r.finish_reason(), FinishReason::kLength);
  EXPECT_EQ(r.status(), RequestStatus::kFinished);
  EXPECT_EQ(r.num_output_tokens(), 2);
}

TEST(RequestTest, MaxModelLenCapsLength) {
  Request r = Make(SamplingParams(), 2, 8);
  EXPECT_EQ(r.RemainingOutputBudget(10), 2);
  EXPECT_FALSE(r.AppendOutputToken(9, 10));
  EXPECT_TRUE(r.AppendOutputToken(9, 10));
  EXPECT_EQ(r.finish_reason(), FinishReason::kLength);
}

TEST(RequestTest, EosStopsUnlessIgnored) {
  Request r = Make(SamplingParams());
  EXPECT_TRUE(r.AppendOutputToken(2, kMaxLen));
  EXPECT_EQ(r.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(r.stop_token_id(), 2);

  SamplingParams ignore;
  ignore.ignore_eos = true;
  Request r2 = Make(ignore);
  EXPECT_FALSE(r2.AppendOutputToken(2, kMaxLen));

  Request no_eos = Make(SamplingParams(), std::nullopt);
  EXPECT_FALSE(no_eos.AppendOutputToken(2, kMaxLen));
}

TEST(RequestTest, StopTokensStopEvenWithIgnoreEos) {
  SamplingParams p;
  p.stop_token_ids = {11, 12};
  p.ignore_eos = true;
  Request r = Make(p);
  EXPECT_FALSE(r.AppendOutputToken(10, kMaxLen));
  EXPECT_TRUE(r.AppendOutputToken(12, kMaxLen));
  EXPECT_EQ(r.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(r.stop_token_id(), 12);
  EXPECT_EQ(r.output_token_ids().back(), 12);  // the stop token is kept
}

TEST(RequestTest, MinTokensDefersStopsButNotLength) {
  SamplingParams p;
  p.min_tokens = 2;
  p.max_tokens = 2;
  p.stop_token_ids = {11};
  Request r = Make(p);
  EXPECT_FALSE(r.AppendOutputToken(2, kMaxLen));  // EOS before min_tokens
  EXPECT_TRUE(r.AppendOutputToken(11, kMaxLen));  // length wins at max_tokens
  EXPECT_EQ(r.finish_reason(), FinishReason::kLength);
}

TEST(RequestTest, BlockHashesChainAndIncludeTheSalt) {
  RequestSpec spec;
  spec.prompt_token_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  spec.cache_salt = std::string(1, 's');  // (GCC 12 -Wrestrict false positive on "s")
  Request r(std::move(spec), 0, 0);
  const BlockHasher hasher;
  r.EnsureBlockHashes(2, 4, hasher);
  ASSERT_EQ(r.block_hashes().size(), 2u);
  const std::vector<TokenId> first = {1, 2, 3, 4}, second = {5, 6, 7, 8};
  EXPECT_EQ(r.block_hashes()[0], hasher.Hash(BlockHash{}, first, "s"));
  EXPECT_EQ(r.block_hashes()[1], hasher.Hash(r.block_hashes()[0], second, ""));
}

TEST(RequestTest, SamePrefixHasSameBlockHashesHoweverItArrived) {
  // Tokens 0..22 with salt "s", blocks of 4: as one 23-token prompt; as a 6-token prompt whose
  // outputs bring the rest one token at a time (hashed as blocks fill, the way the scheduler
  // caches computed blocks); and as a prompt whose hashes came with the spec (computed where it
  // arrived).
  constexpr int32_t kBlock = 4;
  const BlockHasher hasher;
  std::vector<TokenId> tokens(23);
  for (int i = 0; i < 23; ++i) tokens[i] = 40 + i;
  auto spec_of = [&](std::vector<TokenId> prompt) {
    RequestSpec spec;
    spec.id = 1;
    spec.prompt_token_ids = std::move(prompt);
    spec.cache_salt = std::string(1, 's');
    return spec;
  };
  Request whole(spec_of(tokens), 0, 0);
  whole.EnsureBlockHashes(5, kBlock, hasher);

  Request grown(spec_of({tokens.begin(), tokens.begin() + 6}), 0, 1);
  for (size_t i = 6; i < tokens.size(); ++i) {
    ASSERT_FALSE(grown.AppendOutputToken(tokens[i], kMaxLen));
    grown.EnsureBlockHashes(grown.num_tokens() / kBlock, kBlock, hasher);
  }
  EXPECT_EQ(grown.block_hashes(), whole.block_hashes());

  RequestSpec handed = spec_of(tokens);
  hasher.ExtendChain(tokens, kBlock, "s", 5, &handed.prompt_block_hashes);
  Request given(std::move(handed), 0, 2);
  EXPECT_EQ(given.block_hashes(), whole.block_hashes());
  // A different salt separates every block.
  RequestSpec other = spec_of(tokens);
  other.cache_salt = std::string(1, 't');
  Request salted(std::move(other), 0, 3);
  salted.EnsureBlockHashes(5, kBlock, hasher);
  for (int i = 0; i < 5; ++i) EXPECT_NE(salted.block_hashes()[i], whole.block_hashes()[i]) << i;
}

TEST(SamplingParamsTest, ValidateNamesTheField) {
  auto error_of = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return std::string(p.Validate().message());
  };
  EXPECT_TRUE(SamplingParams().Validate().ok());
  EXPECT_NE(error_of([](SamplingParams& p) { p.max_tokens = 0; }).find("max_tokens"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) {
              p.max_tokens = 1;
              p.min_tokens = 2;
            }).find("min_tokens"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.temperature = -1; }).find("temperature"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.stop_token_ids = {-3}; }).find("stop_token_ids"),
            std::string::npos);
  EXPECT_NE(
      error_of([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
      std::string::npos);
}

}  // namespace
}  // namespace vamp
