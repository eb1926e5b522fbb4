// vamp_gpu_step_bench: step time of the whole GPU engine (ModelRunner driving CudaQwen3MoeModel in
// bfloat16, dummy weights, KV cache and experts in CUDA VMM pages) on one GPU, against the floors
// the hardware sets, measured in the same process:
//
//   1. Decode floor. A decode step must read every non-expert weight (the embedding table only for
//      the batch's rows), the experts the batch's tokens select, and the KV of every sequence:
//        floor = (non-expert bytes + expected distinct experts x expert bytes + KV bytes) / HBM
//      with HBM bandwidth from a device-to-device copy (2 x bytes / time). The batch's distinct
//      experts per MoE layer are estimated for uniform routing: each token picks k of E experts,
//      so an expert is missed by all T tokens with probability (1 - k/E)^T and the expected count
//      is E (1 - (1 - k/E)^T) (dummy weights give a near-uniform router).
//   2. Staging floor. With experts [b, E) of every eligible layer offloaded, every step copies
//      those bytes host->device once, overlapped with compute, so
//        floor = max(resident forward time, staged bytes per step / pinned H2D bandwidth)
//      with the pinned bandwidth from one large cudaMemcpyAsync (the resident point of the same
//      mode, decode or mixed, gives the compute time). Alongside: the same copies replayed alone
//      (the store's pinned ranges into a device buffer, back to back), and the bandwidth the step
//      reached, staged bytes / forward time: a lower bound on the copy stream's bandwidth (its
//      copies take at most the whole pass), close to it when copies dominate.
//   3. The TPOT overhead of each offload ratio against the fully resident step (paper: +31.1 % at
//      VAMP-15 on Qwen3-Next-80B, TP2, H100).
//
// Procedure: build the engine once with VAMP-r = the largest ratio; prefill `batch` sequences of
// `context` tokens (steps of at most max_num_batched_tokens); then for each ratio, ascending:
// offload to it (PageRemapper::Offload), and time decode-only steps (every sequence +1
// token) and mixed steps (the same decodes plus one new `prefill_tokens` prompt). Every point
// re-admits the batch as prefix-cache hits at exactly `context` tokens, so all points decode at the
// same context. Step time is wall-clock around ModelRunner::ExecuteStep (it returns with the
// stream idle), forward time the runner's own forward_us (without host-side sampling).
//
// Reported, never asserted. Prints a table and writes --json (run_gpu_step_bench.sh turns it into
// the report next to the HF transformers baseline).
//
// The parts: gpu_step_flags (command line), gpu_step_bandwidth (hardware probes),
// gpu_step_engine (assembly), gpu_step_workload (the workload driver), gpu_step_floors (floor
// models) and gpu_step_report (table and JSON).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/engine/gpu_step_bandwidth.h"
#include "bench/engine/gpu_step_engine.h"
#include "bench/engine/gpu_step_flags.h"
#include "bench/engine/gpu_step_floors.h"
#include "bench/engine/gpu_step_report.h"
#include "bench/engine/gpu_step_workload.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "engine/memory/memory_plan.h"
#include "engine/model/model_config.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/grouped_gemm.h"

namespace vamp::gpu_step_bench {
namespace {

constexpr char kSummary[] =
    "Step time of the bf16 GPU engine (dummy weights) against the HBM decode floor and the "
    "expert-staging floor, per offload ratio.";

absl::Status Run(const Flags& f) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(f.model_dir);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("--model '", f.model_dir, "': ", config.status().message()));
  }
  VAMP_LOG(INFO) << absl::StrFormat(
      "%s: %d layers, hidden %d, %d experts top-%d, vocab %d; batch %d @ %d tokens, mixed "
      "+%d-token prompt, ratios %s",
      f.model_dir, config->num_hidden_layers, config->hidden_size, config->num_experts,
      config->num_experts_per_tok, config->vocab_size, f.batch, f.context, f.prefill_tokens,
      absl::StrJoin(f.ratios, ","));

  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  if (count_err != cudaSuccess || devices == 0) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device (", cudaGetErrorName(count_err), ", ", devices,
                     " devices): vamp_gpu_step_bench runs on a GPU host"));
  }
  if (f.cuda_device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_device ", f.cuda_device, ": the host has ", devices, " devices"));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(f.cuda_device));
  kernels::cuda::SetPagedAttentionMmaSyncOnly(f.attention_mma_sync_only);
  kernels::cuda::SetGroupedGemmDecodeTile(f.grouped_gemm_decode_tile);

  VAMP_ASSIGN_OR_RETURN(const Bandwidths bw, MeasureBandwidths(f, config->vocab_size));
  VAMP_LOG(INFO) << absl::StrFormat(
      "%s: HBM %.0f GB/s (device copy of %s), pinned H2D %.1f GB/s (%s), logits D2H %.2f ms",
      bw.device_name, bw.hbm_gbps, FormatBytes(bw.hbm_copy_bytes), bw.h2d_peak_gbps,
      FormatBytes(f.h2d_copy_bytes), bw.logits_d2h_ms);

  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> engine, MakeEngine(f, *config));
  GpuEngine& e = *engine;
  const ExpertGeometry& g = e.rank->plan.experts;
  Workload workload(f, &e);
  VAMP_RETURN_IF_ERROR(workload.Fill());

  VAMP_ASSIGN_OR_RETURN(std::vector<PointResult> points, MeasurePoints(f, e, workload));
  VAMP_RETURN_IF_ERROR(ApplyStagingFloors(bw, &points));
  const DecodeFloor floor = ComputeDecodeFloor(f, e, bw.hbm_gbps);

  std::printf("%s", FormatReport(f, bw, floor, g, points).c_str());
  VAMP_RETURN_IF_ERROR(WriteJsonReport(f, bw, e, floor, points));
  return absl::OkStatus();
}

}  // namespace
}  // namespace vamp::gpu_step_bench

int main(int argc, char** argv) {
  auto invocation = vamp::ParseInvocation(vamp::gpu_step_bench::Schema(), "vamp_gpu_step_bench",
                                          vamp::gpu_step_bench::kSummary, argc, argv,
                                          vamp::gpu_step_bench::ReadFlags);
  if (!invocation.options) return invocation.exit_code;
  const absl::Status s = vamp::gpu_step_bench::Run(*invocation.options);
  if (!s.ok()) {
    std::fprintf(stderr, "vamp_gpu_step_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
