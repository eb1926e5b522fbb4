#include "bench/engine/gpu_step_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/runner/cuda/cuda_qwen3_moe.h"

namespace vamp::gpu_step_bench {

ConfigSchema Schema() {
  ConfigSchema s;
  s.String("model", "",
           "model directory with config.json; weights are dummy (seeded random) of its shapes "
           "(default: $VAMP_SOURCE_DIR/tests/data/qwen3-30b-a3b, else ./tests/data/qwen3-30b-a3b)");
  s.Int("batch", 64, 1, 4096, "decoding sequences");
  s.Int("context", 2048, 1, int64_t{1} << 20, "tokens of context of every decoding sequence");
  s.Int("prefill_tokens", 2048, 0, int64_t{1} << 20,
        "tokens of the new prompt each mixed step adds to the decode batch (0: no mixed steps)");
  s.String("ratios", "0,0.05,0.10,0.15,0.20,0.25",
           "offload ratios VAMP-r as fractions of each eligible layer's experts, comma-separated "
           "(0, the fully resident reference, is always measured first)");
  s.Int("steps", 20, 1, 100000, "timed steps per point");
  s.Int("warmup", 3, 1, 1000,
        "untimed steps before each point's timed steps (the first re-admits the batch)");
  s.Double("gpu_memory_utilization", 0.90, 0.05, 1.0,
           "fraction of device memory the memory plan may use (weights, staging, KV pool)");
  s.Int("max_num_batched_tokens", 8192, 16, int64_t{1} << 20,
        "tokens one step may compute (workspace size; the prefill runs in steps of this many)");
  s.Int("block_size", 16, 1, 1024, "tokens per KV block");
  s.Int("device_gemm_max_rows_per_expert", CudaForwardOptions{}.device_gemm_max_rows_per_expert, -1,
        int64_t{1} << 40,
        "CudaForwardOptions::device_gemm_max_rows_per_expert: MoE layers with more (token, expert) "
        "rows per expert on average use cuBLAS's grouped GEMM (-1: always the device grouped "
        "GEMM, 0: always cuBLAS)");
  s.Bool("routed_staging", false,
         "also time decode steps that copy only the offloaded experts their tokens route to "
         "(mode 'decode, routed staging'; CudaForwardOptions::routed_staging_max_tokens), next to "
         "the whole-region copy");
  s.Bool("attention_mma_sync_only", false,
         "run prefill attention on the mma.sync kernel even where the Hopper wgmma kernel is the "
         "default (kernels::cuda::SetPagedAttentionMmaSyncOnly; the wgmma kernel's baseline)");
  s.Bool("grouped_gemm_decode_tile", true,
         "run decode-sized expert groups (up to 16 rows per expert) on the 16 x 64 decode tiles; "
         "false: on the 32 x 128 tiles they replaced (kernels::cuda::SetGroupedGemmDecodeTile; "
         "their baseline)");
  s.Bool(
      "cuda_profiler", false,
      "bracket every point's timed steps with cudaProfilerStart/Stop, so that a profiler started "
      "with collection off (ncu --profile-from-start off) sees only them "
      "(bench/engine/kernel_breakdown.py sums its per-kernel times)");
  s.Int("cuda_device", 0, 0, 64, "CUDA device ordinal");
  s.Int("seed", 0, 0, int64_t{1} << 62, "seed of the dummy weights and the random prompts");
  s.Int("hbm_copy_mib", 2048, 64, 65536,
        "MiB of the device-to-device copy that measures HBM bandwidth (two such buffers)");
  s.Int("h2d_copy_mib", 512, 2, 65536, "MiB of the pinned host->device copy that measures PCIe");
  s.Int("bandwidth_reps", 10, 1, 1000, "timed repetitions of each bandwidth measurement");
  s.String("json", "", "write the results as JSON to this file");
  return s;
}

absl::StatusOr<std::vector<double>> ParseRatios(absl::string_view text) {
  std::vector<double> ratios = {0.0};
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    double r = 0;
    if (!absl::SimpleAtod(part, &r) || !(r >= 0.0 && r < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ratios: '", part, "' is not a fraction in [0, 1) (e.g. --ratios=0,0.05,0.15)"));
    }
    ratios.push_back(r);
  }
  std::sort(ratios.begin(), ratios.end());
  ratios.erase(std::unique(ratios.begin(), ratios.end(),
                           [](double a, double b) { return std::abs(a - b) < 1e-9; }),
               ratios.end());
  return ratios;
}

absl::StatusOr<Flags> ReadFlags(const Config& c) {
  Flags f;
  f.model_dir = c.GetString("model");
  if (f.model_dir.empty()) {
    const char* src = std::getenv("VAMP_SOURCE_DIR");
    f.model_dir = absl::StrCat(src != nullptr ? src : ".", "/tests/data/qwen3-30b-a3b");
  }
  f.batch = c.GetInt("batch");
  f.context = c.GetInt("context");
  f.prefill_tokens = c.GetInt("prefill_tokens");
  f.steps = c.GetInt("steps");
  f.warmup = c.GetInt("warmup");
  VAMP_ASSIGN_OR_RETURN(f.ratios, ParseRatios(c.GetString("ratios")));
  f.gpu_memory_utilization = c.GetDouble("gpu_memory_utilization");
  f.max_num_batched_tokens = c.GetInt("max_num_batched_tokens");
  f.block_size = c.GetInt("block_size");
  f.device_gemm_max_rows_per_expert = c.GetInt("device_gemm_max_rows_per_expert");
  f.routed_staging = c.GetBool("routed_staging");
  f.attention_mma_sync_only = c.GetBool("attention_mma_sync_only");
  f.grouped_gemm_decode_tile = c.GetBool("grouped_gemm_decode_tile");
  f.cuda_profiler = c.GetBool("cuda_profiler");
  f.cuda_device = static_cast<int>(c.GetInt("cuda_device"));
  f.seed = static_cast<uint64_t>(c.GetInt("seed"));
  f.hbm_copy_bytes = static_cast<uint64_t>(c.GetInt("hbm_copy_mib")) << 20;
  f.h2d_copy_bytes = static_cast<uint64_t>(c.GetInt("h2d_copy_mib")) << 20;
  f.bandwidth_reps = static_cast<int>(c.GetInt("bandwidth_reps"));
  f.json = c.GetString("json");
  if (f.batch > f.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--batch ", f.batch,
                                                   " exceeds --max_num_batched_tokens ",
                                                   f.max_num_batched_tokens, " (one decode step)"));
  }
  if (f.batch + f.prefill_tokens > f.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a mixed step computes --batch + --prefill_tokens = ", f.batch + f.prefill_tokens,
        " tokens, more than --max_num_batched_tokens ", f.max_num_batched_tokens));
  }
  return f;
}

}  // namespace vamp::gpu_step_bench
