// CUDA causal conv1d, gated delta rule (recurrent and chunked) and gates against their CPU twins
// (kernels/cpu/causal_conv1d.h, kernels/cpu/gated_delta_rule.h) on random batches: sequences of
// 1, 2, 3, 17 and 70 tokens and an empty one (and, for the delta rule, a 333-token prompt alone
// and among 48 one-token sequences), some starting from a zero state and some continuing
// from a random one, in distinct non-contiguous state slots of a pool whose other slots must stay
// untouched, with padded row strides whose padding must keep its sentinel.
//
// Tolerances (compared as |gpu - cpu| <= tol * max(1, |cpu|), i.e. absolute on these unit-scale
// values); "measured" is the largest error over these cases on an H200:
//   - conv1d: without SiLU the CUDA twin repeats the CPU's roundings (bias, then each product
//     rounded and added in order, no FMA): exact (measured 0). With SiLU, CUDA's expf is within
//     2 ulp of the CPU's: 1e-6 (measured 2.0e-7). States are copies of inputs: exact.
//   - delta rule: both sides are float32 with the same formulas, and the chunked kernel sums over
//     the tokens of a chunk in the CPU's order; they differ in the grouping of the k_dim sums
//     (warp reductions in the recurrent kernel, float4 steps in the chunked one) and by nvcc's
//     FMAs. The CPU tests bound the gap between the recurrent and chunked forms (different
//     formulas, a larger difference) by 2e-6; 1e-5 leaves a further 5x (measured below 5e-7 on
//     outputs and states in every case, 333-token prompts included; each case records its
//     largest error as the property "max_error ..." in --gtest_output=xml), while an indexing,
//     decay or chunking error is O(0.1) or more.
//   - gates: expf / log1pf within 2 ulp each: 2e-6 (measured 2.7e-7).
// Without a CUDA device every kernel case skips (cuda_test_util.h); the argument checks run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gated_delta_rule.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kConvSiluTol = 1e-6;
constexpr double kDeltaTol = 1e-5;
constexpr double kGatesTol = 2e-6;
constexpr float kSentinel = -12345.0f;  // fills padding that no kernel may touch

std::vector<float> Uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Sequence lengths of a batch (an empty one included), and which continue from their state.
const std::vector<int32_t> kLens = {1, 3, 17, 0, 70, 2};
const std::vector<uint8_t> kHasInitial = {1, 0, 1, 1, 0, 1};

// query_start_loc of `lens`.
std::vector<int32_t> StartLocs(const std::vector<int32_t>& lens) {
  std::vector<int32_t> qsl = {0};
  for (int32_t l : lens) qsl.push_back(qsl.back() + l);
  return qsl;
}

// Distinct, non-contiguous slots in reverse order (slot != sequence index) in a pool of
// 2 * num_seqs + 1 slots.
std::vector<int32_t> SpreadSlots(size_t num_seqs) {
  std::vector<int32_t> slots(num_seqs);
  for (size_t i = 0; i < num_seqs; ++i) slots[i] = static_cast<int32_t>(2 * (num_seqs - i) - 1);
  return slots;
}

std::string ShapeName(int64_t a, int64_t b, int64_t c, int64_t d) {
  return std::to_string(a) + "/" + std::to_string(b) + " heads, dims " + std::to_string(c) + "/" +
         std::to_string(d);
}

// ---- Gated delta rule ----

struct DeltaShape {
  int64_t nk, nv, dk, dv;
};
// Qwen3-Next-like (groups of 2 value heads, 128/128), a small odd shape, and the largest dims
// with a k_dim that leaves part of each lane's last register unused.
const std::vector<DeltaShape> kDeltaShapes = {{2, 4, 128, 128}, {1, 3, 32, 48}, {1, 2, 200, 256}};

// Where a batch's arrays live (host or device).
struct DeltaPointers {
  const float *q, *k, *v, *g, *beta;
  const int32_t *qsl, *slots;
  const uint8_t* has_initial;
  float *states, *out, *workspace;
  int64_t workspace_floats;
};

// A random batch of one call: q, k, v unit normal (q and k share rows of stride qk_stride, as
// the conv output), gates in Qwen3-Next's range (g in [-2, 0), beta in [0, 1)), states in
// [-0.5, 0.5) in every slot of the pool.
struct DeltaBatch {
  DeltaShape s;
  int64_t tokens, num_seqs;
  int64_t qk_stride, v_stride, gb_stride, out_stride, slot_stride;
  std::vector<int32_t> qsl, slots;
  std::vector<uint8_t> has_initial;
  std::vector<float> q, k, v, g, beta, states, out;

  DeltaBatch(const DeltaShape& shape, const std::vector<int32_t>& lens,
             std::vector<uint8_t> initial, uint32_t seed)
      : s(shape),
        qsl(StartLocs(lens)),
        slots(SpreadSlots(lens.size())),
        has_initial(std::move(initial)) {
    std::mt19937 rng(seed);
    tokens = qsl.back();
    num_seqs = static_cast<int64_t>(lens.size());
    qk_stride = 2 * s.nk * s.dk + 3;
    v_stride = s.nv * s.dv + 1;
    gb_stride = s.nv + 2;
    out_stride = s.nv * s.dv + 5;
    slot_stride = s.nv * s.dv * s.dk + 7;
    std::vector<float> qk = RandomFloats(tokens * qk_stride, seed + 1);
    q.assign(qk.begin(), qk.end());  // q at column 0 of each row
    k.assign(qk.begin(), qk.end());  // k at column nk * dk (see Pointers)
    v = RandomFloats(tokens * v_stride, seed + 2);
    g = Uniform(tokens * gb_stride, rng, -2.0f, 0.0f);
    beta = Uniform(tokens * gb_stride, rng, 0.0f, 1.0f);
    states = Uniform((2 * num_seqs + 1) * slot_stride, rng, -0.5f, 0.5f);
    out.assign(tokens * out_stride, kSentinel);
  }

  cpu::GatedDeltaRuleArgs Args(const DeltaPointers& p) const {
    return {.q = p.q,
            .q_stride = qk_stride,
            .k = p.k + s.nk * s.dk,
            .k_stride = qk_stride,
            .v = p.v,
            .v_stride = v_stride,
            .g = p.g,
            .g_stride = gb_stride,
            .beta = p.beta,
            .beta_stride = gb_stride,
            .num_k_heads = s.nk,
            .num_v_heads = s.nv,
            .k_dim = s.dk,
            .v_dim = s.dv,
            .l2norm_qk = true,
            .scale = 1.0f / std::sqrt(static_cast<float>(s.dk)),
            .query_start_loc = p.qsl,
            .num_seqs = num_seqs,
            .state_slots = p.slots,
            .has_initial_state = p.has_initial,
            .states = p.states,
            .state_slot_stride = slot_stride,
            .out = p.out,
            .out_stride = out_stride,
            .workspace = p.workspace,
            .workspace_floats = p.workspace_floats};
  }
};

class LinearAttentionTest : public CudaTest {
 protected:
  // The CPU twin's arguments, on the batch's own vectors, with a workspace for chunks of `chunk`.
  cpu::GatedDeltaRuleArgs HostArgs(DeltaBatch& b, int64_t chunk) {
    workspace_.assign(cpu::GatedDeltaRuleWorkspaceFloats(chunk, b.s.dk, b.s.dv), 0.0f);
    return b.Args({b.q.data(), b.k.data(), b.v.data(), b.g.data(), b.beta.data(), b.qsl.data(),
                   b.slots.data(), b.has_initial.empty() ? nullptr : b.has_initial.data(),
                   b.states.data(), b.out.data(), workspace_.data(),
                   static_cast<int64_t>(workspace_.size())});
  }

  // Device copies of the batch (states_dev and out_dev keep the updated arrays), and the args on
  // them with no workspace: the CUDA twin takes none.
  cpu::GatedDeltaRuleArgs DeviceArgs(const DeltaBatch& b, float** states_dev, float** out_dev) {
    *states_dev = Upload(b.states);
    *out_dev = Upload(b.out);
    return b.Args({Upload(b.q), Upload(b.k), Upload(b.v), Upload(b.g), Upload(b.beta),
                   Upload(b.qsl), Upload(b.slots),
                   b.has_initial.empty() ? nullptr : Upload(b.has_initial), *states_dev, *out_dev,
                   nullptr, 0});
  }

  std::vector<float> workspace_;
};

using DeltaRuleTest = LinearAttentionTest;

// ExpectClose at kDeltaTol, recording the largest scaled error |gpu - cpu| / max(1, |cpu|) as the
// test property "max_error <what>" (in --gtest_output=xml), which the tolerance comment quotes.
void ExpectDeltaClose(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ExpectClose(got, want, kDeltaTol, what);
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double w = want[i];
    worst = std::max(worst, std::abs(got[i] - w) / std::max(1.0, std::abs(w)));
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", worst);
  ::testing::Test::RecordProperty("max_error " + what, text);
}

TEST_F(DeltaRuleTest, BothFormsMatchTheCpu) {
  for (const DeltaShape& shape : kDeltaShapes) {
    // 0: recurrent; otherwise the chunk size (Qwen3-Next's 64, and 5: many partial chunks).
    for (int64_t form : {0, 64, 5}) {
      DeltaBatch b(shape, kLens, kHasInitial, 31);
      float *d_states, *d_out;
      const cpu::GatedDeltaRuleArgs dev = DeviceArgs(b, &d_states, &d_out);
      const cpu::GatedDeltaRuleArgs host = HostArgs(b, form == 0 ? 1 : form);
      if (form == 0) {
        VAMP_ASSERT_OK(GatedDeltaRuleRecurrent(dev, stream_));
        VAMP_ASSERT_OK(cpu::GatedDeltaRuleRecurrent(host));
      } else {
        VAMP_ASSERT_OK(GatedDeltaRuleChunked(dev, form, stream_));
        VAMP_ASSERT_OK(cpu::GatedDeltaRuleChunked(host, form));
      }
      const std::string what = ShapeName(shape.nk, shape.nv, shape.dk, shape.dv) +
                               (form == 0 ? ", recurrent" : ", chunk " + std::to_string(form));
      ExpectDeltaClose(Download(d_out, b.out.size()), b.out, "out " + what);
      ExpectDeltaClose(Download(d_states, b.states.size()), b.states, "states " + what);
    }
  }
}

// The engine's shapes: a long prompt (several chunks of 64, a partial last one) alone, and in a
// mixed batch with many one-token sequences (and an empty one), through both forms.
TEST_F(DeltaRuleTest, LongAndMixedBatchesMatchTheCpu) {
  std::vector<int32_t> mixed(48, 1);
  mixed.insert(mixed.end(), {333, 0, 70, 2});
  std::vector<uint8_t> mixed_initial(mixed.size(), 1);
  mixed_initial[48] = 0;  // the prompt starts here
  mixed_initial[7] = 0;   // a one-token sequence that starts here
  const std::vector<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> batches = {
      {{333}, {1}}, {{333}, {0}}, {mixed, mixed_initial}};
  for (const DeltaShape& shape : kDeltaShapes) {
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      for (int64_t form : {0, 64}) {  // 0: recurrent; 64: chunks of 64
        DeltaBatch b(shape, batches[bi].first, batches[bi].second, 101 + bi);
        float *d_states, *d_out;
        const cpu::GatedDeltaRuleArgs dev = DeviceArgs(b, &d_states, &d_out);
        const cpu::GatedDeltaRuleArgs host = HostArgs(b, form == 0 ? 1 : form);
        if (form == 0) {
          VAMP_ASSERT_OK(GatedDeltaRuleRecurrent(dev, stream_));
          VAMP_ASSERT_OK(cpu::GatedDeltaRuleRecurrent(host));
        } else {
          VAMP_ASSERT_OK(GatedDeltaRuleChunked(dev, form, stream_));
          VAMP_ASSERT_OK(cpu::GatedDeltaRuleChunked(host, form));
        }
        const std::string what = ShapeName(shape.nk, shape.nv, shape.dk, shape.dv) + ", batch " +
                                 std::to_string(bi) +
                                 (form == 0 ? ", recurrent" : ", chunk " + std::to_string(form));
        ExpectDeltaClose(Download(d_out, b.out.size()), b.out, "out " + what);
        ExpectDeltaClose(Download(d_states, b.states.size()), b.states, "states " + what);
      }
    }
  }
}

// A chunked prefill, then decode steps of one token per sequence with the recurrent form (every
// sequence continuing, has_initial_state null), as the runner does: each step matches the CPU
// path run the same way.
TEST_F(DeltaRuleTest, DecodeStepsAfterAChunkedPrefillMatchTheCpu) {
  for (const DeltaShape& shape : kDeltaShapes) {
    DeltaBatch prefill(shape, {5, 70, 17}, {0, 0, 1}, 41);
    float *d_states, *d_out;
    const cpu::GatedDeltaRuleArgs dev = DeviceArgs(prefill, &d_states, &d_out);
    VAMP_ASSERT_OK(GatedDeltaRuleChunked(dev, 64, stream_));
    VAMP_ASSERT_OK(cpu::GatedDeltaRuleChunked(HostArgs(prefill, 64), 64));
    const std::string what = ShapeName(shape.nk, shape.nv, shape.dk, shape.dv);
    ExpectDeltaClose(Download(d_out, prefill.out.size()), prefill.out, "prefill " + what);
    std::vector<float> states = prefill.states;  // the CPU's pool after the prefill
    for (uint32_t step = 0; step < 4; ++step) {
      DeltaBatch decode(shape, {1, 1, 1}, {}, 50 + step);
      decode.slot_stride = prefill.slot_stride;
      decode.states = states;
      cpu::GatedDeltaRuleArgs step_dev = DeviceArgs(decode, &d_states, &d_out);
      // Continue from the GPU's own pool, not the CPU's copy.
      step_dev.states = dev.states;
      VAMP_ASSERT_OK(GatedDeltaRuleRecurrent(step_dev, stream_));
      VAMP_ASSERT_OK(cpu::GatedDeltaRuleRecurrent(HostArgs(decode, 1)));
      states = decode.states;
      const std::string at = what + ", step " + std::to_string(step);
      ExpectDeltaClose(Download(d_out, decode.out.size()), decode.out, "decode out " + at);
      ExpectDeltaClose(Download(dev.states, states.size()), states, "decode states " + at);
    }
  }
}

TEST(DeltaRuleArgsTest, BadArgumentsAreRejectedBeforeLaunching) {
  struct Case {
    const char* what;
    void (*edit)(cpu::GatedDeltaRuleArgs&, int64_t&);
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"heads", [](auto& a, auto&) { a.num_v_heads = 3; }, "not a multiple of num_k_heads"},
      {"dims", [](auto& a, auto&) { a.k_dim = 0; }, "must be positive"},
      {"k_dim", [](auto& a, auto&) { a.k_dim = 257; }, "is above 256"},
      {"v_dim", [](auto& a, auto&) { a.v_dim = 512; }, "is above 256"},
      {"stride", [](auto& a, auto&) { a.state_slot_stride = 10; }, "state_slot_stride"},
      {"chunk 0", [](auto&, auto& chunk) { chunk = 0; }, "chunk_size 0 must be positive"},
      {"chunk 65", [](auto&, auto& chunk) { chunk = 65; }, "chunk_size 65 is above 64"},
  };
  for (const Case& c : cases) {
    // Host-side checks only: no pointer is dereferenced before they pass.
    cpu::GatedDeltaRuleArgs a{.num_k_heads = 2,
                              .num_v_heads = 4,
                              .k_dim = 128,
                              .v_dim = 128,
                              .num_seqs = 1,
                              .state_slot_stride = 4 * 128 * 128};
    int64_t chunk = 64;
    c.edit(a, chunk);
    const bool chunk_only = chunk != 64;
    std::vector<absl::Status> results = {GatedDeltaRuleChunked(a, chunk, nullptr)};
    if (!chunk_only) results.push_back(GatedDeltaRuleRecurrent(a, nullptr));
    for (const absl::Status& s : results) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
      EXPECT_NE(std::string(s.message()).find(c.expect), std::string::npos) << s;
    }
  }
  // An empty batch launches nothing, so it succeeds even without a device.
  cpu::GatedDeltaRuleArgs empty{.num_k_heads = 1,
                                .num_v_heads = 1,
                                .k_dim = 8,
                                .v_dim = 8,
                                .num_seqs = 0,
                                .state_slot_stride = 64};
  EXPECT_TRUE(GatedDeltaRuleChunked(empty, 64, nullptr).ok());
  EXPECT_TRUE(GatedDeltaRuleRecurrent(empty, nullptr).ok());
}

// ---- Gates ----

using DeltaGatesTest = LinearAttentionTest;

TEST_F(DeltaGatesTest, MatchTheCpu) {
  const int64_t tokens = 37, heads = 32, a_stride = 40, b_stride = 33, g_stride = 35,
                beta_stride = 34;
  std::vector<float> a = RandomFloats(tokens * a_stride, 61, 4.0f);
  const std::vector<float> b = RandomFloats(tokens * b_stride, 62, 4.0f);
  // Both softplus branches: some arguments above 20.
  for (int64_t t = 0; t < tokens; t += 5) a[t * a_stride + t % heads] = 25.0f + t;
  std::mt19937 rng(63);
  const std::vector<float> a_log = Uniform(heads, rng, -1.0f, std::log(16.0f));
  const std::vector<float> dt_bias = RandomFloats(heads, 64);
  std::vector<float> g(tokens * g_stride, kSentinel), beta(tokens * beta_stride, kSentinel);
  float* d_g = Upload(g);
  float* d_beta = Upload(beta);
  VAMP_ASSERT_OK(GatedDeltaGates(Upload(a), a_stride, Upload(b), b_stride, Upload(a_log),
                                 Upload(dt_bias), tokens, heads, d_g, g_stride, d_beta, beta_stride,
                                 stream_));
  cpu::GatedDeltaGates(a.data(), a_stride, b.data(), b_stride, a_log.data(), dt_bias.data(), tokens,
                       heads, g.data(), g_stride, beta.data(), beta_stride);
  ExpectClose(Download(d_g, g.size()), g, kGatesTol, "g");
  ExpectClose(Download(d_beta, beta.size()), beta, kGatesTol, "beta");
}

TEST(DeltaGatesArgsTest, NegativeSizesAreRejected) {
  EXPECT_EQ(GatedDeltaGates(nullptr, 0, nullptr, 0, nullptr, nullptr, -1, 4, nullptr, 0, nullptr, 0,
                            nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(GatedDeltaGates(nullptr, 0, nullptr, 0, nullptr, nullptr, 0, 4, nullptr, 0, nullptr,
                              0, nullptr)
                  .ok());
}

// ---- Causal conv1d ----

// A random conv batch over the shared lengths: x unit normal with a padded row stride, states
// unit normal in every slot of the pool.
struct ConvBatch {
  int64_t C, K, x_stride, out_stride, slot_stride, num_seqs;
  std::vector<int32_t> qsl, slots;
  std::vector<uint8_t> has_initial;
  std::vector<float> x, weight, bias, states, out;

  ConvBatch(int64_t channels, int64_t kernel, bool with_bias, const std::vector<int32_t>& lens,
            std::vector<uint8_t> initial, uint32_t seed)
      : C(channels),
        K(kernel),
        qsl(StartLocs(lens)),
        slots(SpreadSlots(lens.size())),
        has_initial(std::move(initial)) {
    num_seqs = static_cast<int64_t>(lens.size());
    x_stride = C + 3;
    out_stride = C + 5;
    slot_stride = (K - 1) * C + 2;
    x = RandomFloats(qsl.back() * x_stride, seed);
    weight = RandomFloats(C * K, seed + 1, 0.5f);
    if (with_bias) bias = RandomFloats(C, seed + 2);
    states = RandomFloats((2 * num_seqs + 1) * slot_stride, seed + 3);
    out.assign(qsl.back() * out_stride, kSentinel);
  }

  cpu::CausalConv1dArgs Args(const float* xp, const float* w, const float* bp, const int32_t* q,
                             const int32_t* s, const uint8_t* hi, float* st, float* o,
                             bool silu) const {
    return {.x = xp,
            .x_stride = x_stride,
            .weight = w,
            .bias = bias.empty() ? nullptr : bp,
            .channels = C,
            .kernel_size = K,
            .query_start_loc = q,
            .num_seqs = num_seqs,
            .max_num_tokens = qsl.back() + 3,  // a loose bound, as a bucketed step passes
            .state_slots = s,
            .has_initial_state = has_initial.empty() ? nullptr : hi,
            .conv_states = st,
            .state_slot_stride = slot_stride,
            .silu = silu,
            .out = o,
            .out_stride = out_stride};
  }
};

using CausalConv1dTest = LinearAttentionTest;

TEST_F(CausalConv1dTest, MatchesTheCpu) {
  struct Shape {
    int64_t C, K;
  };
  // Qwen3-Next's kernel 4 on a width that is not a multiple of the block; kernels of 2 and 1
  // (one history row, none).
  for (const auto& [C, K] : std::vector<Shape>{{805, 4}, {64, 2}, {37, 1}}) {
    for (bool with_bias : {false, true}) {
      for (bool silu : {false, true}) {
        ConvBatch b(C, K, with_bias, kLens, kHasInitial, 71);
        float* d_states = Upload(b.states);
        float* d_out = Upload(b.out);
        VAMP_ASSERT_OK(CausalConv1d(
            b.Args(Upload(b.x), Upload(b.weight), with_bias ? Upload(b.bias) : nullptr,
                   Upload(b.qsl), Upload(b.slots), Upload(b.has_initial), d_states, d_out, silu),
            stream_));
        VAMP_ASSERT_OK(cpu::CausalConv1d(b.Args(b.x.data(), b.weight.data(), b.bias.data(),
                                                b.qsl.data(), b.slots.data(), b.has_initial.data(),
                                                b.states.data(), b.out.data(), silu)));
        const std::string what = "C " + std::to_string(C) + " K " + std::to_string(K) +
                                 (with_bias ? " bias" : "") + (silu ? " silu" : "");
        ExpectClose(Download(d_out, b.out.size()), b.out, silu ? kConvSiluTol : 0.0, "out " + what);
        ExpectClose(Download(d_states, b.states.size()), b.states, 0.0, "states " + what);
      }
    }
  }
}

// A prefill, then decode steps of one token per sequence (has_initial_state null), on the GPU's
// own pool; each step matches the CPU run the same way.
TEST_F(CausalConv1dTest, DecodeStepsAfterAPrefillMatchTheCpu) {
  const int64_t C = 512, K = 4;
  ConvBatch prefill(C, K, false, {2, 70, 17}, {0, 0, 1}, 81);
  float* d_states = Upload(prefill.states);
  float* d_out = Upload(prefill.out);
  const float* d_weight = Upload(prefill.weight);
  const int32_t* d_slots = Upload(prefill.slots);
  VAMP_ASSERT_OK(
      CausalConv1d(prefill.Args(Upload(prefill.x), d_weight, nullptr, Upload(prefill.qsl), d_slots,
                                Upload(prefill.has_initial), d_states, d_out, true),
                   stream_));
  VAMP_ASSERT_OK(cpu::CausalConv1d(prefill.Args(
      prefill.x.data(), prefill.weight.data(), nullptr, prefill.qsl.data(), prefill.slots.data(),
      prefill.has_initial.data(), prefill.states.data(), prefill.out.data(), true)));
  ExpectClose(Download(d_out, prefill.out.size()), prefill.out, kConvSiluTol, "prefill out");
  std::vector<float> states = prefill.states;
  for (uint32_t step = 0; step < 4; ++step) {
    ConvBatch decode(C, K, false, {1, 1, 1}, {}, 90 + step);
    decode.weight = prefill.weight;
    decode.states = states;
    float* d_step_out = Upload(decode.out);
    VAMP_ASSERT_OK(CausalConv1d(decode.Args(Upload(decode.x), d_weight, nullptr, Upload(decode.qsl),
                                            d_slots, nullptr, d_states, d_step_out, true),
                                stream_));
    VAMP_ASSERT_OK(cpu::CausalConv1d(decode.Args(decode.x.data(), decode.weight.data(), nullptr,
                                                 decode.qsl.data(), decode.slots.data(), nullptr,
                                                 decode.states.data(), decode.out.data(), true)));
    states = decode.states;
    const std::string at = "step " + std::to_string(step);
    ExpectClose(Download(d_step_out, decode.out.size()), decode.out, kConvSiluTol, "out " + at);
    ExpectClose(Download(d_states, states.size()), states, 0.0, "states " + at);
  }
}

// The engine's mixed step: many one-row decodes and a long prefill in one launch (the grid
// covers rows, whichever sequences they belong to), with sequences skipped for a negative slot.
TEST_F(CausalConv1dTest, DecodesMixedWithALongPrefillMatchTheCpu) {
  const int64_t C = 520, K = 4;
  std::vector<int32_t> lens(64, 1);
  lens.push_back(300);
  lens.push_back(0);
  lens.push_back(5);
  std::vector<uint8_t> initial(lens.size(), 1);
  initial[64] = 0;  // the prompt starts here
  ConvBatch b(C, K, false, lens, initial, 95);
  float* d_states = Upload(b.states);
  float* d_out = Upload(b.out);
  VAMP_ASSERT_OK(CausalConv1d(b.Args(Upload(b.x), Upload(b.weight), nullptr, Upload(b.qsl),
                                     Upload(b.slots), Upload(b.has_initial), d_states, d_out, true),
                              stream_));
  VAMP_ASSERT_OK(
      cpu::CausalConv1d(b.Args(b.x.data(), b.weight.data(), nullptr, b.qsl.data(), b.slots.data(),
                               b.has_initial.data(), b.states.data(), b.out.data(), true)));
  ExpectClose(Download(d_out, b.out.size()), b.out, kConvSiluTol, "mixed out");
  ExpectClose(Download(d_states, b.states.size()), b.states, 0.0, "mixed states");
  // A negative slot: the CUDA twin skips the sequence (its rows keep their contents); the others
  // are computed as before.
  std::vector<int32_t> slots = b.slots;
  slots[64] = -1;
  float* d_skip_out = Upload(std::vector<float>(b.out.size(), kSentinel));
  VAMP_ASSERT_OK(
      CausalConv1d(b.Args(Upload(b.x), Upload(b.weight), nullptr, Upload(b.qsl), Upload(slots),
                          Upload(b.has_initial), Upload(b.states), d_skip_out, true),
                   stream_));
  const std::vector<float> skipped = Download(d_skip_out, b.out.size());
  for (int64_t row = b.qsl[64]; row < b.qsl[65]; ++row) {
    EXPECT_EQ(skipped[row * b.out_stride], kSentinel) << "row " << row;
  }
  EXPECT_NE(skipped[b.qsl[66] * b.out_stride], kSentinel);
}

TEST(CausalConv1dArgsTest, BadArgumentsAreRejectedBeforeLaunching) {
  const cpu::CausalConv1dArgs good{
      .channels = 8, .kernel_size = 4, .num_seqs = 1, .state_slot_stride = 24};
  cpu::CausalConv1dArgs a = good;
  a.kernel_size = 0;
  EXPECT_EQ(CausalConv1d(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.channels = 0;
  EXPECT_EQ(CausalConv1d(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.state_slot_stride = 23;
  const absl::Status s = CausalConv1d(a, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("state_slot_stride"), std::string::npos) << s;
  a = good;
  a.max_num_tokens = -1;
  EXPECT_EQ(CausalConv1d(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.num_seqs = 0;  // nothing to launch
  EXPECT_TRUE(CausalConv1d(a, nullptr).ok());
  a = good;
  a.max_num_tokens = 0;  // no rows: nothing to launch
  EXPECT_TRUE(CausalConv1d(a, nullptr).ok());
}

}  // namespace
}  // namespace vamp::kernels::cuda
