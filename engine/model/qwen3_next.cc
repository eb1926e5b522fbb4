#include "engine/model/qwen3_next.h"

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
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/gating.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace vamp {
namespace {

namespace k = kernels::cpu;

// An RMSNorm1p weight (HF Qwen3NextRMSNorm: the norm multiplies by 1 + w), stored as applied.
absl::Status ReadNorm1p(WeightSource& source, const std::string& name, int64_t dim,
                        std::vector<float>* out) {
  VAMP_RETURN_IF_ERROR(ReadFull(source, name, {dim}, out));
  for (float& w : *out) w = 1.0f + w;
  return absl::OkStatus();
}

// Reads rows [begin, begin + count) of the 2-D tensor `name` [rows, cols] into `out`.
absl::Status ReadRowRange(WeightSource& source, const std::string& name, int64_t rows, int64_t cols,
                          int64_t begin, int64_t count, float* out) {
  return ReadRows(source, name, rows, cols, begin, begin + count, out);
}

}  // namespace

Qwen3NextModel::Qwen3NextModel(const ModelConfig& config, const ParallelConfig& parallel)
    : config_(config), parallel_(parallel) {}

absl::StatusOr<std::unique_ptr<Qwen3NextModel>> Qwen3NextModel::Load(const ModelConfig& config,
                                                                     const ParallelConfig& parallel,
                                                                     WeightSource& source,
                                                                     ExpertWeightSink& experts) {
  const int tp = parallel.tp_size;
  if (tp < 1 || parallel.tp_rank < 0 || parallel.tp_rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", parallel.tp_rank, " of size ", tp, " is invalid"));
  }
  if (config.architecture != Architecture::kQwen3Next) {
    return absl::InvalidArgumentError(
        absl::StrCat("Qwen3NextModel runs qwen3_next, not '", config.model_type, "'"));
  }
  auto indivisible = [&](absl::string_view field, int64_t value) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", field, "' (", value,
                                                   ") is not divisible by the tensor parallel "
                                                   "size ",
                                                   tp));
  };
  const ModelConfig& c = config;
  bool any_linear = false, any_full = false, any_dense = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    (c.IsFullAttentionLayer(l) ? any_full : any_linear) = true;
    any_dense |= !c.IsMoeLayer(l);
  }
  if (any_full && c.num_attention_heads % tp != 0) {
    return indivisible("num_attention_heads", c.num_attention_heads);
  }
  const int64_t kvh = c.num_key_value_heads;
  if (any_full && (kvh >= tp ? kvh % tp != 0 : tp % kvh != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'num_key_value_heads' (", kvh,
                                                   ") and the tensor parallel size ", tp,
                                                   " must divide one another"));
  }
  if (any_linear && c.linear_num_key_heads % tp != 0) {
    return indivisible("linear_num_key_heads", c.linear_num_key_heads);
  }
  if (c.moe_intermediate_size % tp != 0) {
    return indivisible("moe_intermediate_size", c.moe_intermediate_size);
  }
  if (c.shared_expert_intermediate_size % tp != 0) {
    return indivisible("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  }
  if (any_dense && c.intermediate_size % tp != 0) {
    return indivisible("intermediate_size", c.intermediate_size);
  }

  std::unique_ptr<Qwen3NextModel> m(new Qwen3NextModel(config, parallel));
  const int r = parallel.tp_rank;
  m->q_heads_ = c.num_attention_heads / tp;
  m->first_q_head_ = r * m->q_heads_;
  if (kvh >= tp) {
    m->kv_heads_ = kvh / tp;
    m->first_kv_head_ = r * m->kv_heads_;
  } else {
    // Each KV head is replicated on tp / kvh consecutive ranks, matching their q heads.
    m->kv_heads_ = 1;
    m->first_kv_head_ = r * kvh / tp;
  }
  if (any_linear) {
    m->k_heads_ = c.linear_num_key_heads / tp;
    m->v_heads_ = c.linear_num_value_heads / tp;
    m->first_k_head_ = r * m->k_heads_;
    m->first_v_head_ = r * m->v_heads_;
    m->key_dim_ = m->k_heads_ * c.linear_key_head_dim;
    m->value_dim_ = m->v_heads_ * c.linear_value_head_dim;
    m->conv_dim_ = 2 * m->key_dim_ + m->value_dim_;
    m->zero_row_.assign(m->conv_dim_, 0.0f);
  }
  m->dense_inter_ = any_dense ? c.intermediate_size / tp : 0;
  m->shared_inter_ = c.shared_expert_intermediate_size / tp;
  m->expert_layout_ = {c.hidden_size, c.moe_intermediate_size / tp};
  m->layers_.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = m->layers_[l];
    L.full_attention = c.IsFullAttentionLayer(l);
    L.moe = c.IsMoeLayer(l);
    if (L.full_attention) m->attention_layers_.push_back(l);
    if (L.moe) m->moe_layers_.push_back(l);
    if (!L.full_attention) {
      L.state_offset = m->slot_floats_;
      m->slot_floats_ += (c.linear_conv_kernel_dim - 1) * m->conv_dim_ +
                         m->v_heads_ * c.linear_value_head_dim * c.linear_key_head_dim;
    }
  }
  VAMP_RETURN_IF_ERROR(m->LoadWeights(source, experts));
  if (any_full) {
    m->rope_cache_.resize(c.max_position_embeddings * c.rotary_dim);
    k::BuildRopeCache(static_cast<float>(c.rope_theta), c.rotary_dim, c.max_position_embeddings,
                      m->rope_cache_.data());
  }
  return m;
}

absl::Status Qwen3NextModel::LoadWeights(WeightSource& source, ExpertWeightSink& experts) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  VAMP_RETURN_IF_ERROR(ReadFull(source, "model.embed_tokens.weight", {V, H}, &embed_));
  if (!c.tie_word_embeddings) {
    VAMP_RETURN_IF_ERROR(ReadFull(source, "lm_head.weight", {V, H}, &lm_head_));
  }
  VAMP_RETURN_IF_ERROR(ReadNorm1p(source, "model.norm.weight", H, &final_norm_));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    VAMP_RETURN_IF_ERROR(ReadNorm1p(source, p + "input_layernorm.weight", H, &L.input_norm));
    VAMP_RETURN_IF_ERROR(
        ReadNorm1p(source, p + "post_attention_layernorm.weight", H, &L.post_norm));
    VAMP_RETURN_IF_ERROR(L.full_attention ? LoadFullAttention(l, source, L)
                                          : LoadLinearAttention(l, source, L));
    VAMP_RETURN_IF_ERROR(LoadMlp(l, source, experts, L));
  }
  std::vector<std::string> unread = source.UnreadTensors();
  const auto mtp = std::partition(unread.begin(), unread.end(), [](const std::string& name) {
    return name.rfind("mtp.", 0) != 0;
  });
  if (mtp != unread.end()) {
    VAMP_LOG(INFO) << "ignoring " << (unread.end() - mtp)
                   << " multi-token-prediction tensors (mtp.*): the engine does not use them";
    unread.erase(mtp, unread.end());
  }
  if (!unread.empty()) {
    VAMP_LOG(WARNING) << "checkpoint has " << unread.size() << " tensors the model does not use, "
                      << "e.g. "
                      << absl::StrJoin(unread.begin(),
                                       unread.begin() + std::min<size_t>(unread.size(), 5), ", ");
  }
  return absl::OkStatus();
}

absl::Status Qwen3NextModel::LoadFullAttention(int layer, WeightSource& source, Layer& L) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const std::string p = absl::StrCat("model.layers.", layer, ".self_attn.");
  VAMP_RETURN_IF_ERROR(ReadNorm1p(source, p + "q_norm.weight", hd, &L.q_norm));
  VAMP_RETURN_IF_ERROR(ReadNorm1p(source, p + "k_norm.weight", hd, &L.k_norm));
  // q_proj holds, per head, its query rows then its gate rows ([heads * 2 * hd, H]); they are
  // split here into all query heads, then all gate heads, then k and v.
  const int64_t q_rows = q_heads_ * hd, kv_rows = kv_heads_ * hd;
  const int64_t q_total = c.num_attention_heads * 2 * hd, kv_total = c.num_key_value_heads * hd;
  L.qkv.resize((2 * q_rows + 2 * kv_rows) * H);
  for (int64_t i = 0; i < q_heads_; ++i) {
    const int64_t head = first_q_head_ + i;
    VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "q_proj.weight", q_total, H, head * 2 * hd, hd,
                                      L.qkv.data() + i * hd * H));
    VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "q_proj.weight", q_total, H, head * 2 * hd + hd,
                                      hd, L.qkv.data() + (q_rows + i * hd) * H));
  }
  VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "k_proj.weight", kv_total, H, first_kv_head_ * hd,
                                    kv_rows, L.qkv.data() + 2 * q_rows * H));
  VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "v_proj.weight", kv_total, H, first_kv_head_ * hd,
                                    kv_rows, L.qkv.data() + (2 * q_rows + kv_rows) * H));
  L.o_proj.resize(H * q_rows);
  return ReadCols(source, p + "o_proj.weight", H, c.num_attention_heads * hd, first_q_head_ * hd,
                  first_q_head_ * hd + q_rows, L.o_proj.data());
}

absl::Status Qwen3NextModel::LoadLinearAttention(int layer, WeightSource& source, Layer& L) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t K = c.linear_conv_kernel_dim;
  const int64_t group = c.linear_num_value_heads / c.linear_num_key_heads;  // value heads per key
  const int64_t key_total = c.linear_num_key_heads * dk;
  const int64_t value_total = c.linear_num_value_heads * dv;
  const std::string p = absl::StrCat("model.layers.", layer, ".linear_attn.");

  // in_proj_qkvz is grouped per key head: [q (dk) | k (dk) | v (group * dv) | z (group * dv)];
  // in_proj_ba per key head: [b (group) | a (group)]. The rows are regrouped into one matrix
  // [q of every key head | k | v of every value head | z | b | a].
  const int64_t W = conv_dim_ + value_dim_ + 2 * v_heads_;
  L.in_proj.resize(W * H);
  const int64_t qkvz_rows = 2 * key_total + 2 * value_total, qkvz_group = 2 * dk + 2 * group * dv;
  float* const dst = L.in_proj.data();
  for (int64_t i = 0; i < k_heads_; ++i) {
    const int64_t base = (first_k_head_ + i) * qkvz_group;
    const std::string name = p + "in_proj_qkvz.weight";
    const struct {
      int64_t src, count, dst_row;
    } parts[] = {
        {base, dk, i * dk},
        {base + dk, dk, key_dim_ + i * dk},
        {base + 2 * dk, group * dv, 2 * key_dim_ + i * group * dv},
        {base + 2 * dk + group * dv, group * dv, conv_dim_ + i * group * dv},
    };
    for (const auto& part : parts) {
      VAMP_RETURN_IF_ERROR(
          ReadRowRange(source, name, qkvz_rows, H, part.src, part.count, dst + part.dst_row * H));
    }
    const int64_t ba_base = (first_k_head_ + i) * 2 * group;
    const int64_t b_row = conv_dim_ + value_dim_ + i * group;
    VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "in_proj_ba.weight", 2 * c.linear_num_value_heads,
                                      H, ba_base, group, dst + b_row * H));
    VAMP_RETURN_IF_ERROR(ReadRowRange(source, p + "in_proj_ba.weight", 2 * c.linear_num_value_heads,
                                      H, ba_base + group, group, dst + (b_row + v_heads_) * H));
  }

  // conv1d.weight [conv channels, 1, K]; channels are [q of every key head | k | v].
  L.conv.resize(conv_dim_ * K);
  const int64_t conv_shape[] = {2 * key_total + value_total, 1, K};
  const struct {
    int64_t src, count, dst_row;
  } conv_parts[] = {
      {first_k_head_ * dk, key_dim_, 0},
      {key_total + first_k_head_ * dk, key_dim_, key_dim_},
      {2 * key_total + first_v_head_ * dv, value_dim_, 2 * key_dim_},
  };
  for (const auto& part : conv_parts) {
    const DimRange ranges[] = {{part.src, part.src + part.count}, {0, 1}, {0, K}};
    VAMP_RETURN_IF_ERROR(
        source.Read(p + "conv1d.weight", conv_shape, ranges, L.conv.data() + part.dst_row * K));
  }

  const int64_t head_shape[] = {c.linear_num_value_heads};
  const DimRange head_range[] = {{first_v_head_, first_v_head_ + v_heads_}};
  L.a_log.resize(v_heads_);
  L.dt_bias.resize(v_heads_);
  VAMP_RETURN_IF_ERROR(source.Read(p + "A_log", head_shape, head_range, L.a_log.data()));
  VAMP_RETURN_IF_ERROR(source.Read(p + "dt_bias", head_shape, head_range, L.dt_bias.data()));
  VAMP_RETURN_IF_ERROR(ReadFull(source, p + "norm.weight", {dv}, &L.gated_norm));
  L.out_proj.resize(H * value_dim_);
  return ReadCols(source, p + "out_proj.weight", H, value_total, first_v_head_ * dv,
                  first_v_head_ * dv + value_dim_, L.out_proj.data());
}

absl::Status Qwen3NextModel::LoadMlp(int layer, WeightSource& source, ExpertWeightSink& experts,
                                     Layer& L) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, r = parallel_.tp_rank;
  const std::string p = absl::StrCat("model.layers.", layer, ".mlp.");
  // gate_proj, up_proj ([width, H]) and down_proj ([H, width]) under `prefix`: this rank's slice.
  auto dense = [&](const std::string& prefix, int64_t width, int64_t local, std::vector<float>* w13,
                   std::vector<float>* w2) -> absl::Status {
    w13->resize(2 * local * H);
    w2->resize(H * local);
    VAMP_RETURN_IF_ERROR(ReadRows(source, prefix + "gate_proj.weight", width, H, r * local,
                                  (r + 1) * local, w13->data()));
    VAMP_RETURN_IF_ERROR(ReadRows(source, prefix + "up_proj.weight", width, H, r * local,
                                  (r + 1) * local, w13->data() + local * H));
    return ReadCols(source, prefix + "down_proj.weight", H, width, r * local, (r + 1) * local,
                    w2->data());
  };
  if (!L.moe) return dense(p, c.intermediate_size, dense_inter_, &L.mlp_w13, &L.mlp_w2);
  VAMP_RETURN_IF_ERROR(ReadFull(source, p + "gate.weight", {c.num_experts, H}, &L.router));
  VAMP_RETURN_IF_ERROR(LoadRoutedExperts(source, layer, c.num_experts, c.moe_intermediate_size,
                                         expert_layout_, parallel_.tp_rank, experts));
  if (c.shared_expert_intermediate_size == 0) return absl::OkStatus();
  VAMP_RETURN_IF_ERROR(dense(p + "shared_expert.", c.shared_expert_intermediate_size, shared_inter_,
                             &L.shared_w13, &L.shared_w2));
  return ReadFull(source, p + "shared_expert_gate.weight", {1, H}, &L.shared_gate);
}

absl::Status Qwen3NextModel::ReserveRecurrentStates(int64_t num_slots) {
  VAMP_RETURN_IF_ERROR(
      slots_.Reserve(num_slots, slot_floats_ * static_cast<int64_t>(sizeof(float))));
  states_.assign(static_cast<size_t>(num_slots * slot_floats_), 0.0f);
  return absl::OkStatus();
}

absl::Status Qwen3NextModel::RestoreRecurrentState(int32_t slot, const StateSnapshotView& from,
                                                   int64_t num_tokens) {
  VAMP_RETURN_IF_ERROR(slots_.CheckRestore(slot, from, num_tokens));
  from.Read(0, states_.data() + static_cast<int64_t>(slot) * slot_floats_, slot_floats_);
  slots_.MarkRestored(slot, num_tokens);
  return absl::OkStatus();
}

void Qwen3NextModel::ForEachWeight(
    const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const {
  fn("model.embed_tokens.weight", embed_);
  if (!lm_head_.empty()) fn("lm_head.weight", lm_head_);
  fn("model.norm.weight", final_norm_);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    fn(p + "input_layernorm.weight", L.input_norm);
    fn(p + "post_attention_layernorm.weight", L.post_norm);
    if (L.full_attention) {
      fn(p + "self_attn.qkv_proj.weight", L.qkv);
      fn(p + "self_attn.o_proj.weight", L.o_proj);
      fn(p + "self_attn.q_norm.weight", L.q_norm);
      fn(p + "self_attn.k_norm.weight", L.k_norm);
    } else {
      fn(p + "linear_attn.in_proj.weight", L.in_proj);
      fn(p + "linear_attn.conv1d.weight", L.conv);
      fn(p + "linear_attn.A_log", L.a_log);
      fn(p + "linear_attn.dt_bias", L.dt_bias);
      fn(p + "linear_attn.norm.weight", L.gated_norm);
      fn(p + "linear_attn.out_proj.weight", L.out_proj);
    }
    if (L.moe) {
      fn(p + "mlp.gate.weight", L.router);
      if (!L.shared_gate.empty()) {
        fn(p + "mlp.shared_expert.gate_up_proj.weight", L.shared_w13);
        fn(p + "mlp.shared_expert.down_proj.weight", L.shared_w2);
        fn(p + "mlp.shared_expert_gate.weight", L.shared_gate);
      }
    } else {
      fn(p + "mlp.gate_up_proj.weight", L.mlp_w13);
      fn(p + "mlp.down_proj.weight", L.mlp_w2);
    }
  }
}

void Qwen3NextModel::CaptureConvState(int layer, const ForwardBatch& batch, int64_t seq,
                                      int64_t after, const float* proj, const float* history,
                                      const StateSnapshotView& to) {
  const Layer& L = layers_[layer];
  const int64_t hist = config_.linear_conv_kernel_dim - 1;
  const int64_t W = conv_dim_ + value_dim_ + 2 * v_heads_;
  const int64_t begin = batch.query_start_loc[seq];
  for (int64_t row = 0; row < hist; ++row) {
    // Input `r` of the step (r < 0: before it), as CausalConv1d numbers them.
    const int64_t r = after - hist + row;
    const int64_t offset = L.state_offset + row * conv_dim_;
    if (r >= 0) {
      to.Write(offset, proj + (begin + r) * W, conv_dim_);
    } else if (plan_.has_initial_state[seq] != 0) {
      to.Write(offset, history + (hist + r) * conv_dim_, conv_dim_);
    } else {
      to.Write(offset, zero_row_.data(), conv_dim_);
    }
  }
}

absl::Status Qwen3NextModel::DeltaRuleRun(k::GatedDeltaRuleArgs& args, int32_t begin, int32_t end,
                                          uint8_t has_initial) {
  const int32_t range[2] = {begin, end};
  args.query_start_loc = range;
  args.has_initial_state = &has_initial;
  return end - begin == 1 ? k::GatedDeltaRuleRecurrent(args)
                          : k::GatedDeltaRuleChunked(args, kDeltaRuleChunkSize);
}

absl::Status Qwen3NextModel::Forward(const ForwardBatch& batch, const KvCacheView& kv,
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
  const bool recurrent = slot_floats_ > 0;
  if (recurrent) VAMP_RETURN_IF_ERROR(slots_.PrepareStep(batch, plan_));

  float* x = GrowScratch(hidden_, n * H);
  float* res = GrowScratch(residual_, n * H);
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
    status = L.full_attention ? FullAttention(l, batch, kv) : LinearAttention(l, batch);
    if (status.ok() && comm != nullptr && parallel_.tp_size > 1)
      status = comm->AllReduceSum(x, n * H);
    if (!status.ok()) break;
    k::FusedAddRmsNorm(x, H, res, H, L.post_norm.data(), eps, n, H);
    status = Mlp(l, n, experts);
    if (status.ok() && comm != nullptr && parallel_.tp_size > 1)
      status = comm->AllReduceSum(x, n * H);
  }
  if (experts != nullptr) {
    const absl::Status end = experts->EndPass();
    if (status.ok()) status = end;
  }
  // The states advanced to the end of the step, or (after a failure) to no known context.
  if (recurrent) slots_.FinishStep(batch, status.ok());
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

absl::Status Qwen3NextModel::FullAttention(int layer, const ForwardBatch& batch,
                                           const KvCacheView& kv) {
  const ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int64_t n = batch.num_tokens(), H = c.hidden_size, hd = c.head_dim;
  const int64_t q_cols = q_heads_ * hd, kv_cols = kv_heads_ * hd;
  const int64_t W = 2 * q_cols + 2 * kv_cols;
  auto* k_cache = static_cast<float*>(kv.k[layer]);
  auto* v_cache = static_cast<float*>(kv.v[layer]);
  if (k_cache == nullptr || v_cache == nullptr) {
    return absl::InternalError(absl::StrCat("no KV cache for attention layer ", layer));
  }
  float* qkv = GrowScratch(proj_, n * W);
  k::Gemm(hidden_.data(), H, L.qkv.data(), H, qkv, W, n, W, H);
  float* q = qkv;
  const float* gate = qkv + q_cols;
  float* kk = qkv + 2 * q_cols;
  float* v = kk + kv_cols;
  k::QkNormPartialRope(q, W, kk, W, n, q_heads_, kv_heads_, hd, c.rotary_dim, L.q_norm.data(),
                       L.k_norm.data(), static_cast<float>(c.rms_norm_eps), batch.positions.data(),
                       rope_cache_.data(), c.max_position_embeddings);
  k::WriteKv(kk, W, v, W, batch.slot_mapping.data(), n, kv_heads_, hd, k_cache, v_cache, kv.strides,
             kv.block_size);
  float* out = GrowScratch(mixer_out_, n * q_cols);
  BatchPagedAttention(q, W, k_cache, v_cache, kv, batch, {q_heads_, kv_heads_, hd}, out, q_cols,
                      attn_ws_);
  k::SigmoidGate(out, q_cols, gate, W, n, q_cols);
  // o_proj of this rank's heads: a partial sum over heads when tensor parallel.
  k::Gemm(out, q_cols, L.o_proj.data(), q_cols, hidden_.data(), H, n, H, q_cols);
  return absl::OkStatus();
}

absl::Status Qwen3NextModel::LinearAttention(int layer, const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int64_t n = batch.num_tokens(), H = c.hidden_size;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t K = c.linear_conv_kernel_dim;
  const int64_t W = conv_dim_ + value_dim_ + 2 * v_heads_;
  float* proj = GrowScratch(proj_, n * W);
  k::Gemm(hidden_.data(), H, L.in_proj.data(), H, proj, W, n, W, H);

  float* const slot_states = states_.data() + L.state_offset;
  const int64_t hist = K - 1;
  const int64_t history_floats = hist * conv_dim_;
  // A capture within a sequence's first K - 1 tokens reads conv inputs from before the step, which
  // the conv is about to overwrite in the slot.
  float* history = GrowScratch(conv_history_, batch.state_captures.size() * history_floats);
  for (size_t c = 0; c < batch.state_captures.size(); ++c) {
    const StateCapture& capture = batch.state_captures[c];
    if (capture.after_tokens < hist && plan_.has_initial_state[capture.seq] != 0) {
      std::copy_n(slot_states + batch.state_slots[capture.seq] * slot_floats_, history_floats,
                  history + c * history_floats);
    }
  }
  float* conv_out = GrowScratch(conv_out_, n * conv_dim_);
  VAMP_RETURN_IF_ERROR(k::CausalConv1d({.x = proj,
                                        .x_stride = W,
                                        .weight = L.conv.data(),
                                        .channels = conv_dim_,
                                        .kernel_size = K,
                                        .query_start_loc = batch.query_start_loc.data(),
                                        .num_seqs = batch.num_seqs(),
                                        .max_num_tokens = n,
                                        .state_slots = batch.state_slots.data(),
                                        .has_initial_state = plan_.has_initial_state.data(),
                                        .conv_states = slot_states,
                                        .state_slot_stride = slot_floats_,
                                        .silu = true,
                                        .out = conv_out,
                                        .out_stride = conv_dim_}));
  for (size_t c = 0; c < batch.state_captures.size(); ++c) {
    const StateCapture& capture = batch.state_captures[c];
    CaptureConvState(layer, batch, capture.seq, capture.after_tokens, proj,
                     history + c * history_floats, capture.to);
  }

  float* g = GrowScratch(gates_, 2 * n * v_heads_);
  float* beta = g + n * v_heads_;
  const float* b_proj = proj + conv_dim_ + value_dim_;
  k::GatedDeltaGates(b_proj + v_heads_, W, b_proj, W, L.a_log.data(), L.dt_bias.data(), n, v_heads_,
                     g, v_heads_, beta, v_heads_);

  float* core = GrowScratch(mixer_out_, n * value_dim_);
  const int64_t ws_floats = k::GatedDeltaRuleWorkspaceFloats(kDeltaRuleChunkSize, dk, dv);
  float* ws = GrowScratch(attn_ws_, ws_floats);
  k::GatedDeltaRuleArgs args{.q = conv_out,
                             .q_stride = conv_dim_,
                             .k = conv_out + key_dim_,
                             .k_stride = conv_dim_,
                             .v = conv_out + 2 * key_dim_,
                             .v_stride = conv_dim_,
                             .g = g,
                             .g_stride = v_heads_,
                             .beta = beta,
                             .beta_stride = v_heads_,
                             .num_k_heads = k_heads_,
                             .num_v_heads = v_heads_,
                             .k_dim = dk,
                             .v_dim = dv,
                             .l2norm_qk = true,
                             .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk))),
                             .num_seqs = 1,
                             .states = slot_states + (K - 1) * conv_dim_,
                             .state_slot_stride = slot_floats_,
                             .out = core,
                             .out_stride = value_dim_,
                             .workspace = ws,
                             .workspace_floats = ws_floats};
  // One sequence at a time, each through the form its step length calls for (see the header); a
  // sequence with a capture in two runs, split at the capture.
  const int64_t delta_offset = hist * conv_dim_;
  const int64_t delta_floats = v_heads_ * dv * dk;
  for (int64_t i = 0; i < batch.num_seqs(); ++i) {
    const int32_t begin = batch.query_start_loc[i], end = batch.query_start_loc[i + 1];
    if (end == begin) continue;
    args.state_slots = batch.state_slots.data() + i;
    const int32_t c = plan_.capture_of_seq[i];
    if (c < 0) {
      VAMP_RETURN_IF_ERROR(DeltaRuleRun(args, begin, end, plan_.has_initial_state[i]));
      continue;
    }
    const StateCapture& capture = batch.state_captures[c];
    const int32_t split = begin + capture.after_tokens;
    VAMP_RETURN_IF_ERROR(DeltaRuleRun(args, begin, split, plan_.has_initial_state[i]));
    capture.to.Write(L.state_offset + delta_offset,
                     args.states + batch.state_slots[i] * slot_floats_, delta_floats);
    if (split < end) VAMP_RETURN_IF_ERROR(DeltaRuleRun(args, split, end, 1));
  }
  // The gated norm per value head of each token (z follows the conv channels in proj).
  k::RmsNormGated(core, value_dim_, proj + conv_dim_, W, L.gated_norm.data(),
                  static_cast<float>(c.rms_norm_eps), n, v_heads_, dv, core, value_dim_);
  // out_proj of this rank's value heads: a partial sum when tensor parallel.
  k::Gemm(core, value_dim_, L.out_proj.data(), value_dim_, hidden_.data(), H, n, H, value_dim_);
  return absl::OkStatus();
}

absl::Status Qwen3NextModel::Mlp(int layer, int64_t n, ExpertWeights* experts) {
  const ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int64_t H = c.hidden_size;
  float* x = hidden_.data();
  if (!L.moe) {
    feed_forward_.Dense(L.mlp_w13.data(), L.mlp_w2.data(), H, dense_inter_, x, n, x);
    return absl::OkStatus();
  }
  // The shared expert reads x before the routed experts overwrite it.
  const bool shared = !L.shared_gate.empty();
  float* shared_out = nullptr;
  float* shared_logit = nullptr;
  if (shared) {
    shared_out = GrowScratch(shared_out_, n * H);
    feed_forward_.Dense(L.shared_w13.data(), L.shared_w2.data(), H, shared_inter_, x, n,
                        shared_out);
    shared_logit = GrowScratch(shared_logit_, n);
    k::Gemm(x, H, L.shared_gate.data(), H, shared_logit, 1, n, 1, H);
  }
  const RoutedExpertsShape routed{H, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob,
                                  expert_layout_.inter};
  VAMP_RETURN_IF_ERROR(feed_forward_.Routed(layer, L.router.data(), routed, x, n, experts, x));
  if (shared) k::AddSigmoidScaled(x, H, shared_out, H, shared_logit, 1, n, H);
  return absl::OkStatus();
}

}  // namespace vamp
