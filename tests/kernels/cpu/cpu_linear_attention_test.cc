// The CPU kernels of Qwen3-Next's Gated DeltaNet layers: the causal conv1d with carried state,
// the gated delta rule in its two forms, its gates, the gated RMSNorm, the sigmoid gates and the
// partial rotary embedding. Hand-computed cases pin the arithmetic; the rest pins the properties
// the model relies on (chunked == recurrent to a stated tolerance, splitting a sequence across
// calls changes nothing, sequences never see each other).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/gating.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace vamp::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---- Gated delta rule ----

// One head, k_dim 2, v_dim 2, two tokens, worked by hand (state S is [k_dim, v_dim]):
//   t = 0: k = (1, 0), v = (2, 4), q = (0.6, 0.8), decay 1, beta 0.5. S = 0, so
//          u = 0.5 * v = (1, 2), S = k u^T = [[1, 2], [0, 0]], out = S^T q = (0.6, 1.2).
//   t = 1: k = (0.6, 0.8), v = (1, 0), q = (0, 1), decay 0.5, beta 1. S = [[0.5, 1], [0, 0]];
//          S^T k = (0.3, 0.6), u = (0.7, -0.6), S += k u^T = [[0.92, 0.64], [0.56, -0.48]],
//          out = S^T q = (0.56, -0.48).
struct HandCase {
  std::vector<float> q = {0.6f, 0.8f, 0.0f, 1.0f};
  std::vector<float> k = {1.0f, 0.0f, 0.6f, 0.8f};
  std::vector<float> v = {2.0f, 4.0f, 1.0f, 0.0f};
  std::vector<float> g = {0.0f, std::log(0.5f)};
  std::vector<float> beta = {0.5f, 1.0f};
  std::vector<int32_t> qsl = {0, 2};
  std::vector<int32_t> slots = {0};
  std::vector<float> state = std::vector<float>(4, 0.0f);
  std::vector<float> out = std::vector<float>(4, -99.0f);
  std::vector<float> ws = std::vector<float>(GatedDeltaRuleWorkspaceFloats(64, 2, 2));

  GatedDeltaRuleArgs Args(bool l2norm) {
    return {.q = q.data(),
            .q_stride = 2,
            .k = k.data(),
            .k_stride = 2,
            .v = v.data(),
            .v_stride = 2,
            .g = g.data(),
            .g_stride = 1,
            .beta = beta.data(),
            .beta_stride = 1,
            .num_k_heads = 1,
            .num_v_heads = 1,
            .k_dim = 2,
            .v_dim = 2,
            .l2norm_qk = l2norm,
            .scale = 1.0f,
            .query_start_loc = qsl.data(),
            .num_seqs = 1,
            .state_slots = slots.data(),
            .states = state.data(),
            .state_slot_stride = 4,
            .out = out.data(),
            .out_stride = 2,
            .workspace = ws.data(),
            .workspace_floats = static_cast<int64_t>(ws.size())};
  }
};

void ExpectHandResult(const HandCase& c, float tol) {
  const float want_out[] = {0.6f, 1.2f, 0.56f, -0.48f};
  // The state is stored transposed: row j is column j of S.
  const float want_state[] = {0.92f, 0.56f, 0.64f, -0.48f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(c.out[i], want_out[i], tol) << "out " << i;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(c.state[i], want_state[i], tol) << "state " << i;
}

TEST(GatedDeltaRuleTest, HandComputedTwoStepsBothForms) {
  // Exact inputs: float32 rounding of these small sums is ~1e-7.
  {
    HandCase c;
    ASSERT_TRUE(GatedDeltaRuleRecurrent(c.Args(false)).ok());
    ExpectHandResult(c, 1e-6f);
  }
  for (int64_t chunk : {1, 2, 64}) {
    HandCase c;
    ASSERT_TRUE(GatedDeltaRuleChunked(c.Args(false), chunk).ok());
    ExpectHandResult(c, 1e-6f);
  }
  // The same case with unnormalised q and k and l2norm on: |x| = sqrt(sum x^2 + 1e-6) changes
  // these unit vectors by under 1e-6 relative.
  for (int form = 0; form < 2; ++form) {
    HandCase c;
    c.q = {3.0f, 4.0f, 0.0f, 7.0f};
    c.k = {2.0f, 0.0f, 3.0f, 4.0f};
    ASSERT_TRUE((form == 0 ? GatedDeltaRuleRecurrent(c.Args(true))
                           : GatedDeltaRuleChunked(c.Args(true), 64))
                    .ok());
    ExpectHandResult(c, 2e-6f);
  }
}

// A random batch of sequences for the delta rule: 2 key heads, 4 value heads (groups of 2),
// k_dim 16, v_dim 8, gates in Qwen3-Next's range.
struct DeltaBatch {
  int64_t nk = 2, nv = 4, dk = 16, dv = 8;
  std::vector<int32_t> lens;
  std::vector<int32_t> qsl, slots;
  std::vector<uint8_t> has_initial;
  std::vector<float> q, k, v, g, beta, states, out;
  std::vector<float> ws;

  DeltaBatch(std::vector<int32_t> lengths, uint32_t seed) : lens(std::move(lengths)) {
    std::mt19937 rng(seed);
    qsl = {0};
    for (int32_t l : lens) qsl.push_back(qsl.back() + l);
    const int64_t n = qsl.back();
    q = Random(n * nk * dk, rng);
    k = Random(n * nk * dk, rng);
    v = Random(n * nv * dv, rng);
    // g = -exp(A_log) * softplus(.) with A_log ~ log U(0, 16) spans [-few, 0): here [-2, 0).
    g = Random(n * nv, rng, -2.0f, 0.0f);
    beta = Random(n * nv, rng, 0.0f, 1.0f);
    slots.resize(lens.size());
    // Slots in reverse order, so that slot != sequence index.
    for (size_t i = 0; i < lens.size(); ++i) slots[i] = static_cast<int32_t>(lens.size() - 1 - i);
    has_initial.assign(lens.size(), 1);
    states = Random(lens.size() * nv * dv * dk, rng, -0.5f, 0.5f);
    out.assign(n * nv * dv, 0.0f);
    ws.resize(GatedDeltaRuleWorkspaceFloats(64, dk, dv));
  }

  GatedDeltaRuleArgs Args() {
    return {.q = q.data(),
            .q_stride = nk * dk,
            .k = k.data(),
            .k_stride = nk * dk,
            .v = v.data(),
            .v_stride = nv * dv,
            .g = g.data(),
            .g_stride = nv,
            .beta = beta.data(),
            .beta_stride = nv,
            .num_k_heads = nk,
            .num_v_heads = nv,
            .k_dim = dk,
            .v_dim = dv,
            .l2norm_qk = true,
            .scale = 1.0f / std::sqrt(static_cast<float>(dk)),
            .query_start_loc = qsl.data(),
            .num_seqs = static_cast<int64_t>(lens.size()),
            .state_slots = slots.data(),
            .has_initial_state = has_initial.data(),
            .states = states.data(),
            .state_slot_stride = nv * dv * dk,
            .out = out.data(),
            .out_stride = nv * dv,
            .workspace = ws.data(),
            .workspace_floats = static_cast<int64_t>(ws.size())};
  }
};

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

TEST(GatedDeltaRuleTest, ChunkedEqualsRecurrentToFloat32Rounding) {
  // Lengths around the chunk size, one sequence starting from a zero state.
  const std::vector<int32_t> lens = {1, 5, 63, 64, 65, 200};
  DeltaBatch recurrent(lens, 7);
  recurrent.has_initial[2] = 0;
  ASSERT_TRUE(GatedDeltaRuleRecurrent(recurrent.Args()).ok());
  for (int64_t chunk : {1, 7, 64}) {
    DeltaBatch chunked(lens, 7);
    chunked.has_initial[2] = 0;
    ASSERT_TRUE(GatedDeltaRuleChunked(chunked.Args(), chunk).ok());
    // Outputs and states are O(1); the forms round differently in float32 (different sums of
    // the same terms). Measured: at most 7.5e-8; the bound 2e-6 leaves room for other inputs and
    // stays far below any real error (a wrong gate or a transposed state moves them by O(0.1)).
    std::printf("chunk %ld: max |chunked - recurrent| outputs %.3g, states %.3g\n",
                static_cast<long>(chunk), MaxAbsDiff(chunked.out, recurrent.out),
                MaxAbsDiff(chunked.states, recurrent.states));
    EXPECT_LT(MaxAbsDiff(chunked.out, recurrent.out), 2e-6) << "chunk " << chunk;
    EXPECT_LT(MaxAbsDiff(chunked.states, recurrent.states), 2e-6) << "chunk " << chunk;
    EXPECT_GT(MaxAbsDiff(chunked.out, DeltaBatch(lens, 7).out), 0.1) << "outputs were written";
  }
}

// Runs sequence 0 of `b` through `form` in two calls split at token `split` (state carried).
template <typename Form>
std::vector<float> RunSplit(DeltaBatch& b, int32_t split, Form form) {
  const int32_t len = b.lens[0];
  std::vector<int32_t> first = {0, split}, second = {split, len};
  GatedDeltaRuleArgs a = b.Args();
  a.num_seqs = 1;
  a.query_start_loc = first.data();
  EXPECT_TRUE(form(a).ok());
  a.query_start_loc = second.data();
  a.has_initial_state = nullptr;  // the second call continues
  EXPECT_TRUE(form(a).ok());
  return b.out;
}

TEST(GatedDeltaRuleTest, SplittingASequenceAcrossCalls) {
  const std::vector<int32_t> lens = {150};
  auto chunked = [](const GatedDeltaRuleArgs& a) { return GatedDeltaRuleChunked(a, 64); };
  auto recurrent = [](const GatedDeltaRuleArgs& a) { return GatedDeltaRuleRecurrent(a); };
  DeltaBatch whole_chunked(lens, 3), whole_recurrent(lens, 3);
  ASSERT_TRUE(chunked(whole_chunked.Args()).ok());
  ASSERT_TRUE(recurrent(whole_recurrent.Args()).ok());
  // The recurrent form is token-sequential: any split gives the same bits.
  for (int32_t split : {1, 37, 64, 149}) {
    DeltaBatch b(lens, 3);
    EXPECT_EQ(RunSplit(b, split, recurrent), whole_recurrent.out) << split;
    EXPECT_EQ(b.states, whole_recurrent.states) << split;
  }
  // The chunked form: a split at a multiple of the chunk size keeps every chunk, so the same
  // bits; elsewhere the chunks differ, so float32 rounding (the tolerance above).
  {
    DeltaBatch b(lens, 3);
    EXPECT_EQ(RunSplit(b, 128, chunked), whole_chunked.out);
    EXPECT_EQ(b.states, whole_chunked.states);
  }
  for (int32_t split : {1, 37, 100}) {
    DeltaBatch b(lens, 3);
    EXPECT_LT(MaxAbsDiff(RunSplit(b, split, chunked), whole_chunked.out), 2e-6) << split;
  }
}

TEST(GatedDeltaRuleTest, SequencesOfABatchAreIndependent) {
  const std::vector<int32_t> lens = {3, 70, 1};
  for (int form = 0; form < 2; ++form) {
    DeltaBatch batch(lens, 11);
    auto run = [&](const GatedDeltaRuleArgs& a) {
      return form == 0 ? GatedDeltaRuleRecurrent(a) : GatedDeltaRuleChunked(a, 64);
    };
    ASSERT_TRUE(run(batch.Args()).ok());
    for (size_t i = 0; i < lens.size(); ++i) {
      DeltaBatch alone(lens, 11);
      GatedDeltaRuleArgs a = alone.Args();
      a.num_seqs = 1;
      a.query_start_loc = alone.qsl.data() + i;
      a.state_slots = alone.slots.data() + i;
      a.has_initial_state = alone.has_initial.data() + i;
      ASSERT_TRUE(run(a).ok());
      const int64_t row = alone.nv * alone.dv;
      for (int64_t t = alone.qsl[i]; t < alone.qsl[i + 1]; ++t) {
        ASSERT_EQ(0, std::memcmp(alone.out.data() + t * row, batch.out.data() + t * row,
                                 row * sizeof(float)))
            << "form " << form << " sequence " << i << " token " << t;
      }
    }
    EXPECT_EQ(batch.states, [&] {
      DeltaBatch each(lens, 11);
      for (size_t i = 0; i < lens.size(); ++i) {
        GatedDeltaRuleArgs a = each.Args();
        a.num_seqs = 1;
        a.query_start_loc = each.qsl.data() + i;
        a.state_slots = each.slots.data() + i;
        EXPECT_TRUE(run(a).ok());
      }
      return each.states;
    }());
  }
}

TEST(GatedDeltaRuleTest, AZeroInitialStateIgnoresTheSlotsContents) {
  DeltaBatch garbage({20}, 5), zeros({20}, 5);
  garbage.has_initial[0] = 0;
  std::fill(zeros.states.begin(), zeros.states.end(), 0.0f);
  for (int form = 0; form < 2; ++form) {
    DeltaBatch a = garbage, b = zeros;
    ASSERT_TRUE(
        (form ? GatedDeltaRuleChunked(a.Args(), 64) : GatedDeltaRuleRecurrent(a.Args())).ok());
    ASSERT_TRUE(
        (form ? GatedDeltaRuleChunked(b.Args(), 64) : GatedDeltaRuleRecurrent(b.Args())).ok());
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.states, b.states);
  }
}

TEST(GatedDeltaRuleTest, BadArgumentsAreRejectedBeforeAnythingIsWritten) {
  struct Case {
    const char* what;
    std::function<void(GatedDeltaRuleArgs&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"heads", [](auto& a) { a.num_v_heads = 3; }, "not a multiple of num_k_heads"},
      {"dims", [](auto& a) { a.k_dim = 0; }, "must be positive"},
      {"stride", [](auto& a) { a.state_slot_stride = 10; }, "state_slot_stride"},
      {"workspace", [](auto& a) { a.workspace_floats = 3; }, "workspace"},
  };
  for (const Case& c : cases) {
    DeltaBatch b({4}, 1);
    const std::vector<float> before = b.states;
    GatedDeltaRuleArgs a = b.Args();
    c.edit(a);
    for (const absl::Status& s : {GatedDeltaRuleRecurrent(a), GatedDeltaRuleChunked(a, 64)}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
      EXPECT_NE(std::string(s.message()).find(c.expect), std::string::npos) << s;
    }
    EXPECT_EQ(b.states, before) << c.what;
  }
  DeltaBatch b({4}, 1);
  EXPECT_FALSE(GatedDeltaRuleChunked(b.Args(), 0).ok());
}

TEST(GatedDeltaGatesTest, MatchTheFormula) {
  // g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); softplus is linear past 20.
  const float a[] = {0.3f, 25.0f}, b[] = {0.7f, -3.0f};
  const float a_log[] = {0.5f, -1.0f}, dt_bias[] = {0.2f, 0.0f};
  float g[2], beta[2];
  // Two heads of one token.
  GatedDeltaGates(a, 2, b, 2, a_log, dt_bias, 1, 2, g, 2, beta, 2);
  EXPECT_NEAR(g[0], -1.6059814f, 1e-6);  // -e^0.5 * log1p(e^0.5)
  EXPECT_NEAR(beta[0], 0.66818777f, 1e-6);
  EXPECT_NEAR(g[1], -9.1969860f, 1e-5);  // -e^-1 * 25
  EXPECT_NEAR(beta[1], 1.0 / (1.0 + std::exp(3.0)), 1e-7);
}

// ---- Causal conv1d ----

struct ConvBatch {
  int64_t C = 6, K = 4;
  std::vector<float> x, weight, bias, out, states;
  std::vector<int32_t> qsl, slots;
  std::vector<uint8_t> has_initial;

  ConvBatch(std::vector<int32_t> lens, uint32_t seed) {
    std::mt19937 rng(seed);
    qsl = {0};
    for (int32_t l : lens) qsl.push_back(qsl.back() + l);
    x = Random(qsl.back() * C, rng);
    weight = Random(C * K, rng);
    states = Random(lens.size() * (K - 1) * C, rng);
    out.assign(qsl.back() * C, 0.0f);
    slots.resize(lens.size());
    std::iota(slots.begin(), slots.end(), 0);
    has_initial.assign(lens.size(), 0);
  }
  CausalConv1dArgs Args() {
    return {.x = x.data(),
            .x_stride = C,
            .weight = weight.data(),
            .bias = bias.empty() ? nullptr : bias.data(),
            .channels = C,
            .kernel_size = K,
            .query_start_loc = qsl.data(),
            .num_seqs = static_cast<int64_t>(slots.size()),
            .max_num_tokens = qsl.back(),
            .state_slots = slots.data(),
            .has_initial_state = has_initial.data(),
            .conv_states = states.data(),
            .state_slot_stride = (K - 1) * C,
            .silu = true,
            .out = out.data(),
            .out_stride = C};
  }
};

TEST(CausalConv1dTest, MatchesADoubleReferenceAndKeepsTheLastInputs) {
  ConvBatch b({9}, 2);
  const std::vector<float> x = b.x;
  ASSERT_TRUE(CausalConv1d(b.Args()).ok());
  for (int64_t t = 0; t < 9; ++t) {
    for (int64_t c = 0; c < b.C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < b.K; ++j) {
        const int64_t src = t - (b.K - 1) + j;
        if (src >= 0) acc += double(b.weight[c * b.K + j]) * x[src * b.C + c];
      }
      const double want = acc / (1.0 + std::exp(-acc));
      EXPECT_NEAR(b.out[t * b.C + c], want, 1e-6) << t << " " << c;
    }
  }
  // The state: the last K - 1 = 3 inputs, oldest first.
  for (int64_t row = 0; row < 3; ++row) {
    for (int64_t c = 0; c < b.C; ++c) {
      EXPECT_EQ(b.states[row * b.C + c], x[(6 + row) * b.C + c]);
    }
  }
}

TEST(CausalConv1dTest, PrefillThenStepsEqualsTheWholeSequence) {
  // A 12-token sequence whole, and as chunks of 2 (shorter than K - 1: the state mixes old and
  // new inputs), 5 and then single-token decode steps; with and without a bias.
  for (bool with_bias : {false, true}) {
    ConvBatch whole({12}, 4);
    if (with_bias) whole.bias = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f, -0.5f};
    ASSERT_TRUE(CausalConv1d(whole.Args()).ok());
    ConvBatch parts({12}, 4);
    parts.bias = whole.bias;
    const std::vector<int32_t> bounds = {0, 2, 7, 8, 9, 10, 11, 12};
    for (size_t p = 0; p + 1 < bounds.size(); ++p) {
      std::vector<int32_t> qsl = {bounds[p], bounds[p + 1]};
      CausalConv1dArgs a = parts.Args();
      a.query_start_loc = qsl.data();
      if (p > 0) a.has_initial_state = nullptr;
      ASSERT_TRUE(CausalConv1d(a).ok());
    }
    EXPECT_EQ(parts.out, whole.out) << "bias " << with_bias;
    EXPECT_EQ(parts.states, whole.states) << "bias " << with_bias;
  }
}

TEST(CausalConv1dTest, SequencesUseOnlyTheirOwnSlots) {
  // Three sequences (one continuing from its state) in one call == each in its own call.
  ConvBatch batch({5, 1, 3}, 8);
  batch.slots = {2, 0, 1};
  batch.has_initial = {0, 1, 1};
  ConvBatch each = batch;
  ASSERT_TRUE(CausalConv1d(batch.Args()).ok());
  for (int i = 0; i < 3; ++i) {
    CausalConv1dArgs a = each.Args();
    a.num_seqs = 1;
    a.query_start_loc = each.qsl.data() + i;
    a.state_slots = each.slots.data() + i;
    a.has_initial_state = each.has_initial.data() + i;
    ASSERT_TRUE(CausalConv1d(a).ok());
  }
  EXPECT_EQ(batch.out, each.out);
  EXPECT_EQ(batch.states, each.states);
  ConvBatch bad({2}, 1);
  CausalConv1dArgs a = bad.Args();
  a.state_slot_stride = 2;
  EXPECT_EQ(CausalConv1d(a).code(), absl::StatusCode::kInvalidArgument);
  // More rows than the host bound the CUDA twin sizes its grid by: refused, nothing written.
  a = bad.Args();
  a.max_num_tokens = 1;
  const std::vector<float> before = bad.out;
  const absl::Status s = CausalConv1d(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("max_num_tokens"), std::string::npos) << s;
  EXPECT_EQ(bad.out, before);
}

// ---- Gated RMSNorm, sigmoid gates, partial rotary ----

TEST(RmsNormGatedTest, HandComputed) {
  // x = (3, 4): mean square 12.5; weight (1, 2); z = (2, -1):
  //   out = w * x / sqrt(12.5 + 1e-6) * z / (1 + exp(-z)) = (1.4947621, -0.6085449).
  const float x[] = {3.0f, 4.0f}, z[] = {2.0f, -1.0f}, w[] = {1.0f, 2.0f};
  float out[2];
  RmsNormGated(x, 2, z, 2, w, 1e-6f, 1, 1, 2, out, 2);
  EXPECT_NEAR(out[0], 1.4947621f, 1e-6);
  EXPECT_NEAR(out[1], -0.6085449f, 1e-6);
  // In place, and the norm part equals RmsNorm exactly (z huge: silu(z) == z).
  float y[] = {3.0f, 4.0f};
  const float big[] = {1e4f, 1e4f};
  float plain[2];
  RmsNorm(y, 2, w, 1e-6f, 1, 2, plain, 2);
  RmsNormGated(y, 2, big, 2, w, 1e-6f, 1, 1, 2, y, 2);
  EXPECT_EQ(y[0], plain[0] * 1e4f);
  EXPECT_EQ(y[1], plain[1] * 1e4f);
}

TEST(RmsNormGatedTest, GroupsAreNormalisedSeparately) {
  // One row of two groups of 2, weight (1, 2) for both. Group 0 as above; group 1: x = (6, 8)
  // (mean square 50), z = (0, 1): out = (0, 2 * 8 / sqrt(50 + 1e-6) * 1 / (1 + exp(-1))) =
  // (0, 1.6541967). Normalising the row of 4 as one group would give (0.9453706, -0.3848776, 0,
  // 2.0924117) instead.
  const float x[] = {3.0f, 4.0f, 6.0f, 8.0f}, z[] = {2.0f, -1.0f, 0.0f, 1.0f};
  const float w[] = {1.0f, 2.0f};
  float out[4];
  RmsNormGated(x, 4, z, 4, w, 1e-6f, 1, 2, 2, out, 4);
  EXPECT_NEAR(out[0], 1.4947621f, 1e-6);
  EXPECT_NEAR(out[1], -0.6085449f, 1e-6);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_NEAR(out[3], 1.6541967f, 1e-6);
}

TEST(RmsNormGatedTest, GroupedEqualsOneCallPerGroup) {
  // Qwen3-Next's layout (32 value heads of 128 per token) and an odd one, with padded strides; x
  // and z are views into one projection-like buffer. Every group must equal the single-group call
  // bit for bit, padding must stay untouched, and in place must give the same result.
  std::mt19937 rng(41);
  struct Shape {
    int64_t rows, groups, dim;
  };
  for (const auto& [rows, groups, dim] : std::vector<Shape>{{5, 32, 128}, {3, 3, 7}, {1, 1, 5}}) {
    const int64_t width = groups * dim;
    const int64_t x_stride = width + 3, z_stride = width + 5, out_stride = width + 1;
    const std::vector<float> x = Random(rows * x_stride, rng, -3.0f, 3.0f);
    const std::vector<float> z = Random(rows * z_stride, rng, -6.0f, 6.0f);
    const std::vector<float> w = Random(dim, rng, 0.5f, 1.5f);
    std::vector<float> got(rows * out_stride, -7.0f), want = got;
    RmsNormGated(x.data(), x_stride, z.data(), z_stride, w.data(), 1e-6f, rows, groups, dim,
                 got.data(), out_stride);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        RmsNormGated(x.data() + i * x_stride + g * dim, dim, z.data() + i * z_stride + g * dim, dim,
                     w.data(), 1e-6f, 1, 1, dim, want.data() + i * out_stride + g * dim, dim);
      }
    }
    EXPECT_EQ(got, want) << rows << " x " << groups << " x " << dim;
    std::vector<float> in_place = x;
    RmsNormGated(in_place.data(), x_stride, z.data(), z_stride, w.data(), 1e-6f, rows, groups, dim,
                 in_place.data(), x_stride);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < x_stride; ++j) {
        const float expected = j < width ? want[i * out_stride + j] : x[i * x_stride + j];
        ASSERT_EQ(in_place[i * x_stride + j], expected) << "in place, row " << i << " col " << j;
      }
    }
  }
}

TEST(SigmoidGateTest, ElementwiseAndPerRow) {
  float x[] = {2.0f, -4.0f, 1.0f, 1.0f};
  const float gate[] = {0.0f, 100.0f, -100.0f, std::log(3.0f)};
  SigmoidGate(x, 2, gate, 2, 2, 2);
  EXPECT_FLOAT_EQ(x[0], 1.0f);   // sigmoid(0) = 1/2
  EXPECT_FLOAT_EQ(x[1], -4.0f);  // sigmoid(100) = 1
  EXPECT_NEAR(x[2], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(x[3], 0.75f);  // sigmoid(ln 3) = 3/4
  float out[] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float y[] = {10.0f, 20.0f, 30.0f, 40.0f};
  const float row_gate[] = {0.0f, 7.0f, -std::log(3.0f), 7.0f};  // stride 2: rows use 0, -ln 3
  AddSigmoidScaled(out, 2, y, 2, row_gate, 2, 2, 2);
  EXPECT_FLOAT_EQ(out[0], 6.0f);
  EXPECT_FLOAT_EQ(out[1], 12.0f);
  EXPECT_FLOAT_EQ(out[2], 10.5f);  // 3 + 30 / 4
  EXPECT_FLOAT_EQ(out[3], 14.0f);
}

TEST(PartialRopeTest, RotatesOnlyTheLeadingDimensions) {
  std::mt19937 rng(9);
  const int64_t head_dim = 16, rotary = 4, positions_max = 32;
  std::vector<float> cache_full(positions_max * head_dim), cache_partial(positions_max * rotary);
  BuildRopeCache(10000.0f, head_dim, positions_max, cache_full.data());
  BuildRopeCache(10000.0f, rotary, positions_max, cache_partial.data());
  const std::vector<float> q0 = Random(3 * 2 * head_dim, rng), k0 = Random(3 * head_dim, rng);
  const std::vector<float> norm = Random(head_dim, rng, 0.5f, 1.5f);
  const int64_t pos[] = {0, 5, 31};
  // rotary_dim == head_dim: exactly QkNormRope.
  {
    std::vector<float> q1 = q0, k1 = k0, q2 = q0, k2 = k0;
    QkNormRope(q1.data(), 2 * head_dim, k1.data(), head_dim, 3, 2, 1, head_dim, norm.data(),
               norm.data(), 1e-6f, pos, cache_full.data(), positions_max);
    QkNormPartialRope(q2.data(), 2 * head_dim, k2.data(), head_dim, 3, 2, 1, head_dim, head_dim,
                      norm.data(), norm.data(), 1e-6f, pos, cache_full.data(), positions_max);
    EXPECT_EQ(q1, q2);
    EXPECT_EQ(k1, k2);
  }
  // Without norms: the first 4 elements rotate as a 4-wide head would, the other 12 are kept.
  std::vector<float> q = q0, k = k0;
  QkNormPartialRope(q.data(), 2 * head_dim, k.data(), head_dim, 3, 2, 1, head_dim, rotary, nullptr,
                    nullptr, 1e-6f, pos, cache_partial.data(), positions_max);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      const float* got = q.data() + (t * 2 + h) * head_dim;
      const float* src = q0.data() + (t * 2 + h) * head_dim;
      std::vector<float> small(src, src + rotary), unused(rotary);
      QkNormRope(small.data(), rotary, unused.data(), rotary, 1, 1, 0, rotary, nullptr, nullptr,
                 1e-6f, pos + t, cache_partial.data(), positions_max);
      for (int64_t d = 0; d < rotary; ++d) EXPECT_EQ(got[d], small[d]);
      for (int64_t d = rotary; d < head_dim; ++d) EXPECT_EQ(got[d], src[d]);
    }
  }
  EXPECT_EQ(k[0], k0[0]) << "position 0 does not rotate";
  EXPECT_NE(k[head_dim], k0[head_dim]) << "position 5 does";
}

}  // namespace
}  // namespace vamp::kernels::cpu
