// The GPU execution path of Qwen3-MoE: a CausalLm whose Forward runs every op with the CUDA
// kernels (kernels/cuda/, float32) on one stream, over the same weights and the same structure as
// the CPU model (engine/model/qwen3_moe.h), which it wraps.
//
// Why a CausalLm: ModelRunner (persistent batch, step metadata, validation, sampling) is
// backend-independent and already talks to the model only through CausalLm::Forward, so the GPU
// runner is ModelRunner driving this model — the same class, the same step semantics, no copy of
// the runner logic:
//
//   CudaStream stream = CudaStream::Create();
//   AgentMemory memory = CreateAgentMemory(cuda_backend, plan, cuda_fence);
//   auto experts = CudaExpertStoreWeights::Create(memory.experts.get(), layout, stream.get());
//   auto host_model = LoadModel(config, options, *experts);      // experts go to VMM regions
//   memory.experts->FinalizeLoad();                              // pinned copies for staging
//   auto model = CudaQwen3MoeModel::Create(host_model.get(), runner_config, stream.get());
//   auto kv = CudaKvRegionView(*memory.kv, config.num_hidden_layers);
//   auto runner = ModelRunner::Create(runner_config, model.get(), experts.get(), nullptr, kv);
//
// Device memory: at Create, every non-expert weight is copied to one device allocation, and one
// activation workspace is allocated for a step of runner_config.max_num_batched_tokens tokens and
// max_num_seqs sequences (plus pinned host staging for the step's metadata). Forward allocates
// nothing. The KV cache is the caller's (k/v pointers of the KvCacheView are device addresses,
// CudaKvRegionView); experts are read through ExpertWeights whose tables hold device pointers and
// whose staging is ordered on this model's stream (CudaExpertStoreWeights).
//
// Per step, Forward copies the metadata host->device in one transfer, runs the layers, and copies
// the logits back; it returns when the stream is idle. Per MoE layer, the per-expert row counts
// are copied back to the host (cuBLAS takes GEMM sizes on the host), one stream synchronisation
// per MoE layer.
//
// Limits: tensor parallel size 1 (the all-reduce of the CPU path is a host Communicator; NCCL is
// not wired yet: Unimplemented for tp_size > 1). Not thread-safe: one caller at a time.
#ifndef VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_
#define VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/causal_lm.h"
#include "engine/runner/cuda/cuda_runner_support.h"
#include "engine/runner/model_runner.h"

namespace vamp {

struct CudaForwardOptions {
  // Rows of logits computed per LM-head launch (return_all_logits asks for every position; they
  // are computed in chunks of this many rows). 0 = the runner's max_num_seqs.
  int64_t max_logits_rows = 0;
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
  ExpertShardLayout expert_layout() const override { return host_->expert_layout(); }
  int64_t kv_heads_per_rank() const override { return host_->kv_heads_per_rank(); }
  const std::vector<int>& attention_layers() const override { return host_->attention_layers(); }
  const std::vector<int>& moe_layers() const override { return host_->moe_layers(); }

  // As CausalLm::Forward, with `kv` and the expert tables on the device; `batch` and `logits` are
  // host memory. ResourceExhausted for a batch larger than the workspace.
  absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv, ExpertWeights* experts,
                       Communicator* comm, float* logits) override;

  // The host model's weights (the device holds copies of them).
  void ForEachWeight(
      const std::function<void(absl::string_view, absl::Span<const float>)>& fn) const override {
    host_->ForEachWeight(fn);
  }

  cudaStream_t stream() const { return stream_; }
  // Device bytes of the non-expert weights and of the activation workspace.
  uint64_t weight_bytes() const { return weights_.bytes(); }
  uint64_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct Layer {
    bool moe = true;
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
    const float* qkv = nullptr;
    const float* o_proj = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* router = nullptr;
    const float* mlp_w13 = nullptr;
    const float* mlp_w2 = nullptr;
  };
  // Byte offsets of the step metadata arrays, identical in the pinned host staging area and on
  // the device.
  struct MetaLayout {
    uint64_t token_ids = 0, positions = 0, slot_mapping = 0, query_start_loc = 0, seq_lens = 0,
             block_tables = 0, logits_indices = 0, bytes = 0;
  };

  CudaQwen3MoeModel(const CausalLm* host, const RunnerConfig& runner_config, cudaStream_t stream,
                    CudaForwardOptions options);
  absl::Status UploadWeights();
  absl::Status AllocateWorkspace();
  absl::Status UploadMetadata(const ForwardBatch& batch);
  absl::Status Attention(int layer, const ForwardBatch& batch, const KvCacheView& kv);
  absl::Status Moe(int layer, int64_t num_tokens, ExpertWeights* experts);
  absl::Status DenseMlp(int layer, int64_t num_tokens);
  absl::Status Logits(int64_t num_rows, float* logits);

  const CausalLm* const host_;
  RunnerConfig runner_config_;  // max_model_len resolved
  const cudaStream_t stream_;
  CudaForwardOptions options_;
  int64_t max_tokens_ = 0, max_seqs_ = 0, max_blocks_per_seq_ = 0, max_logits_rows_ = 0;
  int64_t q_heads_ = 0, kv_heads_ = 0, dense_inter_ = 0;

  DeviceBuffer weights_;
  const float* embed_ = nullptr;
  const float* lm_head_ = nullptr;  // embed_ when tied
  const float* final_norm_ = nullptr;
  const float* rope_cache_ = nullptr;
  std::vector<Layer> layers_;

  DeviceBuffer workspace_;
  MetaLayout meta_;
  PinnedBuffer meta_host_;
  PinnedBuffer offsets_host_;  // [num_experts + 1] row offsets of the current MoE layer
  uint8_t* meta_dev_ = nullptr;
  float *x_ = nullptr, *res_ = nullptr, *qkv_ = nullptr, *attn_out_ = nullptr;
  float *router_logits_ = nullptr, *topk_weights_ = nullptr, *permuted_ = nullptr;
  float *h13_ = nullptr, *act_ = nullptr, *expert_out_ = nullptr;
  float *sel_x_ = nullptr, *sel_res_ = nullptr, *logits_dev_ = nullptr;
  int32_t *topk_ids_ = nullptr, *expert_offsets_ = nullptr, *row_token_ = nullptr,
          *pair_row_ = nullptr;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_CUDA_QWEN3_MOE_H_
