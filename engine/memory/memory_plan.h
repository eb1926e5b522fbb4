// The agent's memory plan: how one rank's device-memory budget divides into weights, activations,
// staging buffers, the recurrent state of models with linear attention (one slot per sequence)
// and the baseline KV pool, and how much more KV VAMP-r can add by offloading experts. Computed once at start-up and printed the way operators of vLLM-style engines expect:
//
//   KV cache: 52,102 blocks = 833,632 tokens (9.54 GiB); VAMP-r can add 57,385 blocks = ...
//
// Settings that cannot work (weights over the budget, no room for one block, a max_model_len the
// pool cannot hold) fail with an error saying what does not fit and by how much.
#ifndef VAMP_ENGINE_MEMORY_MEMORY_PLAN_H_
#define VAMP_ENGINE_MEMORY_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/memory/geometry.h"
#include "engine/memory/model_shape.h"

namespace vamp {

struct MemoryPlanConfig {
  int tp_rank = 0;
  int tp_size = 1;
  // Total memory of the device (MemoryBackend::device_memory_bytes()).
  uint64_t device_memory_bytes = 0;
  // Fraction of the device this rank may use, as vLLM's gpu_memory_utilization.
  double gpu_memory_utilization = 0.90;
  // The VMM page (MemoryBackend::page_bytes()).
  uint64_t page_bytes = uint64_t{2} << 20;
  // Tokens per KV block.
  int64_t kv_block_size = 16;
  OffloadConfig offload;
  // The step shape the activation reserve must hold.
  int64_t max_num_batched_tokens = 8192;
  int64_t max_num_seqs = 256;
  // Longest sequence that must fit in the baseline pool; 0 skips the check.
  int64_t max_model_len = 0;
  // Device memory outside our allocations: CUDA context, cuBLAS workspaces, NCCL buffers.
  uint64_t runtime_overhead_bytes = uint64_t{1} << 30;
  // Peak activation bytes measured by a profiling step; 0 uses EstimateActivationBytes.
  uint64_t activation_bytes = 0;
};

struct MemoryPlan {
  MemoryPlanConfig config;
  std::string model_name;
  ExpertGeometry experts;
  KvBlockGeometry kv;

  uint64_t budget_bytes = 0;         // gpu_memory_utilization x device_memory_bytes
  uint64_t expert_weight_bytes = 0;  // all expert regions, whole pages
  uint64_t other_weight_bytes = 0;   // NonExpertWeightBytesPerRank (an estimate)
  uint64_t activation_bytes = 0;
  uint64_t runtime_overhead_bytes = 0;
  // Staging buffers reserved at start-up: experts.reserved_staging_pages(), 0 where they are carved
  // out of the offloaded pages (ExpertGeometry::staging_carved).
  uint64_t reserved_staging_bytes = 0;
  // Recurrent state (linear-attention layers, Qwen3-Next): one slot per sequence a step may hold
  // (config.max_num_seqs), each ModelShape::RecurrentStateBytesPerSeqPerRank, reserved before the
  // KV pool is sized: unlike KV it does not grow with the sequence. 0 for attention-only models.
  uint64_t recurrent_state_bytes_per_seq = 0;
  uint64_t recurrent_state_bytes = 0;  // recurrent_state_bytes_per_seq x max_num_seqs

  int64_t kv_baseline_pages = 0;
  int64_t kv_baseline_blocks = 0;
  // Pages and blocks the KV region can reach when every offloadable group is offloaded (less what
  // carved staging buffers take).
  int64_t kv_max_pages = 0;
  int64_t kv_max_blocks = 0;

  // Pages the page pool creates at start-up: every expert region, reserved staging buffers and the
  // baseline KV pool.
  int64_t pool_pages() const {
    return experts.total_pages() + experts.reserved_staging_pages() + kv_baseline_pages;
  }
  int64_t kv_baseline_tokens() const { return kv_baseline_blocks * kv.block_size; }
  // KV blocks one copy of a sequence's recurrent state fills: a prefix-cache snapshot is stored in
  // the KV pool (the controller counts its blocks there), ceil(recurrent_state_bytes_per_seq /
  // kv.block_bytes); 0 without recurrent state.
  int64_t snapshot_blocks() const;
  int64_t vamp_extra_blocks() const { return kv_max_blocks - kv_baseline_blocks; }
  // Bytes left unplanned inside the budget (less than one page).
  uint64_t slack_bytes() const;

  // The multi-line start-up summary.
  std::string Summary() const;
};

// Activation workspace for a step of `max_num_batched_tokens` tokens and `max_num_seqs` sequences:
// hidden states, residual, attention inputs and outputs, router logits (fp32), the permuted
// top-k expert inputs and intermediates, and fp32 logits for one token per sequence.
uint64_t EstimateActivationBytes(const ModelShape& shape, int tp_size,
                                 int64_t max_num_batched_tokens, int64_t max_num_seqs);

absl::StatusOr<MemoryPlan> PlanMemory(const ModelShape& shape, const MemoryPlanConfig& config);

// A plan whose baseline KV pool is exactly `kv_pages` pages (tests and benches): plans once with
// plenty of memory to learn the fixed costs, then gives the device exactly those plus the pool.
// `config.device_memory_bytes` is ignored and `config.gpu_memory_utilization` taken as 1 (the
// device is sized to the plan).
absl::StatusOr<MemoryPlan> PlanWithKvPages(const ModelShape& shape, MemoryPlanConfig config,
                                           int64_t kv_pages);

// "1.50 GiB", "6.0 MiB", "512 KiB", "100 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace vamp

#endif  // VAMP_ENGINE_MEMORY_MEMORY_PLAN_H_
