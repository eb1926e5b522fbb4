// vamp-agent's steps over gRPC on loopback, CPU, tiny qwen3_moe checkpoint: golden greedy
// decoding, prefix-cache hits, preemption and resume, and bad steps naming the field while the
// stream keeps serving; and the tiny qwen3_next, whose hits restore recurrent-state snapshots.
#include "agent/agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/agent_test_util.h"

namespace vamp::testing {
namespace {

using ::testing::HasSubstr;

TEST(AgentTest, GreedyDecodingMatchesGoldens) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[3], 16);  // batched with another request
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[3]);
  vamp::v1::GetStatsResponse stats;
  ASSERT_TRUE(client.GetStats(&stats).ok());
  EXPECT_EQ(stats.steps(), controller.step_id());
  EXPECT_GT(stats.last_step().total_us(), 0);
}

TEST(AgentTest, PrefixCacheHitGivesSameTokensAsFreshPrefill) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  const std::vector<int32_t>& prompt = g.prompts[2];  // 33 tokens: 2 full blocks + 1
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, prompt, 8);
  controller.Run(client);
  const std::vector<int32_t> fresh = controller.request(1).outputs;
  EXPECT_EQ(fresh,
            std::vector<int32_t>(g.continuations[2].begin(), g.continuations[2].begin() + 8));
  // The second request reuses the first one's two full prompt blocks (a prefix-cache hit).
  const std::vector<int32_t> cached(controller.request(1).blocks.begin(),
                                    controller.request(1).blocks.begin() + 2);
  controller.Submit(2, prompt, 8, cached, 32);
  controller.Run(client);
  EXPECT_EQ(controller.request(2).outputs, fresh);
  EXPECT_EQ(controller.request(2).initial_computed, 32);
}

TEST(AgentTest, PreemptedRequestResumesWithSameTokens) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const auto g = LoadGoldens();
  MiniController controller;
  controller.set_num_blocks(init.memory().kv_blocks());
  controller.Submit(1, g.prompts[1], 16);
  controller.Submit(2, g.prompts[0], 16);
  for (int i = 0; i < 5; ++i) {
    auto r = client.Step(controller.Next());
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->error_message(), "");
    controller.Apply(*r);
  }
  controller.Preempt(1);
  auto r = client.Step(controller.Next());  // request 1 preempted, request 2 decodes
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->error_message(), "");
  ASSERT_EQ(r->sampled_size(), 1);
  EXPECT_EQ(r->sampled(0).request_id(), 2u);
  controller.Apply(*r);
  controller.Run(client);  // resumed with a new block table, recomputed from 0
  EXPECT_EQ(controller.request(1).outputs, g.continuations[1]);
  EXPECT_EQ(controller.request(2).outputs, g.continuations[0]);
}

TEST(AgentTest, BadStepNamesFieldAndStreamKeepsServing) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  // Before Init: an error, not a crash.
  vamp::v1::StepRequest empty;
  empty.set_step_id(1);
  auto r = client.Step(empty);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("not initialised"));
  EXPECT_EQ(r->step_id(), 1);
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(TinyInitRequest(), &init).ok());
  const int64_t pool = init.memory().kv_blocks();

  MiniController controller;
  controller.set_num_blocks(pool);
  controller.Submit(1, LoadGoldens().prompts[1], 16);
  vamp::v1::StepRequest good = controller.Next();

  struct Case {
    std::string name;
    std::function<void(vamp::v1::StepRequest*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown cached",
       [](auto* s) {
         auto* c = s->add_cached_requests();
         c->set_request_id(77);
         c->set_num_scheduled_tokens(1);
       },
       "cached_requests[0].request_id 77 is unknown"},
      {"block range", [&](auto* s) { s->mutable_new_requests(0)->set_block_ids(0, 100000); },
       "new_requests[0].block_ids[0] = 100000 is outside the KV pool"},
      {"token range", [](auto* s) { s->mutable_new_requests(0)->set_prompt_token_ids(2, 999); },
       "new_requests[0].prompt_token_ids[2] = 999"},
      {"min_p", [](auto* s) { s->mutable_new_requests(0)->mutable_sampling()->set_min_p(1.5f); },
       "new_requests[0].sampling.min_p must be in [0, 1]"},
      {"penalty",
       [](auto* s) {
         s->mutable_new_requests(0)->mutable_sampling()->set_repetition_penalty(-1.0f);
       },
       "repetition_penalty >= 0"},
      {"top_p", [](auto* s) { s->mutable_new_requests(0)->mutable_sampling()->set_top_p(3); },
       "new_requests[0].sampling.top_p"},
      {"min_tokens",
       [](auto* s) { s->mutable_new_requests(0)->set_min_tokens(-4); },
       "new_requests[0].min_tokens must be >= 0"},
      {"unknown preempted", [](auto* s) { s->add_preempted_request_ids(5); },
       "preempted_request_ids[0]: request 5 is unknown"},
      {"pool", [&](auto* s) { s->set_num_blocks(pool + 1); }, "num_blocks"},
      {"too many tokens", [](auto* s) { s->mutable_new_requests(0)->set_num_scheduled_tokens(50); },
       "num_tokens 50"},
  };
  for (const Case& c : cases) {
    vamp::v1::StepRequest bad = good;
    c.edit(&bad);
    auto response = client.Step(bad);
    ASSERT_TRUE(response.ok()) << c.name;
    EXPECT_THAT(response->error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(response->sampled().empty()) << c.name;
    EXPECT_TRUE(response->has_memory()) << c.name;
  }
  // Nothing of the rejected steps was applied: the good step and the rest of decoding work.
  auto first = client.Step(good);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->error_message(), "");
  controller.Apply(*first);
  // A duplicate announcement of a running request is refused too.
  vamp::v1::StepRequest again = good;
  again.set_step_id(controller.NextStepId());
  r = client.Step(again);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->error_message(), HasSubstr("new_requests[0].request_id 1 is already known"));
  controller.Run(client);
  EXPECT_EQ(controller.request(1).outputs, LoadGoldens().continuations[1]);
}

// Qwen3-Next (the tiny checkpoint): the agent declares its recurrent state and serves prefix hits
// from the snapshots its steps capture: a hit with its snapshot gives the fresh prefill's tokens,
// one without is refused naming the request, and the stream keeps serving.
TEST(AgentTest, Qwen3NextServesHitsFromTheSnapshotsItsStepsCapture) {
  auto agent = StartAgent();
  ASSERT_NE(agent, nullptr);
  AgentClient client(agent->grpc_port());
  vamp::v1::InitRequest request = TinyInitRequest();
  request.set_model_path(TestDataDir() + "/tiny-qwen3-next");
  vamp::v1::InitResponse init;
  ASSERT_TRUE(client.Init(request, &init).ok());
  // 2 linear-attention layers x (3 x 96 conv + 4 x 8 x 16 delta-rule floats) x 4 bytes.
  EXPECT_EQ(init.recurrent_state_bytes(), 6400u);
  EXPECT_FALSE(init.prefix_caching_unsupported());
  EXPECT_THAT(init.memory_plan_text(), HasSubstr("recurrent state:"));

  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 256);
  int64_t step_id = 0;
  // Request `id` prefilled on blocks `blocks` after `hit` cached tokens, then decoded to 4
  // tokens; `edit` shapes its first step. The tokens, or the first step's error.
  auto run =
      [&](uint64_t id, std::vector<int32_t> blocks, int32_t hit,
          std::function<void(vamp::v1::NewRequest*)> edit) -> absl::StatusOr<std::vector<int32_t>> {
    vamp::v1::StepRequest step;
    step.set_step_id(++step_id);
    step.set_num_blocks(init.memory().kv_blocks());
    vamp::v1::NewRequest* r = step.add_new_requests();
    r->set_request_id(id);
    r->mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    r->mutable_block_ids()->Add(blocks.begin(), blocks.end());
    r->set_num_computed_tokens(hit);
    r->set_num_scheduled_tokens(40 - hit);
    r->mutable_sampling()->set_temperature(0);
    edit(r);
    std::vector<int32_t> tokens;
    for (int32_t computed = 40; tokens.size() < 4; ++computed) {
      absl::StatusOr<vamp::v1::StepResponse> out = client.Step(step);
      if (!out.ok()) return out.status();
      if (!out->error_message().empty()) return absl::InternalError(out->error_message());
      tokens.push_back(out->sampled(0).token_ids(0));
      step = vamp::v1::StepRequest();
      step.set_step_id(++step_id);
      step.set_num_blocks(init.memory().kv_blocks());
      vamp::v1::CachedRequest* c = step.add_cached_requests();
      c->set_request_id(id);
      c->set_num_computed_tokens(computed);
      c->set_num_scheduled_tokens(1);
    }
    step.clear_cached_requests();
    step.add_finished_request_ids(id);
    EXPECT_TRUE(client.Step(step).ok());
    return tokens;
  };
  // Request 1 captures its state after 32 tokens into block 20.
  auto fresh = run(1, {0, 1, 2}, 0, [](vamp::v1::NewRequest* r) {
    r->mutable_capture_state()->set_num_tokens(32);
    r->mutable_capture_state()->add_block_ids(20);
  });
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  // Without the snapshot, a hit on its blocks is refused.
  auto refused = run(2, {0, 1, 3}, 32, [](vamp::v1::NewRequest*) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("new request 2: num_computed_tokens 32 (a prefix-cache hit) cannot be "
                        "served: it needs restore_state"));
  auto wrong = run(3, {0, 1, 3}, 32, [](vamp::v1::NewRequest* r) {
    r->mutable_restore_state()->set_num_tokens(32);
    r->mutable_restore_state()->add_block_ids(21);
  });
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("blocks [21] hold no snapshot"));
  // With it, the fresh prefill's tokens.
  auto hit = run(4, {0, 1, 3}, 32, [](vamp::v1::NewRequest* r) {
    r->mutable_restore_state()->set_num_tokens(32);
    r->mutable_restore_state()->add_block_ids(20);
  });
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(*hit, *fresh);
}

}  // namespace
}  // namespace vamp::testing
