// The GPU execution path of the Qwen3 MoE family, qwen3_moe and qwen3_next: a CausalLm whose
// Forward runs every op with the CUDA kernels (kernels/cuda/) on one stream, over the same weights
// and the same structure as the CPU model it wraps (engine/model/qwen3_moe.h,
// engine/model/qwen3_next.h).
//
// Qwen3-Next adds, layer by layer as its CPU model: gated full attention (an output gate projected
// with q, q/k RMSNorm1p, rotary embedding on the first rotary_dim elements of a head) in the
// full-attention layers; Gated DeltaNet in the others (CudaGatedDeltaNet,
// engine/runner/cuda/cuda_gated_delta_net.h, which also keeps the per-sequence recurrent state in
// device memory, ReserveRecurrentStates, and copies it to and from snapshots in KV blocks for
// prefix-cache hits); and the shared expert beside the routed ones, scaled by its sigmoid gate.
//
// Why a CausalLm: ModelRunner (persistent batch, step metadata, validation, sampling) is
// backend-independent and already talks to the model only through CausalLm::Forward, so the GPU
// runner is ModelRunner driving this model — the same class, the same step semantics, no copy of
// the runner logic:
//
//   CudaStream stream = CudaStream::Create();
//   AgentMemory memory = CreateAgentMemory(cuda_backend, plan, cuda_fence);  // bf16 geometry
//   layout.dtype = DType::kBFloat16;
//   auto experts = CudaExpertStoreWeights::Create(memory.experts.get(), layout, stream.get());
//   auto host_model = LoadModel(config, options, *experts);      // experts go to VMM regions
//   memory.experts->FinalizeLoad();                              // pinned copies for staging
//   auto model = CudaQwen3MoeModel::Create(host_model.get(), runner_config, stream.get());
//   auto kv = CudaKvRegionView(*memory.kv, config.num_hidden_layers);
//   auto runner = ModelRunner::Create(runner_config, model.get(), experts.get(), nullptr, kv);
//
// Precision (CudaForwardOptions::dtype): with bfloat16 (the default, as the checkpoints), the
// weights, the activations between ops and the KV cache are bfloat16, every kernel computes in
// float32, and the residual stream, the norm weights, the router logits and the output logits
// stay float32. With float32 every op is float32 (cuBLAS in pedantic mode): the mode the tests use
// to compare with the CPU engine to float32 rounding.
//
// Device memory: at Create, every non-expert weight is copied to one device allocation, and one
// activation workspace is allocated for a step of runner_config.max_num_batched_tokens tokens and
// max_num_seqs sequences (plus pinned host staging for the step's metadata). Forward allocates
// nothing. The KV cache is the caller's (a KvCacheView of device addresses in the same dtype,
// CudaKvRegionView); experts are read through ExpertWeights whose tables hold device pointers and
// whose staging is ordered on this model's stream (CudaExpertStoreWeights), in the same dtype.
//
// Per step, Forward copies the metadata host->device in one transfer, runs the layers, and copies
// the logits back; it returns when the stream is idle. MoE layers in bfloat16 run the expert GEMMs
// with the device-side grouped GEMM (pointer table and row offsets read on the device): no host
// synchronisation inside the pass. Float32 (and bfloat16 layers above
// device_gemm_max_rows_per_expert, when an operator sets one; by default none) use cuBLAS, which
// needs the row offsets on the host: one stream synchronisation per MoE layer.
//
// Tensor parallelism: with tp_size > 1 the attention output projection and the MLP/MoE output are
// partial sums over this rank's heads and intermediate shard, summed by options.all_reduce on the
// stream (NCCL between agents).
//
// Not thread-safe: one caller at a time.
#ifndef VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_
#define VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/causal_lm.h"
#include "engine/model/dtype.h"
#include "engine/runner/cuda/cuda_forward_options.h"
#include "engine/runner/cuda/cuda_gated_delta_net.h"
#include "engine/runner/cuda/cuda_runner_support.h"
#include "engine/runner/cuda/device_all_reduce.h"
#include "engine/runner/model_runner.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp {

struct CudaGraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t eager_steps = 0;  // forward passes run launch by launch
};

class CudaQwen3MoeModel final : public CausalLm {
 public:
  // `host_model` (a Qwen3-MoE model, e.g. from LoadModel) must outlive the result; its weights are
  // copied to the device. `runner_config` sizes the workspace (it must be the config the
  // ModelRunner gets). `stream` must outlive the result. Unavailable without a device.
  static absl::StatusOr<std::unique_ptr<CudaQwen3MoeModel>> Create(
      const CausalLm* host_model, const RunnerConfig& runner_config, cudaStream_t stream,
      CudaForwardOptions options = {});

  const ModelConfig& config() const override { return host_->config(); }
  const ParallelConfig& parallel() const override { return host_->parallel(); }
  // The host model's layout in this model's dtype (the layout the expert store must have).
  ExpertShardLayout expert_layout() const override {
    ExpertShardLayout layout = host_->expert_layout();
    layout.dtype = options_.dtype;
    return layout;
  }
  int64_t kv_heads_per_rank() const override { return host_->kv_heads_per_rank(); }
  const std::vector<int>& attention_layers() const override { return host_->attention_layers(); }
  const std::vector<int>& moe_layers() const override { return host_->moe_layers(); }

  // As CausalLm::Forward, with `kv` and the expert tables on the device; `batch` and `logits` are
  // host memory. ResourceExhausted for a batch larger than the workspace.
  absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                       Communicator* comm, float* logits) override;

  // Samples on the device (kernels/cuda/sampling.h): only the sampled tokens, their
  // log-probabilities and the alternatives asked for come back to the host, never the
  // [rows, vocab] logits. Steps with logits processing sample from a processed copy of the
  // logits (device memory allocated on first use and grown, by doubling, as batches need it)
  // so that logprobs and alternatives are the raw logits' (kernels::cuda::TopLogprobs).
  bool SamplesOnDevice() const override { return true; }
  absl::Status ForwardAndSample(const ForwardBatch& batch, const KvCacheView& kv,
                                ExpertWeights* experts, Communicator* comm,
                                const StepSampling& sampling,
                                const StepSamplingOutput& out) override;

  // Recurrent state (Qwen3-Next): the host model's slot layout, the slots in device memory.
  int64_t RecurrentStateFloatsPerSlot() const override {
    return host_->RecurrentStateFloatsPerSlot();
  }
  absl::Status ReserveRecurrentStates(int64_t num_slots) override;
  bool SupportsStateSnapshots() const override { return delta_net_ != nullptr; }
  // `from` holds device addresses (KV blocks); the copy is ordered before the next step.
  absl::Status RestoreRecurrentState(int32_t slot, const StateSnapshotView& from,
                                     int64_t num_tokens) override;

  // The host model's weights (the device holds copies of them).
  void ForEachWeight(
      const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const override {
    host_->ForEachWeight(fn);
  }

  cudaStream_t stream() const { return stream_; }
  DType dtype() const { return options_.dtype; }
  const CudaGraphStats& graph_stats() const { return graph_stats_; }
  // Turns CUDA graphs on or off from the next step (benchmarks compare both in one process).
  void set_cuda_graphs(bool on) { options_.cuda_graphs = on; }
  ~CudaQwen3MoeModel() override;
  // Device bytes of the non-expert weights and of the activation workspace (Gated DeltaNet's
  // included; its state slots are not: the memory plan counts those per sequence).
  uint64_t weight_bytes() const { return weights_.bytes(); }
  uint64_t workspace_bytes() const {
    return workspace_.bytes() + (delta_net_ != nullptr ? delta_net_->workspace_bytes() : 0);
  }

 private:
  // Device weights of one decoder layer: norms are float32, matrices of the model's dtype.
  struct Layer {
    bool moe = true;
    bool full_attention = true;
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
    // Full attention (Qwen3-Next's qkv rows: query heads | gate heads | k heads | v heads).
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const void* qkv = nullptr;
    const void* o_proj = nullptr;
    // Gated DeltaNet (Qwen3-Next's other layers).
    CudaGatedDeltaNet::LayerWeights linear;
    const void* router = nullptr;
    // Qwen3-Next's shared expert: gate/up [2 * shared_inter, hidden], down [hidden, shared_inter],
    // gate [1, hidden]; null without one.
    const void* shared_w13 = nullptr;
    const void* shared_w2 = nullptr;
    const void* shared_gate = nullptr;
    const void* mlp_w13 = nullptr;
    const void* mlp_w2 = nullptr;
  };
  // Byte offsets of the step metadata arrays, identical in the pinned host staging area and on
  // the device.
  struct MetaLayout {
    uint64_t token_ids = 0, positions = 0, slot_mapping = 0, query_start_loc = 0, seq_lens = 0,
             block_tables = 0, logits_indices = 0, temperatures = 0, top_ks = 0, top_ps = 0,
             seeds = 0, draw_indices = 0, top_counts = 0, bytes = 0;
  };

  CudaQwen3MoeModel(const CausalLm* host, const RunnerConfig& runner_config, cudaStream_t stream,
                    CudaForwardOptions options);
  absl::Status UploadWeights();
  absl::Status AllocateWorkspace();
  absl::Status UploadMetadata(const ForwardBatch& batch, const StepSampling* sampling);
  // Forward with the logits either copied to `host_logits` or, when `sampling` is set, sampled on
  // the device into `out` (host arrays).
  absl::Status Run(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                   float* host_logits, const StepSampling* sampling, const StepSamplingOutput* out);
  // The forward pass with T = float or kernels::BFloat16, the element type of options_.dtype.
  template <typename T>
  absl::Status RunLayers(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts);
  template <typename T>
  absl::Status Attention(int layer, const ForwardBatch& batch, const KvCacheView& kv);
  template <typename T>
  absl::Status Moe(int layer, int64_t num_tokens, ExpertWeights* experts);
  template <typename T>
  absl::Status DenseMlp(int layer, int64_t num_tokens);
  // out = down(silu(gate(x)) * up(x)) over x_ ([num_tokens, hidden]; out may be x_), through the
  // h13_/act_ scratch: w13 [2 * inter, hidden], w2 [hidden, inter].
  template <typename T>
  absl::Status SiluMlp(const void* w13, const void* w2, int64_t inter, int64_t num_tokens, T* out);
  // Final norm and LM head of the logits rows; copied to `host_logits`, or, when `sample`, the
  // rows sampled with the uploaded parameters (from a processed copy when `processing` is not
  // null), with the raw logits' logprobs and, with `alternatives`, each row's uploaded
  // top_counts alternatives (rows of kMaxTopLogprobs entries) into the pinned results area.
  template <typename T>
  absl::Status Logits(int64_t num_rows, float* host_logits, bool sample,
                      const StepLogitsProcessing* processing, bool alternatives);
  // The pinned results area (sampled_host_) as its four arrays.
  struct SampledHost {
    int32_t* tokens;
    float* logprobs;
    int32_t* top_ids;
    float* top_logprobs;
  };
  SampledHost SampledHostArrays() const;
  // Copies `processing` to processing_dev_ (grown as needed) and runs ProcessLogits on the
  // `rows` rows of `logits` (row stride vocab).
  absl::Status ProcessLogitsOnDevice(float* logits, int64_t rows,
                                     const StepLogitsProcessing& processing);
  // Sums x_ ([num_tokens, hidden]) over the tensor-parallel ranks; nothing at tp_size 1.
  absl::Status AllReduceHidden(int64_t num_tokens);
  // Whether a bfloat16 MoE layer of `rows` (token, expert) rows runs the device-side grouped GEMM.
  bool DeviceExpertGemm(int64_t rows) const;
  // Whether this pass may run as a CUDA graph (see CudaForwardOptions::cuda_graphs).
  bool GraphEligible(const ForwardBatch& batch, const StepSampling* sampling,
                     ExpertWeights* experts) const;
  // The graph step: `batch` with its block table re-laid out on the bucketed stride.
  absl::Status RunGraph(const ForwardBatch& batch, const StepSampling& sampling,
                        const KvCacheView& kv, ExpertWeights* experts);
  void ClearGraphs();

  const CausalLm* const host_;
  RunnerConfig runner_config_;  // max_model_len resolved
  const cudaStream_t stream_;
  CudaForwardOptions options_;
  int64_t max_tokens_ = 0, max_seqs_ = 0, max_blocks_per_seq_ = 0, max_logits_rows_ = 0;
  int64_t q_heads_ = 0, kv_heads_ = 0, dense_inter_ = 0, shared_inter_ = 0;
  bool gated_attention_ = false;  // Qwen3-Next's full attention (output gate, partial rotary)
  int64_t qkv_cols_ = 0;          // columns of the qkv projection
  CudaGatedDeltaNet::Shape delta_shape_;  // Qwen3-Next's linear-attention layers, rank-local

  DeviceBuffer weights_;
  const void* embed_ = nullptr;
  const void* lm_head_ = nullptr;  // embed_ when tied
  const float* final_norm_ = nullptr;
  const float* rope_cache_ = nullptr;
  std::vector<Layer> layers_;

  DeviceBuffer workspace_;
  MetaLayout meta_;
  PinnedBuffer meta_host_;
  PinnedBuffer offsets_host_;  // [num_experts + 1] row offsets of the current MoE layer
  // [max_logits_rows] tokens, [max_logits_rows] logprobs, then [max_logits_rows,
  // kMaxTopLogprobs] alternative ids and their logprobs.
  PinnedBuffer sampled_host_;
  uint8_t* meta_dev_ = nullptr;
  // Activations of options_.dtype, except res_/sel_res_ (the float32 residual stream), the
  // router's float32 outputs and the float32 logits.
  void *x_ = nullptr, *qkv_ = nullptr, *attn_out_ = nullptr, *permuted_ = nullptr;
  void *h13_ = nullptr, *act_ = nullptr, *expert_out_ = nullptr, *sel_x_ = nullptr;
  float *res_ = nullptr, *sel_res_ = nullptr, *router_logits_ = nullptr, *topk_weights_ = nullptr;
  void* shared_out_ = nullptr;     // [max_tokens, hidden]: the shared expert's output
  float* shared_logit_ = nullptr;  // [max_tokens]: its gate's logit per token
  float* logits_dev_ = nullptr;
  float* attn_ws_ = nullptr;       // PagedAttention scratch (bfloat16 kernels)
  void* sample_ws_ = nullptr;      // SampleTokens scratch for max_logits_rows_ rows
  DeviceBuffer processing_dev_;    // ProcessLogits' arrays of the current step (grows)
  DeviceBuffer processed_logits_;  // the processed copy sampling reads (grows to a step's rows)
  int64_t sample_ws_bytes_ = 0;
  int32_t* sampled_tokens_ = nullptr;  // [max_logits_rows_]
  float* sampled_logprobs_ = nullptr;  // [max_logits_rows_]
  // [max_logits_rows_, kMaxTopLogprobs] alternatives (padded past each row's top_counts).
  int32_t* top_ids_ = nullptr;
  float* top_logprobs_ = nullptr;
  int64_t attn_ws_floats_ = 0;
  int32_t *topk_ids_ = nullptr, *expert_offsets_ = nullptr, *row_token_ = nullptr,
          *pair_row_ = nullptr;
  // CUDA graphs by (tokens, block-table stride, whether the step returns alternatives), valid
  // for graph_fingerprint_ (the KV view's and the expert tables' device addresses baked into
  // them).
  using GraphKey = std::tuple<int64_t, int64_t, bool>;
  absl::flat_hash_map<GraphKey, cudaGraphExec_t> graphs_;
  uint64_t graph_fingerprint_ = 0;
  bool graphs_failed_ = false;               // a capture failed: eager from then on
  std::vector<int32_t> graph_block_tables_;  // the step's block table on the bucketed stride
  CudaGraphStats graph_stats_;
  // Qwen3-Next's linear-attention layers and recurrent state; null for qwen3_moe.
  std::unique_ptr<CudaGatedDeltaNet> delta_net_;
  // The acquired MoE layer's host pointer table, typed for cuBLAS's per-expert path.
  std::vector<const float*> f32_w13_, f32_w2_;
  std::vector<const kernels::BFloat16*> bf16_w13_, bf16_w2_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_
