// Tensor parallelism on the CPU: the in-host all-reduce, and TP=2 runners (ranks as threads)
// against TP=1.
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/runner/comm/host_communicator.h"
#include "gtest/gtest.h"
#include "tests/engine/runner/runner_test_util.h"

namespace vamp {
namespace {

using testing::LoadGoldens;
using testing::MakeTinyEngine;
using testing::MiniScheduler;
using testing::Range;

TEST(HostCommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  for (int size : {1, 2, 3, 4}) {
    auto group = HostCommunicatorGroup::Create(size);
    ASSERT_TRUE(group.ok());
    const int64_t n = 1000;
    std::vector<std::vector<float>> data(size, std::vector<float>(n));
    std::vector<std::vector<float>> original = data;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) data[r][i] = original[r][i] = std::sin(i * 0.1f + r) * 1e3f;
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(size);
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        // Several rounds: results of one call must not leak into the next.
        for (int round = 0; round < 5 && status[r].ok(); ++round) {
          status[r] = (*group)->rank(r)->AllReduceSum(data[r].data(), n);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < size; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
    // Expected: five rounds of summation in rank order.
    std::vector<std::vector<float>> want = original;
    for (int round = 0; round < 5; ++round) {
      std::vector<float> sum = want[0];
      for (int r = 1; r < size; ++r) {
        for (int64_t i = 0; i < n; ++i) sum[i] += want[r][i];
      }
      for (int r = 0; r < size; ++r) want[r] = sum;
    }
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(0, std::memcmp(data[r].data(), want[0].data(), n * sizeof(float))) << size;
    }
    EXPECT_EQ((*group)->rank(size - 1)->rank(), size - 1);
    EXPECT_EQ((*group)->rank(0)->size(), size);
  }
}

TEST(HostCommunicatorTest, AbortAndSizeMismatchFailInsteadOfHanging) {
  auto group = HostCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  std::vector<float> a(4), b(5);
  absl::Status sa, sb;
  std::thread t([&] { sa = (*group)->rank(0)->AllReduceSum(a.data(), 4); });
  sb = (*group)->rank(1)->AllReduceSum(b.data(), 5);
  t.join();
  EXPECT_FALSE(sa.ok());
  EXPECT_FALSE(sb.ok());
  EXPECT_NE((std::string(sa.message()) + std::string(sb.message())).find("size mismatch"),
            std::string::npos);

  auto group2 = HostCommunicatorGroup::Create(2);
  absl::Status waiting;
  std::thread w([&] { waiting = (*group2)->rank(0)->AllReduceSum(a.data(), 4); });
  (*group2)->Abort(absl::UnavailableError("rank 1 failed"));
  w.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(HostCommunicatorGroup::Create(0).ok());
}

TEST(TensorParallelTest, Tp2EqualsTp1WithinFloatTolerance) {
  const auto g = LoadGoldens();
  auto group = HostCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  auto rank0 = MakeTinyEngine({0, 2}, (*group)->rank(0));
  auto rank1 = MakeTinyEngine({1, 2}, (*group)->rank(1));
  auto tp1 = MakeTinyEngine();
  ASSERT_TRUE(rank0 && rank1 && tp1);
  EXPECT_EQ(rank0->model->kv_heads_per_rank(), 1);
  EXPECT_EQ(rank0->experts->layout().inter, 12);

  MiniScheduler sched(16, Range(0, 256), 9);
  MiniScheduler sched_tp1(16, Range(0, 256), 9);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    sched.Submit(i, g.prompts[i], 16);
    sched_tp1.Submit(i, g.prompts[i], 16);
  }
  double max_rel = 0;
  for (int step = 0; !sched.Done(); ++step) {
    ASSERT_LT(step, 1000);
    const StepInput in = sched.Next();
    absl::StatusOr<StepOutput> out0, out1;
    std::thread t1([&] { out1 = rank1->runner->ExecuteStep(in); });
    out0 = rank0->runner->ExecuteStep(in);
    t1.join();
    ASSERT_TRUE(out0.ok()) << out0.status();
    ASSERT_TRUE(out1.ok()) << out1.status();
    const StepInput in1 = sched_tp1.Next();
    auto ref = tp1->runner->ExecuteStep(in1);
    ASSERT_TRUE(ref.ok());
    // Both ranks hold bit-identical logits and sample the same tokens.
    ASSERT_EQ(out0->sampled.size(), out1->sampled.size());
    for (size_t i = 0; i < out0->logits.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(out0->logits[i].data(), out1->logits[i].data(),
                               out0->logits[i].size() * sizeof(float)));
      ASSERT_EQ(out0->logits[i].size(), ref->logits[i].size());
      for (size_t j = 0; j < ref->logits[i].size(); ++j) {
        const double want = ref->logits[i][j];
        const double rel = std::abs(out0->logits[i][j] - want) / std::max(1.0, std::abs(want));
        max_rel = std::max(max_rel, rel);
        ASSERT_LE(rel, 1e-5) << "step " << step << " seq " << i << " element " << j;
      }
    }
    for (size_t i = 0; i < out0->sampled.size(); ++i) {
      EXPECT_EQ(out0->sampled[i].token, out1->sampled[i].token);
    }
    sched.OnOutput(in, *out0);
    sched_tp1.OnOutput(in1, *ref);
  }
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    EXPECT_EQ(sched.request(i).outputs, g.continuations[i]) << "prompt " << i;
    EXPECT_EQ(sched.request(i).outputs, sched_tp1.request(i).outputs);
  }
  RecordProperty("max_relative_logit_difference", std::to_string(max_rel));
}

}  // namespace
}  // namespace vamp
