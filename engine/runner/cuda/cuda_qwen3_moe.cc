#include "engine/runner/cuda/cuda_qwen3_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/integer_math.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "engine/runner/cuda/device_carver.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gating.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;
using kernels::BFloat16;

template <typename T>
T* As(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* As(const void* p) {
  return static_cast<const T*>(p);
}

template <typename T>
constexpr DType DTypeOf() {
  return std::is_same_v<T, BFloat16> ? DType::kBFloat16 : DType::kFloat32;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaQwen3MoeModel>> CudaQwen3MoeModel::Create(
    const CausalLm* host_model, const RunnerConfig& runner_config, cudaStream_t stream,
    CudaForwardOptions options) {
  if (host_model == nullptr) return absl::InvalidArgumentError("CudaQwen3MoeModel needs a model");
  const ModelConfig& c = host_model->config();
  if (c.architecture != Architecture::kQwen3Moe && c.architecture != Architecture::kQwen3Next) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaQwen3MoeModel runs qwen3_moe and qwen3_next, not '", c.model_type, "'"));
  }
  if (c.head_dim > kc::kMaxAttentionHeadDim || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'head_dim' (", c.head_dim,
                                                   ") must be even and at most ",
                                                   kc::kMaxAttentionHeadDim, " on the GPU"));
  }
  if (runner_config.block_size < 1 || runner_config.max_num_seqs < 1 ||
      runner_config.max_num_batched_tokens < 1 || runner_config.max_model_len < 0 ||
      options.max_logits_rows < 0) {
    return absl::InvalidArgumentError(
        "runner config fields block_size, max_num_seqs and max_num_batched_tokens must be >= 1, "
        "max_model_len and max_logits_rows >= 0");
  }
  const ParallelConfig& p = host_model->parallel();
  if (p.tp_size > 1) {
    if (options.all_reduce == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel size ", p.tp_size, " needs a device all-reduce (options.all_reduce)"));
    }
    if (options.all_reduce->size() != p.tp_size || options.all_reduce->rank() != p.tp_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the all-reduce group is rank ", options.all_reduce->rank(), " of ",
          options.all_reduce->size(), "; the model shard is rank ", p.tp_rank, " of ", p.tp_size));
    }
  }
  std::unique_ptr<CudaQwen3MoeModel> m(
      new CudaQwen3MoeModel(host_model, runner_config, stream, options));
  VAMP_RETURN_IF_ERROR(m->UploadWeights());
  VAMP_RETURN_IF_ERROR(m->AllocateWorkspace());
  const bool any_linear = std::any_of(m->layers_.begin(), m->layers_.end(),
                                      [](const Layer& l) { return !l.full_attention; });
  if (any_linear) {
    VAMP_ASSIGN_OR_RETURN(
        m->delta_net_,
        CudaGatedDeltaNet::Create(m->delta_shape_, host_model->RecurrentStateFloatsPerSlot(),
                                  m->max_tokens_, m->max_seqs_, options.dtype, stream));
  }
  return m;
}

CudaQwen3MoeModel::CudaQwen3MoeModel(const CausalLm* host, const RunnerConfig& runner_config,
                                     cudaStream_t stream, CudaForwardOptions options)
    : host_(host), runner_config_(runner_config), stream_(stream), options_(options) {
  const ModelConfig& c = host->config();
  if (runner_config_.max_model_len == 0) runner_config_.max_model_len = c.max_position_embeddings;
  max_tokens_ = runner_config_.max_num_batched_tokens;
  max_seqs_ = runner_config_.max_num_seqs;
  max_blocks_per_seq_ = CeilDiv(runner_config_.max_model_len, runner_config_.block_size);
  max_logits_rows_ = options.max_logits_rows > 0 ? options.max_logits_rows : max_seqs_;
  q_heads_ = c.num_attention_heads / host->parallel().tp_size;
  kv_heads_ = host->kv_heads_per_rank();
  dense_inter_ = c.intermediate_size / host->parallel().tp_size;
  shared_inter_ = c.shared_expert_intermediate_size / host->parallel().tp_size;
  gated_attention_ = c.architecture == Architecture::kQwen3Next;
  qkv_cols_ = ((gated_attention_ ? 2 : 1) * q_heads_ + 2 * kv_heads_) * c.head_dim;
  const int tp = host->parallel().tp_size;
  delta_shape_ = {.hidden = c.hidden_size,
                  .k_heads = c.linear_num_key_heads / tp,
                  .v_heads = c.linear_num_value_heads / tp,
                  .k_dim = c.linear_key_head_dim,
                  .v_dim = c.linear_value_head_dim,
                  .conv_kernel = c.linear_conv_kernel_dim,
                  .eps = static_cast<float>(c.rms_norm_eps)};
}

absl::Status CudaQwen3MoeModel::UploadWeights() {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t Il = dense_inter_;
  const int64_t qkv_rows = qkv_cols_;
  const int64_t elem = DTypeBytes(options_.dtype);
  const CudaGatedDeltaNet::Shape& ds = delta_shape_;  // Gated DeltaNet, rank-local
  const int64_t Is = shared_inter_;
  // Every weight the forward pass reads, with its expected size; norms stay float32.
  absl::flat_hash_map<std::string, absl::Span<const float>> host;
  host_->ForEachWeight([&](absl::string_view name, absl::Span<const float> data) {
    host.emplace(std::string(name), data);
  });
  struct Wanted {
    std::string name;
    int64_t elements;
    bool float32;
  };
  std::vector<Wanted> wanted = {{"model.embed_tokens.weight", V * H, false},
                                {"model.norm.weight", H, true}};
  const bool tied = !host.contains("lm_head.weight");
  if (!tied) wanted.push_back({"lm_head.weight", V * H, false});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    wanted.push_back({p + "input_layernorm.weight", H, true});
    wanted.push_back({p + "post_attention_layernorm.weight", H, true});
    if (c.IsFullAttentionLayer(l)) {
      wanted.push_back({p + "self_attn.qkv_proj.weight", qkv_rows * H, false});
      wanted.push_back({p + "self_attn.o_proj.weight", H * q_heads_ * hd, false});
      wanted.push_back({p + "self_attn.q_norm.weight", hd, true});
      wanted.push_back({p + "self_attn.k_norm.weight", hd, true});
    } else {
      wanted.push_back({p + "linear_attn.in_proj.weight", ds.proj_cols() * H, false});
      wanted.push_back({p + "linear_attn.conv1d.weight", ds.conv_dim() * ds.conv_kernel, true});
      wanted.push_back({p + "linear_attn.A_log", ds.v_heads, true});
      wanted.push_back({p + "linear_attn.dt_bias", ds.v_heads, true});
      wanted.push_back({p + "linear_attn.norm.weight", ds.v_dim, true});
      wanted.push_back({p + "linear_attn.out_proj.weight", H * ds.value_dim(), false});
    }
    if (c.IsMoeLayer(l)) {
      wanted.push_back({p + "mlp.gate.weight", c.num_experts * H, false});
      if (host.contains(p + "mlp.shared_expert_gate.weight")) {
        wanted.push_back({p + "mlp.shared_expert.gate_up_proj.weight", 2 * Is * H, false});
        wanted.push_back({p + "mlp.shared_expert.down_proj.weight", H * Is, false});
        wanted.push_back({p + "mlp.shared_expert_gate.weight", H, false});
      }
    } else {
      wanted.push_back({p + "mlp.gate_up_proj.weight", 2 * Il * H, false});
      wanted.push_back({p + "mlp.down_proj.weight", H * Il, false});
    }
  }
  // The rotary embedding turns the first rotary_dim elements of a head (all of them in
  // qwen3_moe).
  std::vector<float> rope(c.max_position_embeddings * c.rotary_dim);
  kernels::cpu::BuildRopeCache(static_cast<float>(c.rope_theta), c.rotary_dim,
                               c.max_position_embeddings, rope.data());

  DeviceCarver sizing(nullptr);
  for (const Wanted& w : wanted) {
    auto it = host.find(w.name);
    if (it == host.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the model has no weight '", w.name, "'"));
    }
    if (static_cast<int64_t>(it->second.size()) != w.elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight '", w.name, "' has ", it->second.size(), " elements, expected ", w.elements));
    }
    sizing.Take<uint8_t>(w.elements * (w.float32 ? 4 : elem));
  }
  sizing.Take<float>(static_cast<int64_t>(rope.size()));
  VAMP_ASSIGN_OR_RETURN(weights_, DeviceBuffer::Allocate(sizing.used()));

  DeviceCarver carve(weights_.data());
  absl::flat_hash_map<std::string, const void*> dev;
  std::vector<BFloat16> rounded;
  // Synchronous copies: the sources are pageable (and `rounded` is reused). The expert store
  // wrote the experts with cudaMemcpy on the legacy stream, which a non-blocking stream does not
  // wait for either: the device is synchronised once at the end.
  auto upload = [&](absl::Span<const float> src, bool float32) -> absl::StatusOr<const void*> {
    const int64_t n = static_cast<int64_t>(src.size());
    if (float32 || options_.dtype == DType::kFloat32) {
      float* dst = carve.Take<float>(n);
      VAMP_CUDART_RETURN_IF_ERROR(
          cudaMemcpy(dst, src.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      return dst;
    }
    BFloat16* dst = carve.Take<BFloat16>(n);
    rounded.resize(src.size());
    kernels::ToBFloat16(src, rounded.data());
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemcpy(dst, rounded.data(), n * sizeof(BFloat16), cudaMemcpyHostToDevice));
    return dst;
  };
  for (const Wanted& w : wanted) {
    VAMP_ASSIGN_OR_RETURN(dev[w.name], upload(host.at(w.name), w.float32));
  }
  VAMP_ASSIGN_OR_RETURN(const void* rope_dev, upload(rope, /*float32=*/true));
  rope_cache_ = As<float>(rope_dev);
  VAMP_CUDART_RETURN_IF_ERROR(cudaDeviceSynchronize());

  embed_ = dev.at("model.embed_tokens.weight");
  lm_head_ = tied ? embed_ : dev.at("lm_head.weight");
  final_norm_ = As<float>(dev.at("model.norm.weight"));
  layers_.resize(c.num_hidden_layers);
  int64_t slot_floats = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Layer& L = layers_[l];
    L.moe = c.IsMoeLayer(l);
    L.full_attention = c.IsFullAttentionLayer(l);
    L.input_norm = As<float>(dev.at(p + "input_layernorm.weight"));
    L.post_norm = As<float>(dev.at(p + "post_attention_layernorm.weight"));
    if (L.full_attention) {
      L.q_norm = As<float>(dev.at(p + "self_attn.q_norm.weight"));
      L.k_norm = As<float>(dev.at(p + "self_attn.k_norm.weight"));
      L.qkv = dev.at(p + "self_attn.qkv_proj.weight");
      L.o_proj = dev.at(p + "self_attn.o_proj.weight");
    } else {
      // The host model's slot layout: each linear-attention layer's conv state then its
      // delta-rule state, layer after layer (checked against the host's slot size below).
      L.linear = {.in_proj = dev.at(p + "linear_attn.in_proj.weight"),
                  .conv = As<float>(dev.at(p + "linear_attn.conv1d.weight")),
                  .a_log = As<float>(dev.at(p + "linear_attn.A_log")),
                  .dt_bias = As<float>(dev.at(p + "linear_attn.dt_bias")),
                  .norm = As<float>(dev.at(p + "linear_attn.norm.weight")),
                  .out_proj = dev.at(p + "linear_attn.out_proj.weight"),
                  .state_offset = slot_floats};
      slot_floats += ds.conv_state_floats() + ds.delta_state_floats();
    }
    if (L.moe) {
      L.router = dev.at(p + "mlp.gate.weight");
      if (auto it = dev.find(p + "mlp.shared_expert_gate.weight"); it != dev.end()) {
        L.shared_gate = it->second;
        L.shared_w13 = dev.at(p + "mlp.shared_expert.gate_up_proj.weight");
        L.shared_w2 = dev.at(p + "mlp.shared_expert.down_proj.weight");
      }
    } else {
      L.mlp_w13 = dev.at(p + "mlp.gate_up_proj.weight");
      L.mlp_w2 = dev.at(p + "mlp.down_proj.weight");
    }
  }
  if (slot_floats != host_->RecurrentStateFloatsPerSlot()) {
    return absl::InternalError(absl::StrCat("the GPU model lays out ", slot_floats,
                                            " floats of recurrent state per sequence, the host "
                                            "model ",
                                            host_->RecurrentStateFloatsPerSlot()));
  }
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::AllocateWorkspace() {
  const ModelConfig& c = config();
  const int64_t T = max_tokens_, S = max_seqs_, L = max_logits_rows_;
  const int64_t H = c.hidden_size, hd = c.head_dim, E = c.num_experts;
  const int64_t top_k = E > 0 ? c.num_experts_per_tok : 0;
  const int64_t R = T * top_k;
  const int64_t Il = expert_layout().inter;
  const int64_t qkv_cols = qkv_cols_;
  const int64_t elem = DTypeBytes(options_.dtype);
  const bool any_dense =
      std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) { return !l.moe; });
  const bool any_shared = std::any_of(layers_.begin(), layers_.end(),
                                      [](const Layer& l) { return l.shared_gate != nullptr; });
  const int64_t mlp_inter = std::max(any_dense ? dense_inter_ : 0, any_shared ? shared_inter_ : 0);
  const int64_t h13 = std::max(R * 2 * Il, T * 2 * mlp_inter);
  const int64_t act = std::max(R * Il, T * mlp_inter);
  attn_ws_floats_ =
      options_.dtype == DType::kBFloat16
          ? kc::PagedAttentionWorkspaceFloats(T, S, q_heads_, hd, runner_config_.max_model_len)
          : 0;

  // Step metadata: the same layout in pinned host memory and on the device.
  DeviceCarver meta(nullptr);
  auto offset = [&meta](auto* type_tag, int64_t n) {
    using Elem = std::remove_pointer_t<decltype(type_tag)>;
    const uint64_t before = meta.used();
    meta.template Take<Elem>(n);
    return before;
  };
  meta_.token_ids = offset(static_cast<int32_t*>(nullptr), T);
  meta_.positions = offset(static_cast<int64_t*>(nullptr), T);
  meta_.slot_mapping = offset(static_cast<int64_t*>(nullptr), T);
  meta_.query_start_loc = offset(static_cast<int32_t*>(nullptr), S + 1);
  meta_.seq_lens = offset(static_cast<int32_t*>(nullptr), S);
  meta_.block_tables = offset(static_cast<int32_t*>(nullptr), S * max_blocks_per_seq_);
  meta_.logits_indices = offset(static_cast<int32_t*>(nullptr), T);
  meta_.temperatures = offset(static_cast<float*>(nullptr), L);
  meta_.top_ks = offset(static_cast<int32_t*>(nullptr), L);
  meta_.top_ps = offset(static_cast<float*>(nullptr), L);
  meta_.seeds = offset(static_cast<uint64_t*>(nullptr), L);
  meta_.draw_indices = offset(static_cast<int64_t*>(nullptr), L);
  meta_.top_counts = offset(static_cast<int32_t*>(nullptr), L);
  meta_.bytes = meta.used();
  sample_ws_bytes_ = kc::SampleTokensWorkspaceBytes(L, c.vocab_size);

  auto carve_all = [&](DeviceCarver& w) {
    auto typed = [&](int64_t elements) -> void* { return w.Take<uint8_t>(elements * elem); };
    meta_dev_ = w.Take<uint8_t>(static_cast<int64_t>(meta_.bytes));
    x_ = typed(T * H);
    res_ = w.Take<float>(T * H);
    qkv_ = typed(T * qkv_cols);
    attn_out_ = typed(T * q_heads_ * hd);
    router_logits_ = w.Take<float>(T * E);
    shared_out_ = typed(any_shared ? T * H : 0);
    shared_logit_ = w.Take<float>(any_shared ? T : 0);
    topk_weights_ = w.Take<float>(R);
    permuted_ = typed(R * H);
    h13_ = typed(h13);
    act_ = typed(act);
    expert_out_ = typed(R * H);
    sel_x_ = typed(L * H);
    sel_res_ = w.Take<float>(L * H);
    logits_dev_ = w.Take<float>(L * c.vocab_size);
    attn_ws_ = w.Take<float>(attn_ws_floats_);
    sample_ws_ = w.Take<uint8_t>(sample_ws_bytes_);
    sampled_tokens_ = w.Take<int32_t>(L);
    sampled_logprobs_ = w.Take<float>(L);
    top_ids_ = w.Take<int32_t>(L * kernels::cpu::kMaxTopLogprobs);
    top_logprobs_ = w.Take<float>(L * kernels::cpu::kMaxTopLogprobs);
    topk_ids_ = w.Take<int32_t>(R);
    expert_offsets_ = w.Take<int32_t>(E + 1);
    row_token_ = w.Take<int32_t>(R);
    pair_row_ = w.Take<int32_t>(R);
  };
  DeviceCarver sizing(nullptr);
  carve_all(sizing);
  VAMP_ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(sizing.used()));
  DeviceCarver carve(workspace_.data());
  carve_all(carve);
  VAMP_ASSIGN_OR_RETURN(meta_host_, PinnedBuffer::Allocate(meta_.bytes));
  VAMP_ASSIGN_OR_RETURN(offsets_host_, PinnedBuffer::Allocate((E + 1) * sizeof(int32_t)));
  VAMP_ASSIGN_OR_RETURN(sampled_host_,
                        PinnedBuffer::Allocate(L * (1 + kernels::cpu::kMaxTopLogprobs) *
                                               (sizeof(int32_t) + sizeof(float))));
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::UploadMetadata(const ForwardBatch& b,
                                               const StepSampling* sampling) {
  uint8_t* h = meta_host_.data();
  auto put = [h](uint64_t offset, const auto& span) {
    std::memcpy(h + offset, span.data(), span.size() * sizeof(span[0]));
  };
  put(meta_.token_ids, b.token_ids);
  put(meta_.positions, b.positions);
  put(meta_.slot_mapping, b.slot_mapping);
  put(meta_.query_start_loc, b.query_start_loc);
  put(meta_.seq_lens, b.seq_lens);
  put(meta_.block_tables, b.block_tables);
  put(meta_.logits_indices, b.logits_indices);
  if (sampling != nullptr) {
    put(meta_.temperatures, sampling->temperatures);
    put(meta_.top_ks, sampling->top_ks);
    put(meta_.top_ps, sampling->top_ps);
    put(meta_.seeds, sampling->seeds);
    put(meta_.draw_indices, sampling->draw_indices);
    put(meta_.top_counts, sampling->top_counts);
  }
  // One transfer of the whole area, unused tails included (fewer launches than one copy per
  // array). Asynchronous on the compute stream: the pinned area is rewritten only by the next
  // Forward, after this one has synchronised the stream.
  VAMP_CUDART_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_dev_, h, meta_.bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::Forward(const ForwardBatch& batch, const KvCacheView& kv,
                                        ExpertWeights* experts, Communicator* comm, float* logits) {
  // The host communicator is not used: tensor parallel sums run on the device.
  return Run(batch, kv, experts, logits, nullptr, nullptr);
}

absl::Status CudaQwen3MoeModel::ForwardAndSample(const ForwardBatch& batch, const KvCacheView& kv,
                                                 ExpertWeights* experts, Communicator* comm,
                                                 const StepSampling& sampling,
                                                 const StepSamplingOutput& out) {
  VAMP_RETURN_IF_ERROR(CheckForwardAndSampleArgs(batch, sampling, out, max_logits_rows_));
  return Run(batch, kv, experts, nullptr, &sampling, &out);
}

absl::Status CudaQwen3MoeModel::Run(const ForwardBatch& batch, const KvCacheView& kv,
                                    ExpertWeights* experts, float* host_logits,
                                    const StepSampling* sampling, const StepSamplingOutput* out) {
  const ModelConfig& c = config();
  const int64_t n = batch.num_tokens();
  if (n == 0) return absl::OkStatus();
  if (!moe_layers().empty() && experts == nullptr) {
    return absl::FailedPreconditionError("MoE forward pass without expert weights");
  }
  const int64_t m = static_cast<int64_t>(batch.logits_indices.size());
  if (n > max_tokens_ || batch.num_seqs() > max_seqs_ ||
      batch.block_table_stride > max_blocks_per_seq_ || m > max_tokens_ ||
      batch.max_seq_len > runner_config_.max_model_len ||
      static_cast<int64_t>(batch.block_tables.size()) > max_seqs_ * max_blocks_per_seq_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch of ", n, " tokens, ", batch.num_seqs(), " sequences, ",
                     batch.block_table_stride, " blocks per sequence, ", batch.max_seq_len,
                     " tokens of context exceeds the GPU workspace (", max_tokens_, ", ", max_seqs_,
                     ", ", max_blocks_per_seq_, ", ", runner_config_.max_model_len, ")"));
  }
  if (static_cast<int64_t>(kv.k.size()) < c.num_hidden_layers ||
      static_cast<int64_t>(kv.v.size()) < c.num_hidden_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV cache view covers ", kv.k.size(), " layers; the model has ", c.num_hidden_layers));
  }
  if (kv.dtype != options_.dtype) {
    return absl::FailedPreconditionError(absl::StrCat("the KV cache holds ", DTypeName(kv.dtype),
                                                      "; the model computes in ",
                                                      DTypeName(options_.dtype)));
  }
  // Every step runs on the block table re-laid out on a bucketed stride, with attention's
  // context bound to match, graph or not: a graph's launch parameters then change only every
  // graph_stride_bucket_blocks blocks of context, and a step gives bit-identical results whether
  // it replays a graph or runs launch by launch (residency changes switch between the two).
  const int64_t bucket = std::max<int64_t>(1, options_.graph_stride_bucket_blocks);
  const int64_t old_stride = batch.block_table_stride;
  const int64_t stride = std::min(max_blocks_per_seq_, CeilDiv(old_stride, bucket) * bucket);
  const int64_t num_seqs = batch.num_seqs();
  graph_block_tables_.assign(num_seqs * stride, 0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    std::copy_n(batch.block_tables.begin() + s * old_stride, old_stride,
                graph_block_tables_.begin() + s * stride);
  }
  ForwardBatch bucketed = batch;
  bucketed.block_tables = graph_block_tables_;
  bucketed.block_table_stride = stride;
  bucketed.max_seq_len = static_cast<int32_t>(std::max<int64_t>(
      batch.max_seq_len,
      std::min(stride * runner_config_.block_size, runner_config_.max_model_len)));
  // The recurrent-state checks run before anything is enqueued: a refused step changes nothing.
  if (delta_net_ != nullptr) VAMP_RETURN_IF_ERROR(delta_net_->BeginStep(bucketed));
  if (experts != nullptr) {
    experts->PlanPass(batch.num_tokens());
    const absl::Status begin = experts->BeginPass();
    if (!begin.ok()) {
      if (delta_net_ != nullptr) delta_net_->EndStep(bucketed, /*ok=*/false);
      return begin;
    }
  }
  absl::Status status;
  if (GraphEligible(bucketed, sampling, experts)) {
    status = RunGraph(bucketed, *sampling, kv, experts);
  } else {
    ++graph_stats_.eager_steps;
    status = UploadMetadata(bucketed, sampling);
    if (status.ok()) {
      status = options_.dtype == DType::kBFloat16 ? RunLayers<BFloat16>(bucketed, kv, experts)
                                                  : RunLayers<float>(bucketed, kv, experts);
    }
    if (status.ok()) {
      const bool sample = sampling != nullptr;
      const StepLogitsProcessing* processing = sample ? sampling->processing : nullptr;
      const bool alternatives = sample && sampling->max_top_logprobs > 0;
      status = options_.dtype == DType::kBFloat16
                   ? Logits<BFloat16>(m, host_logits, sample, processing, alternatives)
                   : Logits<float>(m, host_logits, sample, processing, alternatives);
    }
  }
  if (experts != nullptr) {
    const absl::Status end = experts->EndPass();
    if (status.ok()) status = end;
  }
  // Always leave the stream idle: the pinned metadata may be rewritten by the next call, and
  // asynchronous kernel errors surface here.
  absl::Status sync =
      CudaRuntimeStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (forward pass)");
  if (sync.ok() && parallel().tp_size > 1) sync = options_.all_reduce->Check();
  if (delta_net_ != nullptr) delta_net_->EndStep(bucketed, status.ok() && sync.ok());
  if (!status.ok()) return status;
  if (!sync.ok()) return sync;
  if (sampling != nullptr) {
    const SampledHost h = SampledHostArrays();
    std::copy_n(h.tokens, m, out->tokens);
    std::copy_n(h.logprobs, m, out->logprobs);
    // The device rows hold kMaxTopLogprobs entries; the caller's hold max_top_logprobs (the rest
    // of a device row is padding: no row asks for more).
    const int64_t k = sampling->max_top_logprobs;
    for (int64_t r = 0; k > 0 && r < m; ++r) {
      std::copy_n(h.top_ids + r * kernels::cpu::kMaxTopLogprobs, k, out->top_ids + r * k);
      std::copy_n(h.top_logprobs + r * kernels::cpu::kMaxTopLogprobs, k, out->top_logprobs + r * k);
    }
  }
  return absl::OkStatus();
}

CudaQwen3MoeModel::~CudaQwen3MoeModel() { ClearGraphs(); }

absl::Status CudaQwen3MoeModel::ReserveRecurrentStates(int64_t num_slots) {
  if (delta_net_ == nullptr) return absl::OkStatus();
  return delta_net_->ReserveSlots(num_slots);
}

absl::Status CudaQwen3MoeModel::RestoreRecurrentState(int32_t slot, const StateSnapshotView& from,
                                                      int64_t num_tokens) {
  if (delta_net_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(config().model_type, " keeps no recurrent state to restore"));
  }
  return delta_net_->Restore(slot, from, num_tokens);
}

bool CudaQwen3MoeModel::DeviceExpertGemm(int64_t rows) const {
  const int64_t per_expert = options_.device_gemm_max_rows_per_expert;
  return per_expert < 0 || rows <= per_expert * config().num_experts;
}

void CudaQwen3MoeModel::ClearGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

bool CudaQwen3MoeModel::GraphEligible(const ForwardBatch& batch, const StepSampling* sampling,
                                      ExpertWeights* experts) const {
  // Logits processing uploads arrays of a size that changes every step: run it eagerly.
  // State captures copy to addresses that change every step.
  if (!options_.cuda_graphs || graphs_failed_ || sampling == nullptr ||
      sampling->processing != nullptr || options_.dtype != DType::kBFloat16 ||
      parallel().tp_size != 1 || (delta_net_ != nullptr && delta_net_->step_has_captures())) {
    return false;
  }
  const int64_t n = batch.num_tokens();
  // Decode only: one token per sequence, every one sampled, rows in order.
  if (n != batch.num_seqs() || static_cast<int64_t>(batch.logits_indices.size()) != n) {
    return false;
  }
  for (int64_t r = 0; r < n; ++r) {
    if (batch.logits_indices[r] != r) return false;
  }
  const int64_t rows = n * config().num_experts_per_tok;
  if (!DeviceExpertGemm(rows)) return false;
  return moe_layers().empty() || (experts != nullptr && !experts->PassStagesExperts());
}

absl::Status CudaQwen3MoeModel::RunGraph(const ForwardBatch& batch, const StepSampling& sampling,
                                         const KvCacheView& kv, ExpertWeights* experts) {
  const int64_t n = batch.num_tokens();
  const ForwardBatch& gb = batch;  // already on the bucketed stride (Run)
  VAMP_RETURN_IF_ERROR(UploadMetadata(gb, &sampling));

  // Device addresses a graph bakes in besides the model's own buffers: the KV view and the expert
  // pointer tables (read on the device, so their contents may change; their addresses may not).
  uint64_t fingerprint = 0x9E3779B97F4A7C15ull;
  auto mix = [&fingerprint](uint64_t v) {
    fingerprint = (fingerprint ^ v) * 0xBF58476D1CE4E5B9ull;
    fingerprint ^= fingerprint >> 31;
  };
  for (size_t l = 0; l < kv.k.size(); ++l) {
    mix(reinterpret_cast<uintptr_t>(kv.k[l]));
    mix(reinterpret_cast<uintptr_t>(kv.v[l]));
  }
  mix(static_cast<uint64_t>(kv.strides.block_stride));
  mix(static_cast<uint64_t>(kv.strides.token_stride));
  if (delta_net_ != nullptr) mix(reinterpret_cast<uintptr_t>(delta_net_->states_address()));
  for (int layer : moe_layers()) {
    VAMP_ASSIGN_OR_RETURN(const ExpertLayerTable table, experts->AcquireLayer(layer));
    mix(reinterpret_cast<uintptr_t>(table.device_w13));
    mix(reinterpret_cast<uintptr_t>(table.device_w2));
    VAMP_RETURN_IF_ERROR(experts->ReleaseLayer(layer));
  }
  if (fingerprint != graph_fingerprint_) {
    ClearGraphs();
    graph_fingerprint_ = fingerprint;
  }

  const bool alternatives = sampling.max_top_logprobs > 0;
  const GraphKey key(n, gb.block_table_stride, alternatives);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (static_cast<int64_t>(graphs_.size()) >= options_.max_cuda_graphs) ClearGraphs();
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status captured = RunLayers<BFloat16>(gb, kv, experts);
    if (captured.ok()) {
      captured = Logits<BFloat16>(n, nullptr, /*sample=*/true, nullptr, alternatives);
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (captured.ok() && end == cudaSuccess) {
      captured = CudaRuntimeStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    } else if (captured.ok()) {
      captured = CudaRuntimeStatus(end, "cudaStreamEndCapture");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!captured.ok()) {
      // Capturing is an optimisation: run this and every later step launch by launch.
      (void)cudaGetLastError();
      graphs_failed_ = true;
      VAMP_LOG(WARNING) << "CUDA graph capture failed, running eagerly from now on: " << captured;
      ++graph_stats_.eager_steps;
      VAMP_RETURN_IF_ERROR(RunLayers<BFloat16>(gb, kv, experts));
      return Logits<BFloat16>(n, nullptr, /*sample=*/true, nullptr, alternatives);
    }
    it = graphs_.emplace(key, exec).first;
    ++graph_stats_.captures;
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
  ++graph_stats_.replays;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaQwen3MoeModel::RunLayers(const ForwardBatch& batch, const KvCacheView& kv,
                                          ExpertWeights* experts) {
  const ModelConfig& c = config();
  const int64_t n = batch.num_tokens(), H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const auto* token_ids = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.token_ids);
  // x = embedding, residual = 0: every layer then starts alike with "residual += x; x =
  // RMSNorm(residual)", which for layer 0 is RMSNorm(embedding) with residual = embedding, as in
  // the CPU model.
  VAMP_RETURN_IF_ERROR(kc::GatherRows(As<T>(embed_), H, token_ids, n, H, As<T>(x_), H, stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(res_, 0, n * H * sizeof(float), stream_));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    VAMP_RETURN_IF_ERROR(
        kc::FusedAddRmsNorm(As<T>(x_), H, res_, H, L.input_norm, eps, n, H, stream_));
    if (L.full_attention) {
      VAMP_RETURN_IF_ERROR(Attention<T>(l, batch, kv));
    } else {
      VAMP_RETURN_IF_ERROR(delta_net_->RunLayer<T>(L.linear, batch, As<T>(x_), As<T>(x_)));
      VAMP_RETURN_IF_ERROR(AllReduceHidden(n));
    }
    VAMP_RETURN_IF_ERROR(
        kc::FusedAddRmsNorm(As<T>(x_), H, res_, H, L.post_norm, eps, n, H, stream_));
    VAMP_RETURN_IF_ERROR(L.moe ? Moe<T>(l, n, experts) : DenseMlp<T>(l, n));
  }
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::AllReduceHidden(int64_t n) {
  if (parallel().tp_size == 1) return absl::OkStatus();
  return options_.all_reduce->AllReduceSum(x_, n * config().hidden_size, options_.dtype, stream_);
}

template <typename T>
absl::Status CudaQwen3MoeModel::Attention(int layer, const ForwardBatch& batch,
                                          const KvCacheView& kv) {
  const ModelConfig& c = config();
  const Layer& L = layers_[layer];
  const int64_t n = batch.num_tokens(), H = c.hidden_size, hd = c.head_dim;
  const int64_t q_cols = q_heads_ * hd, kv_cols = kv_heads_ * hd;
  const int64_t qkv_cols = qkv_cols_;
  T* qkv = As<T>(qkv_);
  VAMP_RETURN_IF_ERROR(
      kc::Gemm(As<T>(x_), H, As<T>(L.qkv), H, qkv, qkv_cols, n, qkv_cols, H, stream_));
  // qwen3_moe: q | k | v; Qwen3-Next: q | output gate | k | v.
  T* q = qkv;
  const T* gate = gated_attention_ ? qkv + q_cols : nullptr;
  T* k = qkv + (gated_attention_ ? 2 : 1) * q_cols;
  T* v = k + kv_cols;
  const auto* positions = reinterpret_cast<const int64_t*>(meta_dev_ + meta_.positions);
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (c.rotary_dim == hd) {
    VAMP_RETURN_IF_ERROR(kc::QkNormRope(q, qkv_cols, k, qkv_cols, n, q_heads_, kv_heads_, hd,
                                        L.q_norm, L.k_norm, eps, positions, rope_cache_,
                                        c.max_position_embeddings, stream_));
  } else {
    VAMP_RETURN_IF_ERROR(kc::QkNormPartialRope(q, qkv_cols, k, qkv_cols, n, q_heads_, kv_heads_, hd,
                                               c.rotary_dim, L.q_norm, L.k_norm, eps, positions,
                                               rope_cache_, c.max_position_embeddings, stream_));
  }
  T* k_cache = As<T>(kv.k[layer]);
  T* v_cache = As<T>(kv.v[layer]);
  if (k_cache == nullptr || v_cache == nullptr) {
    return absl::InternalError(absl::StrCat("no KV cache for attention layer ", layer));
  }
  const auto* slots = reinterpret_cast<const int64_t*>(meta_dev_ + meta_.slot_mapping);
  VAMP_RETURN_IF_ERROR(kc::WriteKv(k, qkv_cols, v, qkv_cols, slots, n, kv_heads_, hd, k_cache,
                                   v_cache, kv.strides, kv.block_size, stream_));
  const auto* block_tables = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.block_tables);
  const auto* seq_lens = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.seq_lens);
  const auto* qsl = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.query_start_loc);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  T* out = As<T>(attn_out_);
  kc::PagedAttentionArgs<T> args{.q = q,
                                 .q_stride = qkv_cols,
                                 .k_cache = k_cache,
                                 .v_cache = v_cache,
                                 .strides = kv.strides,
                                 .block_size = kv.block_size,
                                 .block_tables = block_tables,
                                 .block_table_stride = batch.block_table_stride,
                                 .seq_lens = seq_lens,
                                 .query_start_loc = qsl,
                                 .num_seqs = batch.num_seqs(),
                                 .num_q_heads = q_heads_,
                                 .num_kv_heads = kv_heads_,
                                 .head_dim = hd,
                                 .scale = scale,
                                 .out = out,
                                 .out_stride = q_cols};
  if constexpr (std::is_same_v<T, BFloat16>) {
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      args.max_query_len = std::max<int64_t>(
          args.max_query_len, batch.query_start_loc[s + 1] - batch.query_start_loc[s]);
    }
    args.max_seq_len = batch.max_seq_len;
    args.workspace = attn_ws_;
    args.workspace_floats = attn_ws_floats_;
  }
  VAMP_RETURN_IF_ERROR(kc::PagedAttention(args, stream_));
  if (gate != nullptr) {
    VAMP_RETURN_IF_ERROR(kc::SigmoidGate(out, q_cols, gate, qkv_cols, n, q_cols, stream_));
  }
  VAMP_RETURN_IF_ERROR(
      kc::Gemm(out, q_cols, As<T>(L.o_proj), q_cols, As<T>(x_), H, n, H, q_cols, stream_));
  return AllReduceHidden(n);
}

template <typename T>
absl::Status CudaQwen3MoeModel::Moe(int layer, int64_t n, ExpertWeights* experts) {
  const ModelConfig& c = config();
  const Layer& L = layers_[layer];
  const int64_t H = c.hidden_size, E = c.num_experts, top_k = c.num_experts_per_tok;
  const int64_t Il = expert_layout().inter, rows = n * top_k;
  T* x = As<T>(x_);
  // The shared expert and its gate read x before the routed experts overwrite it.
  if (L.shared_gate != nullptr) {
    VAMP_RETURN_IF_ERROR(
        SiluMlp<T>(L.shared_w13, L.shared_w2, shared_inter_, n, As<T>(shared_out_)));
    VAMP_RETURN_IF_ERROR(
        kc::Gemm(x, H, As<T>(L.shared_gate), H, shared_logit_, 1, n, 1, H, stream_));
  }
  VAMP_RETURN_IF_ERROR(kc::Gemm(x, H, As<T>(L.router), H, router_logits_, E, n, E, H, stream_));
  VAMP_RETURN_IF_ERROR(kc::RouterTopK(router_logits_, E, n, E, top_k, c.norm_topk_prob, topk_ids_,
                                      topk_weights_, stream_));
  VAMP_RETURN_IF_ERROR(
      kc::MoePermute(topk_ids_, n, top_k, E, expert_offsets_, row_token_, pair_row_, stream_));
  const bool on_device = std::is_same_v<T, BFloat16> && DeviceExpertGemm(rows);
  auto* offsets = reinterpret_cast<int32_t*>(offsets_host_.data());
  if (!on_device) {
    // cuBLAS takes each expert's row count on the host.
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(offsets, expert_offsets_, (E + 1) * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (offsets[E] != rows) {
      return absl::InternalError(absl::StrCat("layer ", layer, ": the router placed ", offsets[E],
                                              " of ", rows, " (token, expert) pairs"));
    }
  }
  T* permuted = As<T>(permuted_);
  T* h13 = As<T>(h13_);
  T* act = As<T>(act_);
  T* expert_out = As<T>(expert_out_);
  VAMP_RETURN_IF_ERROR(kc::GatherRows(x, H, row_token_, rows, H, permuted, H, stream_));

  if (experts->PassStagesRouted()) {
    VAMP_RETURN_IF_ERROR(experts->StageRouted(layer, expert_offsets_));
  }
  VAMP_ASSIGN_OR_RETURN(const ExpertLayerTable table, experts->AcquireLayer(layer));
  if (on_device) {
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (table.device_w13 == nullptr || table.device_w2 == nullptr) {
        return absl::FailedPreconditionError(
            "the expert weights have no device pointer tables (not a CudaExpertStoreWeights?)");
      }
      // The tables are device arrays of device pointers: only their addresses are used here.
      const auto* w13 = reinterpret_cast<const BFloat16* const*>(table.device_w13);
      const auto* w2 = reinterpret_cast<const BFloat16* const*>(table.device_w2);
      // SiLU-and-mul in the w13 GEMM's epilogue: the [rows, 2 * inter] product never reaches HBM.
      VAMP_RETURN_IF_ERROR(kc::GroupedExpertGemmSiluMul(permuted, H, w13, 0, H, expert_offsets_, E,
                                                        rows, act, Il, Il, H, stream_));
      VAMP_RETURN_IF_ERROR(kc::GroupedExpertGemm(act, Il, w2, 0, Il, expert_offsets_, E, rows,
                                                 expert_out, H, H, Il, stream_));
    }
  } else {
    std::vector<const T*>* w13;
    std::vector<const T*>* w2;
    if constexpr (std::is_same_v<T, BFloat16>) {
      w13 = &bf16_w13_;
      w2 = &bf16_w2_;
    } else {
      w13 = &f32_w13_;
      w2 = &f32_w2_;
    }
    w13->assign(E, nullptr);
    w2->assign(E, nullptr);
    for (int64_t e = 0; e < E; ++e) {
      (*w13)[e] = As<T>(table.w13[e]);
      (*w2)[e] = As<T>(table.w2[e]);
    }
    if constexpr (std::is_same_v<T, BFloat16>) {
      // One cuBLAS grouped call per projection (experts with equal row counts share a group).
      VAMP_RETURN_IF_ERROR(kc::ExpertGemmGrouped(permuted, H, w13->data(), 0, H, offsets, E, h13,
                                                 2 * Il, 2 * Il, H, stream_));
      VAMP_RETURN_IF_ERROR(kc::SiluAndMul(h13, 2 * Il, rows, Il, act, Il, stream_));
      VAMP_RETURN_IF_ERROR(kc::ExpertGemmGrouped(act, Il, w2->data(), 0, Il, offsets, E, expert_out,
                                                 H, H, Il, stream_));
    } else {
      VAMP_RETURN_IF_ERROR(kc::ExpertGemm(permuted, H, w13->data(), 0, H, offsets, E, h13, 2 * Il,
                                          2 * Il, H, stream_));
      VAMP_RETURN_IF_ERROR(kc::SiluAndMul(h13, 2 * Il, rows, Il, act, Il, stream_));
      VAMP_RETURN_IF_ERROR(
          kc::ExpertGemm(act, Il, w2->data(), 0, Il, offsets, E, expert_out, H, H, Il, stream_));
    }
  }
  VAMP_RETURN_IF_ERROR(experts->ReleaseLayer(layer));
  VAMP_RETURN_IF_ERROR(
      kc::MoeUnpermute(expert_out, H, pair_row_, topk_weights_, n, top_k, H, x, H, stream_));
  if (L.shared_gate != nullptr) {
    VAMP_RETURN_IF_ERROR(
        kc::AddSigmoidScaled(x, H, As<T>(shared_out_), H, shared_logit_, 1, n, H, stream_));
  }
  return AllReduceHidden(n);
}

template <typename T>
absl::Status CudaQwen3MoeModel::SiluMlp(const void* w13, const void* w2, int64_t inter, int64_t n,
                                        T* out) {
  const int64_t H = config().hidden_size;
  T* h13 = As<T>(h13_);
  T* act = As<T>(act_);
  VAMP_RETURN_IF_ERROR(
      kc::Gemm(As<T>(x_), H, As<T>(w13), H, h13, 2 * inter, n, 2 * inter, H, stream_));
  VAMP_RETURN_IF_ERROR(kc::SiluAndMul(h13, 2 * inter, n, inter, act, inter, stream_));
  return kc::Gemm(act, inter, As<T>(w2), inter, out, H, n, H, inter, stream_);
}

template <typename T>
absl::Status CudaQwen3MoeModel::DenseMlp(int layer, int64_t n) {
  const Layer& L = layers_[layer];
  VAMP_RETURN_IF_ERROR(SiluMlp<T>(L.mlp_w13, L.mlp_w2, dense_inter_, n, As<T>(x_)));
  return AllReduceHidden(n);
}

absl::Status CudaQwen3MoeModel::ProcessLogitsOnDevice(float* logits, int64_t rows,
                                                      const StepLogitsProcessing& p) {
  const int64_t num_entries = p.entry_offsets.empty() ? 0 : p.entry_offsets.back();
  if (static_cast<int64_t>(p.entry_offsets.size()) != rows + 1 ||
      static_cast<int64_t>(p.entry_tokens.size()) != num_entries ||
      static_cast<int64_t>(p.entry_counts.size()) != num_entries ||
      static_cast<int64_t>(p.entry_flags.size()) != num_entries ||
      static_cast<int64_t>(p.repetition_penalties.size()) != rows ||
      static_cast<int64_t>(p.frequency_penalties.size()) != rows ||
      static_cast<int64_t>(p.presence_penalties.size()) != rows ||
      static_cast<int64_t>(p.min_ps.size()) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("logits processing arrays do not match ", rows,
                                                   " rows and ", num_entries, " entries"));
  }
  // Layout: offsets, tokens, counts, the four per-row float arrays, then the flags (bytes last,
  // so every 4-byte array stays aligned).
  const uint64_t ints = static_cast<uint64_t>(rows + 1 + 2 * num_entries);
  const uint64_t floats = static_cast<uint64_t>(4 * rows);
  const uint64_t bytes = (ints + floats) * 4 + static_cast<uint64_t>(num_entries);
  if (processing_dev_.bytes() < bytes) {
    VAMP_ASSIGN_OR_RETURN(processing_dev_, DeviceBuffer::Allocate(bytes * 2));
  }
  uint8_t* d = processing_dev_.data();
  uint64_t offset = 0;
  auto put = [&](const auto& span) -> absl::StatusOr<const void*> {
    uint8_t* at = d + offset;
    const uint64_t n = span.size() * sizeof(span[0]);
    offset += n;
    if (n > 0) {
      VAMP_CUDART_RETURN_IF_ERROR(
          cudaMemcpyAsync(at, span.data(), n, cudaMemcpyHostToDevice, stream_));
    }
    return at;
  };
  kernels::cpu::LogitsProcessing dev;
  VAMP_ASSIGN_OR_RETURN(const void* offsets, put(p.entry_offsets));
  VAMP_ASSIGN_OR_RETURN(const void* tokens, put(p.entry_tokens));
  VAMP_ASSIGN_OR_RETURN(const void* counts, put(p.entry_counts));
  VAMP_ASSIGN_OR_RETURN(const void* repetition, put(p.repetition_penalties));
  VAMP_ASSIGN_OR_RETURN(const void* frequency, put(p.frequency_penalties));
  VAMP_ASSIGN_OR_RETURN(const void* presence, put(p.presence_penalties));
  VAMP_ASSIGN_OR_RETURN(const void* min_ps, put(p.min_ps));
  VAMP_ASSIGN_OR_RETURN(const void* flags, put(p.entry_flags));
  dev.entry_offsets = static_cast<const int32_t*>(offsets);
  dev.entry_tokens = static_cast<const int32_t*>(tokens);
  dev.entry_counts = static_cast<const int32_t*>(counts);
  dev.entry_flags = static_cast<const uint8_t*>(flags);
  dev.repetition_penalties = static_cast<const float*>(repetition);
  dev.frequency_penalties = static_cast<const float*>(frequency);
  dev.presence_penalties = static_cast<const float*>(presence);
  dev.min_ps = static_cast<const float*>(min_ps);
  dev.temperatures = reinterpret_cast<const float*>(meta_dev_ + meta_.temperatures);
  const int64_t V = config().vocab_size;
  return kc::ProcessLogits(logits, V, rows, V, dev, stream_);
}

template <typename T>
absl::Status CudaQwen3MoeModel::Logits(int64_t m, float* host_logits, bool sample,
                                       const StepLogitsProcessing* processing, bool alternatives) {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const auto* indices = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.logits_indices);
  T* sel_x = As<T>(sel_x_);
  // Final norm and LM head for the requested rows only, max_logits_rows_ at a time.
  for (int64_t r0 = 0; r0 < m; r0 += max_logits_rows_) {
    const int64_t rows = std::min(max_logits_rows_, m - r0);
    VAMP_RETURN_IF_ERROR(kc::GatherRows(As<T>(x_), H, indices + r0, rows, H, sel_x, H, stream_));
    VAMP_RETURN_IF_ERROR(kc::GatherRows(res_, H, indices + r0, rows, H, sel_res_, H, stream_));
    VAMP_RETURN_IF_ERROR(
        kc::FusedAddRmsNorm(sel_x, H, sel_res_, H, final_norm_, eps, rows, H, stream_));
    VAMP_RETURN_IF_ERROR(
        kc::Gemm(sel_x, H, As<T>(lm_head_), H, logits_dev_, V, rows, V, H, stream_));
    if (sample) {
      // ForwardAndSample bounds m by max_logits_rows_: one chunk, sampled where it is.
      // Processing rewrites a copy that only sampling reads: logprobs stay the raw logits'.
      float* sample_from = logits_dev_;
      if (processing != nullptr) {
        const uint64_t row_bytes = static_cast<uint64_t>(V) * sizeof(float);
        const uint64_t bytes = static_cast<uint64_t>(rows) * row_bytes;
        if (processed_logits_.bytes() < bytes) {
          // Doubling (up to max_logits_rows_ rows) bounds the reallocations of a growing batch.
          const int64_t have = static_cast<int64_t>(processed_logits_.bytes() / row_bytes);
          const int64_t grow = std::min(max_logits_rows_, std::max(rows, 2 * have));
          processed_logits_ = DeviceBuffer();  // free the smaller one first
          VAMP_ASSIGN_OR_RETURN(processed_logits_, DeviceBuffer::Allocate(grow * row_bytes));
        }
        sample_from = reinterpret_cast<float*>(processed_logits_.data());
        VAMP_CUDART_RETURN_IF_ERROR(
            cudaMemcpyAsync(sample_from, logits_dev_, bytes, cudaMemcpyDeviceToDevice, stream_));
        VAMP_RETURN_IF_ERROR(ProcessLogitsOnDevice(sample_from, rows, *processing));
      }
      // Without processing or alternatives SampleTokens' own logprob is the raw one; otherwise
      // TopLogprobs computes it on the raw rows with the alternatives' normaliser.
      const bool separate_logprobs = processing != nullptr || alternatives;
      VAMP_RETURN_IF_ERROR(kc::SampleTokens(
          sample_from, V, rows, V, reinterpret_cast<const float*>(meta_dev_ + meta_.temperatures),
          reinterpret_cast<const int32_t*>(meta_dev_ + meta_.top_ks),
          reinterpret_cast<const float*>(meta_dev_ + meta_.top_ps),
          reinterpret_cast<const uint64_t*>(meta_dev_ + meta_.seeds),
          reinterpret_cast<const int64_t*>(meta_dev_ + meta_.draw_indices), sample_ws_,
          sample_ws_bytes_, sampled_tokens_, separate_logprobs ? nullptr : sampled_logprobs_,
          stream_));
      if (separate_logprobs) {
        VAMP_RETURN_IF_ERROR(kc::TopLogprobs(
            logits_dev_, V, rows, V, reinterpret_cast<const int32_t*>(meta_dev_ + meta_.top_counts),
            alternatives ? kernels::cpu::kMaxTopLogprobs : 0, top_ids_, top_logprobs_,
            sampled_tokens_, sampled_logprobs_, stream_));
      }
      const SampledHost h = SampledHostArrays();
      VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(h.tokens, sampled_tokens_, rows * sizeof(int32_t),
                                                  cudaMemcpyDeviceToHost, stream_));
      VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(
          h.logprobs, sampled_logprobs_, rows * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      if (alternatives) {
        const int64_t entries = rows * kernels::cpu::kMaxTopLogprobs;
        VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(h.top_ids, top_ids_, entries * sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, stream_));
        VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(h.top_logprobs, top_logprobs_,
                                                    entries * sizeof(float), cudaMemcpyDeviceToHost,
                                                    stream_));
      }
      continue;  // the caller synchronises the stream before reading the pinned results
    }
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(host_logits + r0 * V, logits_dev_,
                                                rows * V * sizeof(float), cudaMemcpyDeviceToHost,
                                                stream_));
    // logits_dev_ is reused by the next chunk, and `host_logits` is pageable.
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  return absl::OkStatus();
}

CudaQwen3MoeModel::SampledHost CudaQwen3MoeModel::SampledHostArrays() const {
  uint8_t* h = sampled_host_.data();
  const int64_t L = max_logits_rows_, K = kernels::cpu::kMaxTopLogprobs;
  SampledHost a;
  a.tokens = reinterpret_cast<int32_t*>(h);
  a.logprobs = reinterpret_cast<float*>(h + L * sizeof(int32_t));
  a.top_ids = reinterpret_cast<int32_t*>(h + L * (sizeof(int32_t) + sizeof(float)));
  a.top_logprobs =
      reinterpret_cast<float*>(h + L * (sizeof(int32_t) + sizeof(float)) + L * K * sizeof(int32_t));
  return a;
}

}  // namespace vamp
