// vamp_delta_rule_bench: the gated delta rule (kernels/cuda/gated_delta_rule.h) on Qwen3-Next
// shapes (16 key / 32 value heads, k_dim = v_dim = 128, chunks of 64):
//   prefill  the chunked form on one sequence of {2048, 4096, 8192} tokens from a random state;
//   mixed    the engine's mixed step (engine/runner/cuda/cuda_gated_delta_net.cc): 64 one-token
//            decodes and one 2048-token prompt, as one chunked launch over the whole batch with
//            the decodes' slots -1 and one recurrent launch with the prompt's slot -1;
//   decode   the recurrent form on 64 one-token sequences.
// q, k and v share the rows of one [tokens, 2 * key_dim + value_dim] buffer, as the conv output
// the runner passes; g is in [-2, 0) and beta in [0, 1) (Qwen3-Next's range; the values do not
// change the work). Each case is timed with CUDA events around the launches: --warmup untimed
// runs, then the median of --iters runs.
//
// Throughput: GFLOP/s of the chunked form's useful work, per value head and chunk of L tokens
// (2 flops per multiply-add): the Gram matrices k.k (strictly lower) and q.k (lower), 2 L dk dv
// for the state's read-outs S_0^T k and S_0^T q, L (L - 1) / 2 dv for the substitution,
// L (L + 1) / 2 dv for the in-chunk outputs and L dk dv for the state update; decode as 3 dk dv
// multiply-adds per token and head, and as GB/s of state read and written (the bound there).
// Prints a table, or one JSON object per case with --json (fields: case, kind, tokens, seqs, ms,
// flops, gflops, bytes, gbps); bench/kernels/delta_rule_vs_torch.py runs it next to HF's torch
// fallback.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/bench_device.h"
#include "bench/kernels/bench_flags.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cuda/gated_delta_rule.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;

// The bench's flags, typed (defaults: Qwen3-Next's Gated DeltaNet shapes).
struct Flags {
  std::string cases = "all";  // all | prefill | mixed | decode
  std::vector<int64_t> prefill_lens = {2048, 4096, 8192};
  int64_t mixed_decodes = 64;
  int64_t mixed_prompt = 2048;
  int64_t decode_batch = 64;
  int64_t k_heads = 16;
  int64_t v_heads = 32;
  int64_t k_dim = 128;
  int64_t v_dim = 128;
  int64_t chunk = 64;
  int64_t warmup = 3;
  int64_t iters = 20;
  int64_t seed = 1;
  int64_t cuda_device = 0;
  bool json = false;
};

ConfigSchema Schema() {
  const Flags d;
  ConfigSchema s;
  s.Enum("cases", d.cases, {"all", "prefill", "mixed", "decode"}, "which cases to run");
  s.String("prefill_lens", absl::StrJoin(d.prefill_lens, ","),
           "comma-separated prompt lengths of the one-sequence prefill cases (tokens)");
  s.Int("mixed_decodes", d.mixed_decodes, 0, 4096, "one-token sequences of the mixed case");
  s.Int("mixed_prompt", d.mixed_prompt, 1, 1 << 20, "prompt length of the mixed case (tokens)");
  s.Int("decode_batch", d.decode_batch, 1, 4096, "sequences of the decode case");
  s.Int("k_heads", d.k_heads, 1, 1024, "key heads");
  s.Int("v_heads", d.v_heads, 1, 1024, "value heads (a multiple of k_heads)");
  s.Int("k_dim", d.k_dim, 1, kc::kMaxDeltaRuleHeadDim, "key head dimension");
  s.Int("v_dim", d.v_dim, 1, kc::kMaxDeltaRuleHeadDim, "value head dimension");
  s.Int("chunk", d.chunk, 1, kc::kMaxDeltaRuleChunkSize, "chunk size of the chunked form");
  s.Int("warmup", d.warmup, 0, 1000, "untimed runs before each measurement");
  s.Int("iters", d.iters, 1, 100000, "timed runs per measurement (the median is reported)");
  s.Int("seed", d.seed, 0, 1 << 30, "random seed of the inputs and states");
  s.Int("cuda_device", d.cuda_device, 0, 64, "CUDA device ordinal");
  s.Bool("json", d.json, "one JSON object per case instead of the table");
  return s;
}

// The only reader of the flags by name.
absl::StatusOr<Flags> FlagsFromConfig(const Config& config) {
  Flags f;
  f.cases = config.GetString("cases");
  VAMP_ASSIGN_OR_RETURN(f.prefill_lens, bench::ParseIntList(config, "prefill_lens", 1));
  f.mixed_decodes = config.GetInt("mixed_decodes");
  f.mixed_prompt = config.GetInt("mixed_prompt");
  f.decode_batch = config.GetInt("decode_batch");
  f.k_heads = config.GetInt("k_heads");
  f.v_heads = config.GetInt("v_heads");
  f.k_dim = config.GetInt("k_dim");
  f.v_dim = config.GetInt("v_dim");
  f.chunk = config.GetInt("chunk");
  f.warmup = config.GetInt("warmup");
  f.iters = config.GetInt("iters");
  f.seed = config.GetInt("seed");
  f.cuda_device = config.GetInt("cuda_device");
  f.json = config.GetBool("json");
  if (f.v_heads % f.k_heads != 0) {
    return absl::InvalidArgumentError("k_heads must divide v_heads");
  }
  return f;
}

// One measured case: the sequences' lengths and which launches time them.
struct Case {
  std::string name, kind;  // kind: prefill | mixed | decode
  std::vector<int32_t> lens;
};

struct Result {
  double ms = 0, flops = 0, bytes = 0;
};

class Bench {
 public:
  Bench(const Flags& flags, cudaStream_t stream)
      : f_(flags), stream_(stream), rng_(flags.seed), buffers_(stream) {}

  // Buffers for the largest case, filled with random inputs.
  absl::Status Setup(const std::vector<Case>& cases) {
    int64_t max_tokens = 0, max_seqs = 0;
    for (const Case& c : cases) {
      int64_t tokens = 0;
      for (int32_t l : c.lens) tokens += l;
      max_tokens = std::max(max_tokens, tokens);
      max_seqs = std::max<int64_t>(max_seqs, c.lens.size());
    }
    const int64_t key_dim = f_.k_heads * f_.k_dim, value_dim = f_.v_heads * f_.v_dim;
    row_ = 2 * key_dim + value_dim;
    slot_floats_ = f_.v_heads * f_.v_dim * f_.k_dim;
    VAMP_ASSIGN_OR_RETURN(qkv_, buffers_.Alloc<float>(max_tokens * row_));
    VAMP_RETURN_IF_ERROR(Fill(qkv_, max_tokens * row_, [](std::mt19937& r) {
      return std::normal_distribution<float>(0.0f, 1.0f)(r);
    }));
    VAMP_ASSIGN_OR_RETURN(g_, buffers_.Alloc<float>(max_tokens * f_.v_heads));
    VAMP_RETURN_IF_ERROR(Fill(g_, max_tokens * f_.v_heads, [](std::mt19937& r) {
      return std::uniform_real_distribution<float>(-2.0f, 0.0f)(r);
    }));
    VAMP_ASSIGN_OR_RETURN(beta_, buffers_.Alloc<float>(max_tokens * f_.v_heads));
    VAMP_RETURN_IF_ERROR(Fill(beta_, max_tokens * f_.v_heads, [](std::mt19937& r) {
      return std::uniform_real_distribution<float>(0.0f, 1.0f)(r);
    }));
    VAMP_ASSIGN_OR_RETURN(states_, buffers_.Alloc<float>(max_seqs * slot_floats_));
    VAMP_RETURN_IF_ERROR(Fill(states_, max_seqs * slot_floats_, [](std::mt19937& r) {
      return std::uniform_real_distribution<float>(-0.5f, 0.5f)(r);
    }));
    VAMP_ASSIGN_OR_RETURN(out_, buffers_.Alloc<float>(max_tokens * value_dim));
    VAMP_ASSIGN_OR_RETURN(qsl_, buffers_.Alloc<int32_t>(max_seqs + 1));
    VAMP_ASSIGN_OR_RETURN(chunked_slots_, buffers_.Alloc<int32_t>(max_seqs));
    VAMP_ASSIGN_OR_RETURN(recurrent_slots_, buffers_.Alloc<int32_t>(max_seqs));
    return absl::OkStatus();
  }

  absl::StatusOr<Result> Run(const Case& c) {
    const int64_t num_seqs = static_cast<int64_t>(c.lens.size());
    std::vector<int32_t> qsl = {0}, chunked(num_seqs), recurrent(num_seqs);
    Result r;
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int32_t len = c.lens[i];
      qsl.push_back(qsl.back() + len);
      // As the runner: every sequence in its own slot, each form skipping the other's (-1).
      const bool by_chunks = c.kind == "prefill" || (c.kind == "mixed" && len > 1);
      chunked[i] = by_chunks ? static_cast<int32_t>(i) : -1;
      recurrent[i] = by_chunks ? -1 : static_cast<int32_t>(i);
      const double heads = static_cast<double>(f_.v_heads), dk = f_.k_dim, dv = f_.v_dim;
      if (by_chunks) {
        for (int64_t c0 = 0; c0 < len; c0 += f_.chunk) {
          const double L = static_cast<double>(std::min<int64_t>(f_.chunk, len - c0));
          const double mads = L * (L - 1) / 2 * dk + L * (L + 1) / 2 * dk + 2 * L * dk * dv +
                              L * (L - 1) / 2 * dv + L * (L + 1) / 2 * dv + L * dk * dv;
          r.flops += 2 * heads * mads;
        }
      } else {
        r.flops += 2 * heads * 3 * dk * dv * len;
      }
      r.bytes += 2.0 * 4 * heads * dk * dv;  // the state, read and written
    }
    VAMP_RETURN_IF_ERROR(buffers_.Upload(qsl_, qsl));
    VAMP_RETURN_IF_ERROR(buffers_.Upload(chunked_slots_, chunked));
    VAMP_RETURN_IF_ERROR(buffers_.Upload(recurrent_slots_, recurrent));
    const int64_t key_dim = f_.k_heads * f_.k_dim;
    const kernels::cpu::GatedDeltaRuleArgs base{
        .q = qkv_,
        .q_stride = row_,
        .k = qkv_ + key_dim,
        .k_stride = row_,
        .v = qkv_ + 2 * key_dim,
        .v_stride = row_,
        .g = g_,
        .g_stride = f_.v_heads,
        .beta = beta_,
        .beta_stride = f_.v_heads,
        .num_k_heads = f_.k_heads,
        .num_v_heads = f_.v_heads,
        .k_dim = f_.k_dim,
        .v_dim = f_.v_dim,
        .l2norm_qk = true,
        .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(f_.k_dim))),
        .query_start_loc = qsl_,
        .num_seqs = num_seqs,
        .has_initial_state = nullptr,  // every sequence continues from its (random) state
        .states = states_,
        .state_slot_stride = slot_floats_,
        .out = out_,
        .out_stride = f_.v_heads * f_.v_dim};
    kernels::cpu::GatedDeltaRuleArgs chunked_args = base, recurrent_args = base;
    chunked_args.state_slots = chunked_slots_;
    recurrent_args.state_slots = recurrent_slots_;
    const bool any_chunked = c.kind != "decode", any_recurrent = c.kind != "prefill";
    auto call = [&]() -> absl::Status {
      if (any_chunked) {
        VAMP_RETURN_IF_ERROR(kc::GatedDeltaRuleChunked(chunked_args, f_.chunk, stream_));
      }
      if (any_recurrent) VAMP_RETURN_IF_ERROR(kc::GatedDeltaRuleRecurrent(recurrent_args, stream_));
      return absl::OkStatus();
    };
    VAMP_ASSIGN_OR_RETURN(r.ms, bench::MedianEventMs(call, f_.warmup, f_.iters, stream_));
    return r;
  }

 private:
  // A random pattern of up to 4 Mi floats from `draw`, tiled over the buffer.
  absl::Status Fill(float* dev, int64_t n, float (*draw)(std::mt19937&)) {
    std::vector<float> pattern(std::min<int64_t>(n, int64_t{4} << 20));
    for (float& x : pattern) x = draw(rng_);
    return buffers_.Tile(dev, n, pattern);
  }

  const Flags& f_;
  cudaStream_t stream_;
  std::mt19937 rng_;
  bench::DeviceBuffers buffers_;
  int64_t row_ = 0, slot_floats_ = 0;
  float *qkv_ = nullptr, *g_ = nullptr, *beta_ = nullptr, *states_ = nullptr, *out_ = nullptr;
  int32_t *qsl_ = nullptr, *chunked_slots_ = nullptr, *recurrent_slots_ = nullptr;
};

absl::Status RunAll(const Flags& f, cudaStream_t stream) {
  std::vector<Case> cases;
  const std::string& which = f.cases;
  if (which == "all" || which == "prefill") {
    for (int64_t len : f.prefill_lens) {
      cases.push_back({absl::StrCat("prefill_", len), "prefill", {static_cast<int32_t>(len)}});
    }
  }
  if (which == "all" || which == "mixed") {
    Case c{absl::StrCat("mixed_d", f.mixed_decodes, "_p", f.mixed_prompt), "mixed",
           std::vector<int32_t>(f.mixed_decodes, 1)};
    c.lens.push_back(static_cast<int32_t>(f.mixed_prompt));
    cases.push_back(std::move(c));
  }
  if (which == "all" || which == "decode") {
    cases.push_back({absl::StrCat("decode_b", f.decode_batch), "decode",
                     std::vector<int32_t>(f.decode_batch, 1)});
  }
  Bench bench(f, stream);
  VAMP_RETURN_IF_ERROR(bench.Setup(cases));
  if (!f.json) {
    std::printf(
        "gated delta rule: %lld key / %lld value heads, k_dim %lld, v_dim %lld, chunk %lld; "
        "median of %lld runs\n%-18s %8s %6s %10s %10s %10s\n",
        static_cast<long long>(f.k_heads), static_cast<long long>(f.v_heads),
        static_cast<long long>(f.k_dim), static_cast<long long>(f.v_dim),
        static_cast<long long>(f.chunk), static_cast<long long>(f.iters), "case", "tokens", "seqs",
        "ms", "GFLOP/s", "state GB/s");
  }
  for (const Case& c : cases) {
    int64_t tokens = 0;
    for (int32_t l : c.lens) tokens += l;
    absl::StatusOr<Result> r = bench.Run(c);
    if (!r.ok()) {
      std::printf("{\"case\": \"%s\", \"kind\": \"%s\", \"error\": \"%s\"}\n", c.name.c_str(),
                  c.kind.c_str(), std::string(r.status().message()).c_str());
      std::fflush(stdout);
      continue;
    }
    const double gflops = r->flops / r->ms / 1e6, gbps = r->bytes / r->ms / 1e6;
    if (f.json) {
      std::printf(
          "{\"case\": \"%s\", \"kind\": \"%s\", \"tokens\": %lld, \"seqs\": %zu, \"ms\": %.4f, "
          "\"flops\": %.0f, \"gflops\": %.1f, \"bytes\": %.0f, \"gbps\": %.1f}\n",
          c.name.c_str(), c.kind.c_str(), static_cast<long long>(tokens), c.lens.size(), r->ms,
          r->flops, gflops, r->bytes, gbps);
    } else {
      std::printf("%-18s %8lld %6zu %10.4f %10.1f %10.1f\n", c.name.c_str(),
                  static_cast<long long>(tokens), c.lens.size(), r->ms, gflops, gbps);
    }
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto invocation = ParseInvocation(Schema(), "vamp_delta_rule_bench",
                                    "the gated delta rule's chunked (prefill) and recurrent "
                                    "(decode) CUDA kernels on Qwen3-Next shapes.",
                                    argc, argv, FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const Flags& flags = *invocation.options;
  return bench::RunOnCudaDevice("vamp_delta_rule_bench", flags.cuda_device,
                                [&](cudaStream_t stream) { return RunAll(flags, stream); });
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) { return vamp::Main(argc, argv); }
