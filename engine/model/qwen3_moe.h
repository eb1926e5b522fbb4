// Qwen3-MoE (HF Qwen3MoeForCausalLM) for one tensor-parallel rank, on the CPU reference kernels.
//
// Per decoder layer, pre-norm:
//   h = RMSNorm(x);  x += o_proj(Attention(RoPE(q_norm(q_proj h)), RoPE(k_norm(k_proj h)), v_proj
//   h)) h = RMSNorm(x);  x += MoE(h)   (or a dense SiLU MLP in mlp_only layers)
// then the final RMSNorm and the LM head for the requested rows. The attention reads the paged KV
// cache (the new tokens' K/V are written first, by slot mapping); the MoE routes each token to
// its top-k experts (softmax, top-k, optional renormalisation) and reaches the experts through
// the ExpertWeights pointer table.
//
// Tensor parallelism: q heads and KV heads are split across ranks (KV heads replicated when there
// are fewer than ranks), o_proj by its input columns, experts and the dense MLP by the
// intermediate dimension; the partial sums after o_proj and after the MLP are all-reduced.
// Embedding, router, norms and LM head are replicated.
#ifndef VAMP_ENGINE_MODEL_QWEN3_MOE_H_
#define VAMP_ENGINE_MODEL_QWEN3_MOE_H_

#include <memory>
#include <vector>

#include "engine/model/causal_lm.h"
#include "engine/model/feed_forward.h"
#include "engine/model/weight_source.h"

namespace vamp {

class Qwen3MoeModel : public CausalLm {
 public:
  // Reads this rank's shard of every weight from `source`; experts go to `experts`.
  static absl::StatusOr<std::unique_ptr<Qwen3MoeModel>> Load(const ModelConfig& config,
                                                             const ParallelConfig& parallel,
                                                             WeightSource& source,
                                                             ExpertWeightSink& experts);

  const ModelConfig& config() const override { return config_; }
  const ParallelConfig& parallel() const override { return parallel_; }
  ExpertShardLayout expert_layout() const override { return expert_layout_; }
  int64_t kv_heads_per_rank() const override { return kv_heads_; }
  const std::vector<int>& attention_layers() const override { return attention_layers_; }
  const std::vector<int>& moe_layers() const override { return moe_layers_; }

  absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                       Communicator* comm, float* logits) override;

  void ForEachWeight(
      const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const override;

 private:
  struct Layer {
    bool moe = true;
    std::vector<float> input_norm;  // [hidden]
    std::vector<float> post_norm;   // [hidden]
    std::vector<float> qkv;         // [(q_heads + 2 * kv_heads) * head_dim, hidden], rank-local
    std::vector<float> o_proj;      // [hidden, q_heads * head_dim], rank-local columns
    std::vector<float> q_norm;      // [head_dim]
    std::vector<float> k_norm;      // [head_dim]
    std::vector<float> router;      // [num_experts, hidden] (MoE layers)
    std::vector<float> mlp_w13;     // [2 * inter, hidden] gate then up (dense layers)
    std::vector<float> mlp_w2;      // [hidden, inter] (dense layers)
  };

  Qwen3MoeModel(const ModelConfig& config, const ParallelConfig& parallel);
  absl::Status LoadWeights(WeightSource& source, ExpertWeightSink& experts);

  absl::Status Attention(int layer, const ForwardBatch& batch, const KvCacheView& kv);

  ModelConfig config_;
  ParallelConfig parallel_;
  int64_t q_heads_ = 0;        // rank-local
  int64_t kv_heads_ = 0;       // rank-local
  int64_t first_q_head_ = 0;   // global index of this rank's first q head
  int64_t first_kv_head_ = 0;  // global index of this rank's first KV head
  int64_t dense_inter_ = 0;    // rank-local dense MLP width
  ExpertShardLayout expert_layout_;
  std::vector<int> attention_layers_;
  std::vector<int> moe_layers_;

  std::vector<float> embed_;       // [vocab, hidden]
  std::vector<float> lm_head_;     // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;  // [hidden]
  std::vector<Layer> layers_;
  std::vector<float> rope_cache_;  // [max_position_embeddings, head_dim]

  // Step workspaces, grown on demand (Forward is single-threaded by contract).
  std::vector<float> hidden_, residual_, qkv_buf_, attn_out_, attn_ws_;
  FeedForward feed_forward_;
  std::vector<float> sel_hidden_, sel_residual_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_QWEN3_MOE_H_
