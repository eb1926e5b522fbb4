// The MLP half of a Qwen3-family decoder layer on the CPU reference kernels, with its step
// workspaces: routed experts (softmax top-k router; experts reached through the ExpertWeights
// pointer table, wherever they live) and dense SiLU MLPs (mlp_only layers, Qwen3-Next's shared
// expert). Shared by the model definitions so that one sequence of kernel calls defines each.
// One instance per model; not thread-safe (Forward is single-threaded by contract).
#ifndef VAMP_ENGINE_MODEL_FEED_FORWARD_H_
#define VAMP_ENGINE_MODEL_FEED_FORWARD_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/causal_lm.h"

namespace vamp {

// The routed experts of one MoE layer: router [num_experts, hidden]; rank-local expert width.
struct RoutedExpertsShape {
  int64_t hidden = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool renormalize = false;  // HF norm_topk_prob
  int64_t inter = 0;         // rank-local moe intermediate size
};

class FeedForward {
 public:
  // out[t] = sum over token t's top-k experts (in choice order) of weight * expert(x[t]), the
  // experts of MoE layer `layer` acquired from `experts` for the call. x and out are
  // [n, hidden] (contiguous) and may be the same buffer.
  absl::Status Routed(int layer, const float* router, const RoutedExpertsShape& shape,
                      const float* x, int64_t n, ExpertWeights* experts, float* out);

  // out = down(silu(gate(x)) * up(x)): w13 = [2 * inter, hidden] (gate rows, then up), w2 =
  // [hidden, inter]; x and out are [n, hidden] (contiguous) and may be the same buffer.
  void Dense(const float* w13, const float* w2, int64_t hidden, int64_t inter, const float* x,
             int64_t n, float* out);

 private:
  std::vector<float> router_logits_, topk_weights_, permuted_, h13_, act_, expert_out_;
  std::vector<int32_t> topk_ids_, expert_offsets_, row_token_, pair_row_;
  std::vector<const float*> w13_table_, w2_table_;  // the acquired layer's table, typed
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_FEED_FORWARD_H_
