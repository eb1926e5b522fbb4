#include "engine/runner/cuda/cuda_qwen3_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;

// Device and pinned sub-allocations start on 256-byte boundaries (cuBLAS and vector loads).
constexpr uint64_t kAlign = 256;

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Hands out aligned byte ranges of one allocation: first a sizing pass (base null), then the real
// one.
class Carver {
 public:
  explicit Carver(uint8_t* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t elements) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ = AlignUp(used_ + static_cast<uint64_t>(std::max<int64_t>(elements, 1)) * sizeof(T));
    return p;
  }
  uint64_t used() const { return used_; }

 private:
  uint8_t* base_;
  uint64_t used_ = 0;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaQwen3MoeModel>> CudaQwen3MoeModel::Create(
    const CausalLm* host_model, const RunnerConfig& runner_config, cudaStream_t stream,
    CudaForwardOptions options) {
  if (host_model == nullptr) return absl::InvalidArgumentError("CudaQwen3MoeModel needs a model");
  const ModelConfig& c = host_model->config();
  if (c.architecture != Architecture::kQwen3Moe) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaQwen3MoeModel runs qwen3_moe, not '", c.model_type, "'"));
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
  std::unique_ptr<CudaQwen3MoeModel> m(
      new CudaQwen3MoeModel(host_model, runner_config, stream, options));
  VAMP_RETURN_IF_ERROR(m->UploadWeights());
  VAMP_RETURN_IF_ERROR(m->AllocateWorkspace());
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
}

absl::Status CudaQwen3MoeModel::UploadWeights() {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t Il = dense_inter_;
  const int64_t qkv_rows = (q_heads_ + 2 * kv_heads_) * hd;
  // Every weight the forward pass reads, with its expected size.
  absl::flat_hash_map<std::string, absl::Span<const float>> host;
  host_->ForEachWeight([&](absl::string_view name, absl::Span<const float> data) {
    host.emplace(std::string(name), data);
  });
  std::vector<std::pair<std::string, int64_t>> wanted = {{"model.embed_tokens.weight", V * H},
                                                         {"model.norm.weight", H}};
  const bool tied = !host.contains("lm_head.weight");
  if (!tied) wanted.push_back({"lm_head.weight", V * H});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    wanted.push_back({p + "input_layernorm.weight", H});
    wanted.push_back({p + "post_attention_layernorm.weight", H});
    wanted.push_back({p + "self_attn.qkv_proj.weight", qkv_rows * H});
    wanted.push_back({p + "self_attn.o_proj.weight", H * q_heads_ * hd});
    wanted.push_back({p + "self_attn.q_norm.weight", hd});
    wanted.push_back({p + "self_attn.k_norm.weight", hd});
    if (c.IsMoeLayer(l)) {
      wanted.push_back({p + "mlp.gate.weight", c.num_experts * H});
    } else {
      wanted.push_back({p + "mlp.gate_up_proj.weight", 2 * Il * H});
      wanted.push_back({p + "mlp.down_proj.weight", H * Il});
    }
  }
  std::vector<float> rope(c.max_position_embeddings * hd);
  kernels::cpu::BuildRopeCache(static_cast<float>(c.rope_theta), hd, c.max_position_embeddings,
                               rope.data());

  Carver sizing(nullptr);
  for (const auto& [name, elements] : wanted) {
    auto it = host.find(name);
    if (it == host.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the model has no weight '", name, "'"));
    }
    if (static_cast<int64_t>(it->second.size()) != elements) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", name, "' has ", it->second.size(),
                                                     " elements, expected ", elements));
    }
    sizing.Take<float>(elements);
  }
  sizing.Take<float>(static_cast<int64_t>(rope.size()));
  VAMP_ASSIGN_OR_RETURN(weights_, DeviceBuffer::Allocate(sizing.used()));

  Carver carve(weights_.data());
  absl::flat_hash_map<std::string, const float*> dev;
  auto upload = [&](const float* src, int64_t elements) -> absl::StatusOr<const float*> {
    float* dst = carve.Take<float>(elements);
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, elements * sizeof(float), cudaMemcpyHostToDevice, stream_));
    return dst;
  };
  for (const auto& [name, elements] : wanted) {
    VAMP_ASSIGN_OR_RETURN(dev[name], upload(host.at(name).data(), elements));
  }
  VAMP_ASSIGN_OR_RETURN(rope_cache_, upload(rope.data(), static_cast<int64_t>(rope.size())));
  // The sources are pageable host memory (and `rope` is local): wait for the copies. The expert
  // store wrote the experts with cudaMemcpy on the legacy stream, which does not order our
  // non-blocking stream either.
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaDeviceSynchronize());

  embed_ = dev.at("model.embed_tokens.weight");
  lm_head_ = tied ? embed_ : dev.at("lm_head.weight");
  final_norm_ = dev.at("model.norm.weight");
  layers_.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Layer& L = layers_[l];
    L.moe = c.IsMoeLayer(l);
    L.input_norm = dev.at(p + "input_layernorm.weight");
    L.post_norm = dev.at(p + "post_attention_layernorm.weight");
    L.qkv = dev.at(p + "self_attn.qkv_proj.weight");
    L.o_proj = dev.at(p + "self_attn.o_proj.weight");
    L.q_norm = dev.at(p + "self_attn.q_norm.weight");
    L.k_norm = dev.at(p + "self_attn.k_norm.weight");
    if (L.moe) {
      L.router = dev.at(p + "mlp.gate.weight");
    } else {
      L.mlp_w13 = dev.at(p + "mlp.gate_up_proj.weight");
      L.mlp_w2 = dev.at(p + "mlp.down_proj.weight");
    }
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
  const int64_t qkv_cols = (q_heads_ + 2 * kv_heads_) * hd;
  const bool any_dense =
      std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) { return !l.moe; });
  const int64_t h13 = std::max(R * 2 * Il, any_dense ? T * 2 * dense_inter_ : 0);
  const int64_t act = std::max(R * Il, any_dense ? T * dense_inter_ : 0);

  // Step metadata: the same layout in pinned host memory and on the device.
  Carver meta(nullptr);
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
  meta_.bytes = meta.used();

  auto carve_all = [&](Carver& w) {
    meta_dev_ = w.Take<uint8_t>(static_cast<int64_t>(meta_.bytes));
    x_ = w.Take<float>(T * H);
    res_ = w.Take<float>(T * H);
    qkv_ = w.Take<float>(T * qkv_cols);
    attn_out_ = w.Take<float>(T * q_heads_ * hd);
    router_logits_ = w.Take<float>(T * E);
    topk_weights_ = w.Take<float>(R);
    permuted_ = w.Take<float>(R * H);
    h13_ = w.Take<float>(h13);
    act_ = w.Take<float>(act);
    expert_out_ = w.Take<float>(R * H);
    sel_x_ = w.Take<float>(L * H);
    sel_res_ = w.Take<float>(L * H);
    logits_dev_ = w.Take<float>(L * c.vocab_size);
    topk_ids_ = w.Take<int32_t>(R);
    expert_offsets_ = w.Take<int32_t>(E + 1);
    row_token_ = w.Take<int32_t>(R);
    pair_row_ = w.Take<int32_t>(R);
  };
  Carver sizing(nullptr);
  carve_all(sizing);
  VAMP_ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(sizing.used()));
  Carver carve(workspace_.data());
  carve_all(carve);
  VAMP_ASSIGN_OR_RETURN(meta_host_, PinnedBuffer::Allocate(meta_.bytes));
  VAMP_ASSIGN_OR_RETURN(offsets_host_, PinnedBuffer::Allocate((E + 1) * sizeof(int32_t)));
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::UploadMetadata(const ForwardBatch& b) {
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
  // One transfer of the whole area, unused tails included (fewer launches than one copy per
  // array). Asynchronous on the compute stream: the pinned area is rewritten only by the next
  // Forward, after this one has synchronised the stream.
  VAMP_CUDART_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_dev_, h, meta_.bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaQwen3MoeModel::Forward(const ForwardBatch& batch, const KvCacheView& kv,
                                        ExpertWeights* experts, Communicator* comm, float* logits) {
  const ModelConfig& c = config();
  const int64_t n = batch.num_tokens(), H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (n == 0) return absl::OkStatus();
  if (parallel().tp_size > 1) {
    return absl::UnimplementedError(
        "the GPU forward pass supports tensor parallel size 1 (no device all-reduce yet)");
  }
  (void)comm;  // tp_size == 1: nothing to reduce
  if (!moe_layers().empty() && experts == nullptr) {
    return absl::FailedPreconditionError("MoE forward pass without expert weights");
  }
  const int64_t m = static_cast<int64_t>(batch.logits_indices.size());
  if (n > max_tokens_ || batch.num_seqs() > max_seqs_ ||
      batch.block_table_stride > max_blocks_per_seq_ || m > max_tokens_ ||
      static_cast<int64_t>(batch.block_tables.size()) > max_seqs_ * max_blocks_per_seq_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch of ", n, " tokens, ", batch.num_seqs(), " sequences, ",
                     batch.block_table_stride, " blocks per sequence exceeds the GPU workspace (",
                     max_tokens_, ", ", max_seqs_, ", ", max_blocks_per_seq_, ")"));
  }
  if (static_cast<int64_t>(kv.k.size()) < c.num_hidden_layers ||
      static_cast<int64_t>(kv.v.size()) < c.num_hidden_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV cache view covers ", kv.k.size(), " layers; the model has ", c.num_hidden_layers));
  }
  VAMP_RETURN_IF_ERROR(UploadMetadata(batch));
  const auto* token_ids = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.token_ids);
  VAMP_RETURN_IF_ERROR(kc::GatherRows(embed_, H, token_ids, n, H, res_, H, stream_));

  if (experts != nullptr) VAMP_RETURN_IF_ERROR(experts->BeginPass());
  auto run_layer = [&](int l) -> absl::Status {
    const Layer& L = layers_[l];
    // As the CPU model: the first layer normalises the embedding (residual = embedding); later
    // layers add the previous MLP output to the residual stream first.
    if (l == 0) {
      VAMP_RETURN_IF_ERROR(kc::RmsNorm(res_, H, L.input_norm, eps, n, H, x_, H, stream_));
    } else {
      VAMP_RETURN_IF_ERROR(kc::FusedAddRmsNorm(x_, H, res_, H, L.input_norm, eps, n, H, stream_));
    }
    VAMP_RETURN_IF_ERROR(Attention(l, batch, kv));
    VAMP_RETURN_IF_ERROR(kc::FusedAddRmsNorm(x_, H, res_, H, L.post_norm, eps, n, H, stream_));
    return L.moe ? Moe(l, n, experts) : DenseMlp(l, n);
  };
  absl::Status status;
  for (int l = 0; l < c.num_hidden_layers && status.ok(); ++l) status = run_layer(l);
  if (experts != nullptr) {
    const absl::Status end = experts->EndPass();
    if (status.ok()) status = end;
  }
  if (status.ok()) status = Logits(m, logits);
  // Always leave the stream idle: the pinned metadata may be rewritten by the next call, and
  // asynchronous kernel errors surface here.
  const absl::Status sync =
      CudaRuntimeStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (forward pass)");
  return status.ok() ? sync : status;
}

absl::Status CudaQwen3MoeModel::Attention(int layer, const ForwardBatch& batch,
                                          const KvCacheView& kv) {
  const ModelConfig& c = config();
  const Layer& L = layers_[layer];
  const int64_t n = batch.num_tokens(), H = c.hidden_size, hd = c.head_dim;
  const int64_t q_cols = q_heads_ * hd, kv_cols = kv_heads_ * hd;
  const int64_t qkv_cols = q_cols + 2 * kv_cols;
  VAMP_RETURN_IF_ERROR(kc::Gemm(x_, H, L.qkv, H, qkv_, qkv_cols, n, qkv_cols, H, stream_));
  float* q = qkv_;
  float* k = qkv_ + q_cols;
  float* v = qkv_ + q_cols + kv_cols;
  const auto* positions = reinterpret_cast<const int64_t*>(meta_dev_ + meta_.positions);
  VAMP_RETURN_IF_ERROR(kc::QkNormRope(q, qkv_cols, k, qkv_cols, n, q_heads_, kv_heads_, hd,
                                      L.q_norm, L.k_norm, static_cast<float>(c.rms_norm_eps),
                                      positions, rope_cache_, c.max_position_embeddings, stream_));
  float* k_cache = kv.k[layer];
  float* v_cache = kv.v[layer];
  if (k_cache == nullptr || v_cache == nullptr) {
    return absl::InternalError(absl::StrCat("no KV cache for attention layer ", layer));
  }
  const auto* slots = reinterpret_cast<const int64_t*>(meta_dev_ + meta_.slot_mapping);
  VAMP_RETURN_IF_ERROR(kc::WriteKv(k, qkv_cols, v, qkv_cols, slots, n, kv_heads_, hd, k_cache,
                                   v_cache, kv.strides, kv.block_size, stream_));
  const auto* block_tables = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.block_tables);
  const auto* seq_lens = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.seq_lens);
  const auto* qsl = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.query_start_loc);
  VAMP_RETURN_IF_ERROR(kc::PagedAttention(
      q, qkv_cols, k_cache, v_cache, kv.strides, kv.block_size, block_tables,
      batch.block_table_stride, seq_lens, qsl, batch.num_seqs(), q_heads_, kv_heads_, hd,
      1.0f / std::sqrt(static_cast<float>(hd)), attn_out_, q_cols, /*workspace=*/nullptr, stream_));
  return kc::Gemm(attn_out_, q_cols, L.o_proj, q_cols, x_, H, n, H, q_cols, stream_);
}

absl::Status CudaQwen3MoeModel::Moe(int layer, int64_t n, ExpertWeights* experts) {
  const ModelConfig& c = config();
  const Layer& L = layers_[layer];
  const int64_t H = c.hidden_size, E = c.num_experts, top_k = c.num_experts_per_tok;
  const int64_t Il = expert_layout().inter, rows = n * top_k;
  VAMP_RETURN_IF_ERROR(kc::Gemm(x_, H, L.router, H, router_logits_, E, n, E, H, stream_));
  VAMP_RETURN_IF_ERROR(kc::RouterTopK(router_logits_, E, n, E, top_k, c.norm_topk_prob, topk_ids_,
                                      topk_weights_, stream_));
  VAMP_RETURN_IF_ERROR(
      kc::MoePermute(topk_ids_, n, top_k, E, expert_offsets_, row_token_, pair_row_, stream_));
  // cuBLAS takes each expert's row count on the host.
  auto* offsets = reinterpret_cast<int32_t*>(offsets_host_.data());
  VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(offsets, expert_offsets_, (E + 1) * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream_));
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (offsets[E] != rows) {
    return absl::InternalError(absl::StrCat("layer ", layer, ": the router placed ", offsets[E],
                                            " of ", rows, " (token, expert) pairs"));
  }
  VAMP_RETURN_IF_ERROR(kc::GatherRows(x_, H, row_token_, rows, H, permuted_, H, stream_));

  VAMP_ASSIGN_OR_RETURN(const ExpertLayerTable table, experts->AcquireLayer(layer));
  VAMP_RETURN_IF_ERROR(
      kc::ExpertGemm(permuted_, H, table.w13, 0, H, offsets, E, h13_, 2 * Il, 2 * Il, H, stream_));
  VAMP_RETURN_IF_ERROR(kc::SiluAndMul(h13_, 2 * Il, rows, Il, act_, Il, stream_));
  VAMP_RETURN_IF_ERROR(
      kc::ExpertGemm(act_, Il, table.w2, 0, Il, offsets, E, expert_out_, H, H, Il, stream_));
  VAMP_RETURN_IF_ERROR(experts->ReleaseLayer(layer));

  return kc::MoeUnpermute(expert_out_, H, pair_row_, topk_weights_, n, top_k, H, x_, H, stream_);
}

absl::Status CudaQwen3MoeModel::DenseMlp(int layer, int64_t n) {
  const Layer& L = layers_[layer];
  const int64_t H = config().hidden_size, Il = dense_inter_;
  VAMP_RETURN_IF_ERROR(kc::Gemm(x_, H, L.mlp_w13, H, h13_, 2 * Il, n, 2 * Il, H, stream_));
  VAMP_RETURN_IF_ERROR(kc::SiluAndMul(h13_, 2 * Il, n, Il, act_, Il, stream_));
  return kc::Gemm(act_, Il, L.mlp_w2, Il, x_, H, n, H, Il, stream_);
}

absl::Status CudaQwen3MoeModel::Logits(int64_t m, float* logits) {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const auto* indices = reinterpret_cast<const int32_t*>(meta_dev_ + meta_.logits_indices);
  // Final norm and LM head for the requested rows only, max_logits_rows_ at a time.
  for (int64_t r0 = 0; r0 < m; r0 += max_logits_rows_) {
    const int64_t rows = std::min(max_logits_rows_, m - r0);
    VAMP_RETURN_IF_ERROR(kc::GatherRows(x_, H, indices + r0, rows, H, sel_x_, H, stream_));
    VAMP_RETURN_IF_ERROR(kc::GatherRows(res_, H, indices + r0, rows, H, sel_res_, H, stream_));
    VAMP_RETURN_IF_ERROR(
        kc::FusedAddRmsNorm(sel_x_, H, sel_res_, H, final_norm_, eps, rows, H, stream_));
    VAMP_RETURN_IF_ERROR(kc::Gemm(sel_x_, H, lm_head_, H, logits_dev_, V, rows, V, H, stream_));
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemcpyAsync(
        logits + r0 * V, logits_dev_, rows * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    // logits_dev_ is reused by the next chunk, and `logits` is pageable.
    VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  return absl::OkStatus();
}

}  // namespace vamp
