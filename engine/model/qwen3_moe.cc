#include "engine/model/qwen3_moe.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/model/batch_attention.h"
#include "engine/model/scratch.h"
#include "engine/model/weight_reading.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace vamp {
namespace {

namespace k = kernels::cpu;

}  // namespace

Qwen3MoeModel::Qwen3MoeModel(const ModelConfig& config, const ParallelConfig& parallel)
    : config_(config), parallel_(parallel) {}

absl::StatusOr<std::unique_ptr<Qwen3MoeModel>> Qwen3MoeModel::Load(const ModelConfig& config,
                                                                   const ParallelConfig& parallel,
                                                                   WeightSource& source,
                                                                   ExpertWeightSink& experts) {
  const int tp = parallel.tp_size;
  if (tp < 1 || parallel.tp_rank < 0 || parallel.tp_rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", parallel.tp_rank, " of size ", tp, " is invalid"));
  }
  auto indivisible = [&](absl::string_view field, int64_t value) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", field, "' (", value,
                                                   ") is not divisible by the tensor parallel "
                                                   "size ",
                                                   tp));
  };
  if (config.num_attention_heads % tp != 0) {
    return indivisible("num_attention_heads", config.num_attention_heads);
  }
  const int64_t kvh = config.num_key_value_heads;
  if (kvh >= tp ? kvh % tp != 0 : tp % kvh != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'num_key_value_heads' (", kvh,
                                                   ") and the tensor parallel size ", tp,
                                                   " must divide one another"));
  }
  if (config.moe_intermediate_size % tp != 0) {
    return indivisible("moe_intermediate_size", config.moe_intermediate_size);
  }
  std::unique_ptr<Qwen3MoeModel> model(new Qwen3MoeModel(config, parallel));
  model->q_heads_ = config.num_attention_heads / tp;
  model->first_q_head_ = parallel.tp_rank * model->q_heads_;
  if (kvh >= tp) {
    model->kv_heads_ = kvh / tp;
    model->first_kv_head_ = parallel.tp_rank * model->kv_heads_;
  } else {
    // Each KV head is replicated on tp / kvh consecutive ranks, matching their q heads.
    model->kv_heads_ = 1;
    model->first_kv_head_ = parallel.tp_rank * kvh / tp;
  }
  model->expert_layout_ = {config.hidden_size, config.moe_intermediate_size / tp};
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    model->attention_layers_.push_back(l);
    if (config.IsMoeLayer(l)) {
      model->moe_layers_.push_back(l);
    } else if (config.intermediate_size % tp != 0) {
      return indivisible("intermediate_size", config.intermediate_size);
    }
  }
  model->dense_inter_ = config.intermediate_size / tp;
  VAMP_RETURN_IF_ERROR(model->LoadWeights(source, experts));
  model->rope_cache_.resize(config.max_position_embeddings * config.head_dim);
  k::BuildRopeCache(static_cast<float>(config.rope_theta), config.head_dim,
                    config.max_position_embeddings, model->rope_cache_.data());
  return model;
}

absl::Status Qwen3MoeModel::LoadWeights(WeightSource& source, ExpertWeightSink& experts) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size, hd = c.head_dim;
  VAMP_RETURN_IF_ERROR(ReadFull(source, "model.embed_tokens.weight", {V, H}, &embed_));
  if (!c.tie_word_embeddings) {
    VAMP_RETURN_IF_ERROR(ReadFull(source, "lm_head.weight", {V, H}, &lm_head_));
  }
  VAMP_RETURN_IF_ERROR(ReadFull(source, "model.norm.weight", {H}, &final_norm_));

  layers_.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    L.moe = c.IsMoeLayer(l);
    VAMP_RETURN_IF_ERROR(ReadFull(source, p + "input_layernorm.weight", {H}, &L.input_norm));
    VAMP_RETURN_IF_ERROR(
        ReadFull(source, p + "post_attention_layernorm.weight", {H}, &L.post_norm));
    VAMP_RETURN_IF_ERROR(ReadFull(source, p + "self_attn.q_norm.weight", {hd}, &L.q_norm));
    VAMP_RETURN_IF_ERROR(ReadFull(source, p + "self_attn.k_norm.weight", {hd}, &L.k_norm));

    // q, k and v rows of this rank's heads, fused into one [(q + 2 kv) * hd, H] matrix.
    const int64_t q_rows = q_heads_ * hd, kv_rows = kv_heads_ * hd;
    L.qkv.resize((q_rows + 2 * kv_rows) * H);
    VAMP_RETURN_IF_ERROR(ReadRows(source, p + "self_attn.q_proj.weight", c.num_attention_heads * hd,
                                  H, first_q_head_ * hd, first_q_head_ * hd + q_rows,
                                  L.qkv.data()));
    VAMP_RETURN_IF_ERROR(ReadRows(source, p + "self_attn.k_proj.weight", c.num_key_value_heads * hd,
                                  H, first_kv_head_ * hd, first_kv_head_ * hd + kv_rows,
                                  L.qkv.data() + q_rows * H));
    VAMP_RETURN_IF_ERROR(ReadRows(source, p + "self_attn.v_proj.weight", c.num_key_value_heads * hd,
                                  H, first_kv_head_ * hd, first_kv_head_ * hd + kv_rows,
                                  L.qkv.data() + (q_rows + kv_rows) * H));
    L.o_proj.resize(H * q_rows);
    VAMP_RETURN_IF_ERROR(ReadCols(source, p + "self_attn.o_proj.weight", H,
                                  c.num_attention_heads * hd, first_q_head_ * hd,
                                  first_q_head_ * hd + q_rows, L.o_proj.data()));
    if (L.moe) {
      VAMP_RETURN_IF_ERROR(ReadFull(source, p + "mlp.gate.weight", {c.num_experts, H}, &L.router));
      VAMP_RETURN_IF_ERROR(LoadRoutedExperts(source, l, c.num_experts, c.moe_intermediate_size,
                                             expert_layout_, parallel_.tp_rank, experts));
    } else {
      const int64_t I = c.intermediate_size, Il = dense_inter_, r = parallel_.tp_rank;
      L.mlp_w13.resize(2 * Il * H);
      L.mlp_w2.resize(H * Il);
      VAMP_RETURN_IF_ERROR(ReadRows(source, p + "mlp.gate_proj.weight", I, H, r * Il, (r + 1) * Il,
                                    L.mlp_w13.data()));
      VAMP_RETURN_IF_ERROR(ReadRows(source, p + "mlp.up_proj.weight", I, H, r * Il, (r + 1) * Il,
                                    L.mlp_w13.data() + Il * H));
      VAMP_RETURN_IF_ERROR(ReadCols(source, p + "mlp.down_proj.weight", H, I, r * Il, (r + 1) * Il,
                                    L.mlp_w2.data()));
    }
  }
  const std::vector<std::string> unread = source.UnreadTensors();
  if (!unread.empty()) {
    VAMP_LOG(WARNING) << "checkpoint has " << unread.size() << " tensors the model does not use, "
                      << "e.g. "
                      << absl::StrJoin(unread.begin(),
                                       unread.begin() + std::min<size_t>(unread.size(), 5), ", ");
  }
  return absl::OkStatus();
}

void Qwen3MoeModel::ForEachWeight(
    const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const {
  fn("model.embed_tokens.weight", embed_);
  if (!lm_head_.empty()) fn("lm_head.weight", lm_head_);
  fn("model.norm.weight", final_norm_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    fn(p + "input_layernorm.weight", L.input_norm);
    fn(p + "post_attention_layernorm.weight", L.post_norm);
    fn(p + "self_attn.qkv_proj.weight", L.qkv);
    fn(p + "self_attn.o_proj.weight", L.o_proj);
    fn(p + "self_attn.q_norm.weight", L.q_norm);
    fn(p + "self_attn.k_norm.weight", L.k_norm);
    if (L.moe) {
      fn(p + "mlp.gate.weight", L.router);
    } else {
      fn(p + "mlp.gate_up_proj.weight", L.mlp_w13);
      fn(p + "mlp.down_proj.weight", L.mlp_w2);
    }
  }
}

absl::Status Qwen3MoeModel::Forward(const ForwardBatch& batch, const KvCacheView& kv,
                                    ExpertWeights* experts, Communicator* comm, float* logits) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens(), H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (n == 0) return absl::OkStatus();
  if (parallel_.tp_size > 1 && comm == nullptr) {
    return absl::FailedPreconditionError("tensor parallel forward pass without a communicator");
  }
  if (!moe_layers_.empty() && experts == nullptr) {
    return absl::FailedPreconditionError("MoE forward pass without expert weights");
  }
  if (static_cast<int64_t>(kv.k.size()) < c.num_hidden_layers ||
      static_cast<int64_t>(kv.v.size()) < c.num_hidden_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV cache view covers ", kv.k.size(), " layers; the model has ", c.num_hidden_layers));
  }
  if (kv.dtype != DType::kFloat32 || expert_layout_.dtype != DType::kFloat32) {
    return absl::FailedPreconditionError("the CPU engine stores KV and experts in float32");
  }
  float* x = GrowScratch(hidden_, n * H);
  float* res = GrowScratch(residual_, n * H);
  const RoutedExpertsShape routed_shape{H, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob,
                                        expert_layout_.inter};
  k::GatherRows(embed_.data(), H, batch.token_ids.data(), n, H, res, H);

  if (experts != nullptr) VAMP_RETURN_IF_ERROR(experts->BeginPass());
  absl::Status status;
  for (int l = 0; l < c.num_hidden_layers && status.ok(); ++l) {
    const Layer& L = layers_[l];
    // The first layer normalises the embedding (residual = embedding); later layers add the
    // previous MLP output to the residual stream first.
    if (l == 0) {
      k::RmsNorm(res, H, L.input_norm.data(), eps, n, H, x, H);
    } else {
      k::FusedAddRmsNorm(x, H, res, H, L.input_norm.data(), eps, n, H);
    }
    status = Attention(l, batch, kv);
    if (status.ok() && comm != nullptr && parallel_.tp_size > 1)
      status = comm->AllReduceSum(x, n * H);
    if (!status.ok()) break;
    k::FusedAddRmsNorm(x, H, res, H, L.post_norm.data(), eps, n, H);
    if (L.moe) {
      status = feed_forward_.Routed(l, L.router.data(), routed_shape, x, n, experts, x);
    } else {
      feed_forward_.Dense(L.mlp_w13.data(), L.mlp_w2.data(), H, dense_inter_, x, n, x);
    }
    if (status.ok() && comm != nullptr && parallel_.tp_size > 1)
      status = comm->AllReduceSum(x, n * H);
  }
  if (experts != nullptr) {
    const absl::Status end = experts->EndPass();
    if (status.ok()) status = end;
  }
  VAMP_RETURN_IF_ERROR(status);

  // Final norm and LM head, only for the requested rows.
  const int64_t m = static_cast<int64_t>(batch.logits_indices.size());
  if (m == 0) return absl::OkStatus();
  float* sx = GrowScratch(sel_hidden_, m * H);
  float* sr = GrowScratch(sel_residual_, m * H);
  k::GatherRows(x, H, batch.logits_indices.data(), m, H, sx, H);
  k::GatherRows(res, H, batch.logits_indices.data(), m, H, sr, H);
  k::FusedAddRmsNorm(sx, H, sr, H, final_norm_.data(), eps, m, H);
  const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  k::Gemm(sx, H, head, H, logits, c.vocab_size, m, c.vocab_size, H);
  return absl::OkStatus();
}

absl::Status Qwen3MoeModel::Attention(int layer, const ForwardBatch& batch, const KvCacheView& kv) {
  const ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int64_t n = batch.num_tokens(), H = c.hidden_size, hd = c.head_dim;
  const int64_t q_cols = q_heads_ * hd, kv_cols = kv_heads_ * hd;
  const int64_t qkv_cols = q_cols + 2 * kv_cols;
  float* qkv = GrowScratch(qkv_buf_, n * qkv_cols);
  k::Gemm(hidden_.data(), H, L.qkv.data(), H, qkv, qkv_cols, n, qkv_cols, H);
  float* q = qkv;
  float* kk = qkv + q_cols;
  float* v = qkv + q_cols + kv_cols;
  k::QkNormRope(q, qkv_cols, kk, qkv_cols, n, q_heads_, kv_heads_, hd, L.q_norm.data(),
                L.k_norm.data(), static_cast<float>(c.rms_norm_eps), batch.positions.data(),
                rope_cache_.data(), c.max_position_embeddings);
  auto* k_cache = static_cast<float*>(kv.k[layer]);
  auto* v_cache = static_cast<float*>(kv.v[layer]);
  if (k_cache == nullptr || v_cache == nullptr) {
    return absl::InternalError(absl::StrCat("no KV cache for attention layer ", layer));
  }
  k::WriteKv(kk, qkv_cols, v, qkv_cols, batch.slot_mapping.data(), n, kv_heads_, hd, k_cache,
             v_cache, kv.strides, kv.block_size);
  float* out = GrowScratch(attn_out_, n * q_cols);
  BatchPagedAttention(q, qkv_cols, k_cache, v_cache, kv, batch, {q_heads_, kv_heads_, hd}, out,
                      q_cols, attn_ws_);
  // o_proj of this rank's heads: a partial sum over heads when tensor parallel.
  k::Gemm(out, q_cols, L.o_proj.data(), q_cols, hidden_.data(), H, n, H, q_cols);
  return absl::OkStatus();
}

}  // namespace vamp
