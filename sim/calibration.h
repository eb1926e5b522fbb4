// Calibration of vamp-sim: the model's shape (per rank) and the hardware's effective throughputs.
// Loaded from a JSON file ({"model": {...}, "hardware": {...}}, every field optional, unknown
// fields rejected); defaults describe Qwen3-30B-A3B on one H200 with the throughputs measured in
// shared/DESIGN.md. A GPU run of the engine can write a measured file in the same format.
#ifndef VAMP_SIM_CALIBRATION_H_
#define VAMP_SIM_CALIBRATION_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace vamp::sim {

struct SimModelShape {
  std::string name = "qwen3-30b-a3b";
  int32_t hidden = 2048;
  int32_t moe_intermediate = 768;
  int32_t num_experts = 128;
  int32_t top_k = 8;
  int32_t shared_expert_intermediate = 0;  // 0 = no shared expert
  int32_t num_layers = 48;
  // Layers with a KV cache (full attention); the others (linear attention) keep O(1) state.
  int32_t num_kv_layers = 48;
  int32_t num_q_heads = 32;
  int32_t num_kv_heads = 4;
  int32_t head_dim = 128;
  // Gated full attention (Qwen3-Next): q_proj also yields a per-head output gate, so its output is
  // twice the query width (HF Qwen3NextAttention; the engine's qwen3_next.h).
  bool attention_output_gate = false;
  int32_t vocab = 151936;
  int32_t dtype_bytes = 2;
  int32_t tp_size = 1;
  // Linear-attention layers (Qwen3-Next's Gated DeltaNet; the num_layers - num_kv_layers layers
  // without KV): key and value heads, their head dims and the causal conv's kernel. 0 = none.
  // Their per-sequence state (float32, as the engine keeps it) is what a prefix-cache hit must
  // restore, so the scheduler keeps snapshots of it in KV blocks (SchedulerConfig::
  // recurrent_state_blocks); every step's delta rule reads and writes it (its cost:
  // HardwareCalibration::delta_rule_*).
  int32_t linear_key_heads = 0;
  int32_t linear_value_heads = 0;
  int32_t linear_key_head_dim = 0;
  int32_t linear_value_head_dim = 0;
  int32_t linear_conv_kernel = 0;

  // Per rank, in bytes.
  int64_t ExpertBytes() const;      // one expert's shard [w13 | w2]
  int64_t KvBytesPerToken() const;  // all KV layers, K and V
  // The weights a layer's dense GEMMs read besides the routed experts: its mixer's projections,
  // the router and the shared expert. A full-attention layer projects q (and its output gate), k,
  // v and o; a Gated DeltaNet layer in_proj_qkvz (hidden -> 2 x key heads x key dim + 2 x value
  // heads x value dim), in_proj_ba (hidden -> 2 x value heads) and out_proj (value heads x value
  // dim -> hidden), heads split over the ranks (its conv, norm and gate vectors are < 0.1 %).
  int64_t KvLayerDenseBytes() const;
  int64_t LinearLayerDenseBytes() const;
  // One linear-attention layer's state per sequence: conv state (kernel - 1) x conv channels and
  // the delta-rule state value heads x v_dim x k_dim, float32; 0 without linear attention.
  int64_t RecurrentStateBytesPerLayer() const;
  int64_t RecurrentStateBytesPerSeq() const {
    return static_cast<int64_t>(num_layers - num_kv_layers) * RecurrentStateBytesPerLayer();
  }
  int32_t QHeadsPerRank() const { return num_q_heads / tp_size; }
  int32_t KvHeadsPerRank() const { return std::max(1, num_kv_heads / tp_size); }
  int32_t LinearKeyHeadsPerRank() const { return std::max(1, linear_key_heads / tp_size); }
  int32_t LinearValueHeadsPerRank() const { return std::max(1, linear_value_heads / tp_size); }
};

struct HardwareCalibration {
  std::string name = "h200";
  // Effective HBM read bandwidth for weights in small-batch GEMMs (bytes/s): DESIGN.md's MoE layer
  // at 16 tokens streams ≈2.5 TB/s of weights.
  double weight_read_bytes_per_s = 2.5e12;
  // KV cache reads in decode attention (bytes/s).
  double kv_read_bytes_per_s = 3.0e12;
  // Grouped expert GEMMs at large batch: ≈400 TFLOP/s (1.54 ms at 8192 tokens).
  double moe_flops_per_s = 400e12;
  // Dense projections and LM head.
  double dense_flops_per_s = 600e12;
  // Prefill attention (flash, causal): ≈510 TFLOP/s.
  double attention_flops_per_s = 510e12;
  // Pinned host→device copies: 55.5 GB/s.
  double h2d_bytes_per_s = 55.5e9;
  // Routed staging's copies (SM loads over PCIe of the routed experts only): 50 GB/s on the
  // H200 (bench/results/2026-12-02-routed-staging.md).
  double routed_h2d_bytes_per_s = 50e9;
  // Gated DeltaNet's delta rule on this rank, in µs per value head on the rank: per prefill token
  // (the chunked kernel, which runs a sequence's chunks one after another) and per decode sequence
  // (the recurrent kernel, one read and one write of each head's float32 state). The engine's
  // CUDA kernels on one H200 with Qwen3-Next's 16 / 32 heads of 128 (kernels/cuda/
  // gated_delta_rule.h, vamp_delta_rule_bench): a 4,096-token prefill of one layer 2.14 ms, a
  // decode step of 64 sequences 0.10 ms (≈2.7 TB/s of state traffic;
  // bench/results/2026-12-03-delta-rule-kernel/).
  double delta_rule_prefill_us_per_token_head = 2140.0 / (4096 * 32);
  double delta_rule_decode_us_per_seq_head = 100.0 / (64 * 32);
  // Fixed cost per step (scheduling, launches, sampling), µs.
  double step_overhead_us = 400;
  // Fixed cost per layer (kernel launches), µs.
  double layer_overhead_us = 20;
  // Tensor-parallel all-reduce per layer (two per layer), µs; unused at tp_size 1.
  double allreduce_us = 15;
  // Bus bandwidth of those all-reduces (bytes/s) for the activation volume (tokens × hidden ×
  // dtype each); 0 = latency only (NVLink-class links, where small steps dominate).
  double allreduce_bytes_per_s = 0;
};

struct Calibration {
  SimModelShape model;
  HardwareCalibration hardware;
};

// Named presets: "qwen3-30b-a3b" (TP1, H200), "qwen3-next-80b-a3b-tp2" (Qwen3-Next shapes, TP2,
// H200 throughputs), "qwen3-next-80b-a3b-h100-tp2" (the same on the paper's H100 PCIe cards) and
// "qwen3-next-80b-a3b-24l" (Qwen3-Next halved to 24 layers, TP1, H200: the model of the engine's
// one-GPU benchmarks, tests/data/qwen3-next-80b-a3b-24l).
absl::StatusOr<Calibration> CalibrationPreset(const std::string& name);

// Reads a calibration file over `base`. Errors name the file and the field.
absl::StatusOr<Calibration> LoadCalibration(const std::string& path, Calibration base);

}  // namespace vamp::sim

#endif  // VAMP_SIM_CALIBRATION_H_
