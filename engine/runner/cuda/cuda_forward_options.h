// How the GPU forward pass of Qwen3-MoE runs (CudaQwen3MoeModel, engine/runner/cuda/
// cuda_qwen3_moe.h): precision, the tensor-parallel sum, the grouped-GEMM crossover, CUDA graphs.
// Plain C++ without CUDA headers, so that the agent's flags (agent/agent_options.h) take their
// defaults from here in every build, CPU-only ones included.
#ifndef VAMP_ENGINE_RUNNER_CUDA_CUDA_FORWARD_OPTIONS_H_
#define VAMP_ENGINE_RUNNER_CUDA_CUDA_FORWARD_OPTIONS_H_

#include <cstdint>

#include "engine/model/dtype.h"

namespace vamp {

class DeviceAllReduce;  // engine/runner/cuda/device_all_reduce.h

struct CudaForwardOptions {
  // Rows of logits computed per LM-head launch (return_all_logits asks for every position; they
  // are computed in chunks of this many rows). 0 = the runner's max_num_seqs.
  int64_t max_logits_rows = 0;
  // Element type of weights, activations and KV cache (cuda_qwen3_moe.h, "Precision").
  DType dtype = DType::kBFloat16;
  // The tensor-parallel sum; required when the host model's tp_size > 1 (and of that size), must
  // outlive the model. Ignored for tp_size 1.
  DeviceAllReduce* all_reduce = nullptr;
  // bfloat16 MoE layers with at most this many (token, expert) rows per expert on average run the
  // device-side grouped GEMM (w13 with SiLU-and-mul fused); busier ones cuBLAS's grouped GEMM
  // (cublasGemmGroupedBatchedEx, one host synchronisation per layer for the row offsets). -1:
  // always the device kernel; 0: always cuBLAS. Default -1: with the wgmma tiles for busy groups
  // the device kernel is faster at every prefill size measured on an H200
  // (bench/results/2026-12-04-wgmma-grouped-gemm/: the Qwen3-30B-A3B mixed step with a
  // 2,048-token prompt 74.0 -> 66.7 ms, with 8,192 302 -> 272 ms), and no step waits on the host.
  // The earlier crossover at 64 rows (2026-11-29-cuda-backend) was against the mma.sync tiles.
  int64_t device_gemm_max_rows_per_expert = -1;
  // Decode-only steps (one token per sequence, sampled on the device without logits processing,
  // bfloat16, device-side expert GEMMs, tensor parallel size 1, nothing staged this pass) run as
  // CUDA graphs: captured once per (batch size, context bucket, alternatives asked for or not)
  // and replayed, so the ~15 launches per layer cost one launch.
  bool cuda_graphs = true;
  // Block-table stride bucket: every step's block table is laid out on a stride rounded up to a
  // multiple of this many blocks (and attention's context bound to stride x block_size), so a
  // growing context re-captures a graph only every this-many blocks, and graph and launch-by-launch
  // steps plan attention identically (bit-identical results).
  int64_t graph_stride_bucket_blocks = 64;
  // Captured graphs kept; beyond this the cache is cleared and refilled.
  int64_t max_cuda_graphs = 64;
  // Passes of at most this many tokens stage only the offloaded experts their tokens route to
  // (CudaExpertStoreWeights, "Routed staging"); larger ones copy the whole offloaded region
  // behind compute. 0 = always the whole region. 16 by measurement on the H200
  // (bench/results/2026-12-02-routed-staging.md): routed copies win while a step routes to well
  // under the whole offloaded region, i.e. up to about 20 tokens of Qwen3-30B-A3B's top-8 of 128.
  int64_t routed_staging_max_tokens = 16;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_CUDA_FORWARD_OPTIONS_H_
