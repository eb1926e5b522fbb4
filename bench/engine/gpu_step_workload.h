// vamp_gpu_step_bench's workload driver: `batch` sequences prefilled to `context` tokens, then for
// each offload ratio (ascending) decode-only steps (every sequence +1 token) and mixed steps (the
// same decodes plus one new prefill_tokens prompt), each point re-admitting the batch as
// prefix-cache hits at exactly `context` tokens so all points decode at the same context.
#ifndef VAMP_BENCH_ENGINE_GPU_STEP_WORKLOAD_H_
#define VAMP_BENCH_ENGINE_GPU_STEP_WORKLOAD_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/engine/gpu_step_common.h"
#include "bench/engine/gpu_step_engine.h"
#include "bench/engine/gpu_step_flags.h"
#include "engine/runner/model_runner.h"

namespace vamp::gpu_step_bench {

struct StepSample {
  double step_ms = 0;     // wall clock around ExecuteStep
  double forward_ms = 0;  // StepOutput::forward_us
  double sample_ms = 0;   // StepOutput::sample_us
  uint64_t staged_bytes = 0;
  int64_t staged_copies = 0;
  double exposed_ms = 0;  // CudaStagingStats::exposed_us: staging the compute stream waited for
};

struct PointResult {
  std::string mode;  // "decode" or "mixed"
  double ratio = 0;
  int64_t groups = 0;
  int64_t offloaded_experts_per_layer = 0;
  int64_t staged_layers = 0;
  uint64_t offloaded_bytes_per_layer = 0;
  int64_t tokens_per_step = 0;
  Summary step_ms, forward_ms, sample_ms;
  double staged_bytes_per_step = 0;
  double copies_per_step = 0;
  double exposed_ms_per_step = 0;  // mean of StepSample::exposed_ms
  double copies_alone_ms = 0;      // the step's staging copies replayed alone
  int64_t graph_replays = 0;  // steps of the point (warm-up included) replayed from CUDA graphs
  // Filled in once the resident reference of the mode is known.
  double floor_ms = 0;
  double forward_over_floor = 0;
  double step_over_floor = 0;
  double staging_gbps_lower_bound = 0;
  double forward_overhead_pct = 0;
  double step_overhead_pct = 0;
};

// The requests of the batch and the mixed steps' prompt on one engine. Not thread-safe; `f` and
// `e` must outlive it.
class Workload {
 public:
  Workload(const Flags& f, GpuEngine* e) : f_(f), e_(e), rng_(f.seed + 1) {}

  // Lays out prompts and blocks, checks they fit the KV pool, and prefills the batch.
  absl::Status Fill();

  // warmup + steps steps of the batch decoding from `context`, plus (mixed) one new prompt of
  // prefill_tokens per step. Returns the timed steps.
  absl::StatusOr<std::vector<StepSample>> Run(bool mixed);

 private:
  const Flags& f_;
  GpuEngine* const e_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> prompts_;  // context + 1 tokens each
  std::vector<std::vector<int32_t>> blocks_;
  // Models with recurrent state (Qwen3-Next): each sequence's state after `context` tokens,
  // captured by the prefill and restored when a point re-admits the batch as prefix-cache hits.
  std::vector<StateSnapshotBlocks> snapshots_;
  std::vector<int32_t> prefill_prompt_;
  std::vector<int32_t> prefill_block_ids_;
  std::vector<RunnerRequestId> live_;  // requests the runner holds, finished by the next point
  RunnerRequestId next_id_ = 1;
  RunnerRequestId prefill_id_ = 0;
};

// Every point: for each ratio of f.ratios (ascending), offloads to it and runs the decode (and
// mixed) steps, with the staging copies of a pass replayed alone. The floor fields are left 0.
absl::StatusOr<std::vector<PointResult>> MeasurePoints(const Flags& f, GpuEngine& e,
                                                       Workload& workload);

}  // namespace vamp::gpu_step_bench

#endif  // VAMP_BENCH_ENGINE_GPU_STEP_WORKLOAD_H_
