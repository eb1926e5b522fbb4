// The interface between a model definition and the engine that runs it. The runner
// (engine/runner/) builds a ForwardBatch for each step and calls Forward; where the KV cache and
// the expert weights live is described by KvCacheView and ExpertWeights, so neither the model nor
// the runner depends on the memory layer's internals. A new architecture implements CausalLm and
// registers with LoadModel (model_loader.cc); the runner does not change.
#ifndef VAMP_ENGINE_MODEL_CAUSAL_LM_H_
#define VAMP_ENGINE_MODEL_CAUSAL_LM_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/model/dtype.h"
#include "engine/model/model_config.h"
#include "engine/model/parallel.h"
#include "kernels/cpu/attention.h"

namespace vamp {

// A copy of one sequence's whole recurrent state (CausalLm::RecurrentStateFloatsPerSlot() floats,
// laid out as a slot holds them) stored across `chunks` of `chunk_bytes` bytes each: chunk i holds
// bytes [i * chunk_bytes, (i + 1) * chunk_bytes) of it, the last one possibly in part. The runner
// keeps such snapshots in KV blocks that no request's table holds (prefix caching for models with
// recurrent state), so a chunk is a block. Host memory on the CPU backend.
struct StateSnapshotView {
  std::vector<uint8_t*> chunks;
  int64_t chunk_bytes = 0;

  int64_t capacity_bytes() const { return static_cast<int64_t>(chunks.size()) * chunk_bytes; }
  // Copy `count` floats from `data` to floats [offset, offset + count) of the snapshot, or back;
  // the range must lie within capacity_bytes().
  void Write(int64_t offset, const float* data, int64_t count) const;
  void Read(int64_t offset, float* data, int64_t count) const;
};

// A copy of a sequence's recurrent state that a step takes (ForwardBatch::state_captures).
struct StateCapture {
  int32_t seq = 0;  // the sequence's index in the batch
  // The state after this many of the sequence's tokens of this step, 1 up to its step length: a
  // block boundary inside a prefill chunk, or the end of the step.
  int32_t after_tokens = 0;
  StateSnapshotView to;
};

// One step's tokens, packed sequence after sequence. Host memory on the CPU backend.
struct ForwardBatch {
  // [num_tokens] each: the token, its position in its sequence, its KV cache slot
  // (block * block_size + offset; negative = do not store).
  absl::Span<const int32_t> token_ids;
  absl::Span<const int64_t> positions;
  absl::Span<const int64_t> slot_mapping;
  // [num_seqs + 1]: sequence i owns tokens [query_start_loc[i], query_start_loc[i+1]).
  absl::Span<const int32_t> query_start_loc;
  // [num_seqs]: tokens of context of each sequence after this step (cached prefix + new tokens).
  absl::Span<const int32_t> seq_lens;
  int32_t max_seq_len = 0;
  // [num_seqs * block_table_stride]: physical KV block of each logical block.
  absl::Span<const int32_t> block_tables;
  int64_t block_table_stride = 0;
  // Token rows whose logits are computed, in output order (typically each sequence's last token).
  absl::Span<const int32_t> logits_indices;
  // [num_seqs]: the recurrent-state slot of each sequence (CausalLm::ReserveRecurrentStates),
  // distinct within a step; read only by models with recurrent state (Qwen3-Next's linear
  // attention), may be empty for the others.
  absl::Span<const int32_t> state_slots;
  // Copies of recurrent state to take during the step, at most one per sequence: only for models
  // that SupportsStateSnapshots (the runner gives the others none). Each holds exactly the state
  // a step ending after `after_tokens` of the sequence's tokens would leave in its slot. A capture
  // inside a step splits the sequence's recurrence there, so the rest of the step computes what a
  // step restoring that copy and continuing computes, bit for bit (the prefix hit it serves);
  // against the same step without the capture, results differ by float32 rounding only.
  absl::Span<const StateCapture> state_captures;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(seq_lens.size()); }
};

// Where each attention layer's K and V live, as `dtype` elements (float32 on the CPU backend).
// Layer l's K element (block b, token s, kv head h, dim d) is element
// b*block_stride + s*token_stride + h*head_stride + d of k[l] (kernels/cpu/attention.h); k[l] and
// v[l] are null for layers without KV.
struct KvCacheView {
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  DType dtype = DType::kFloat32;
  kernels::cpu::KvCacheStrides strides;
  std::vector<void*> k;
  std::vector<void*> v;
  // The pool's raw bytes, in the view's backend's addresses (host pointers on the host backend):
  // block b is block_bytes bytes at blocks + b * block_bytes. Where the runner stores recurrent-
  // state snapshots, in blocks no request's table holds. Null when the view has no such access.
  uint8_t* blocks = nullptr;
  int64_t block_bytes = 0;
};

// The block-major layout of shared/DESIGN.md ("KV region"): block i holds, for every attention
// layer in order, K then V of block_size tokens, each [block_size, kv_heads, head_dim].
struct BlockMajorKvLayout {
  int64_t block_size = 0;
  int64_t num_layers = 0;  // attention layers
  int64_t kv_heads = 0;    // rank-local
  int64_t head_dim = 0;
  DType dtype = DType::kFloat32;

  int64_t LayerElements() const { return 2 * block_size * kv_heads * head_dim; }
  int64_t BlockElements() const { return num_layers * LayerElements(); }
  int64_t BlockBytes() const { return BlockElements() * DTypeBytes(dtype); }
  // The view of `num_blocks` blocks starting at `base`; `attention_layers[i]` is the decoder layer
  // of the i-th attention layer, `num_decoder_layers` sizes the view's per-layer vectors.
  KvCacheView View(void* base, int64_t num_blocks, absl::Span<const int> attention_layers,
                   int num_decoder_layers) const;
};

// Rank-local expert shard layout: [w13 | w2] with w13 = [2 * inter, hidden] (gate rows, then up
// rows) and w2 = [hidden, inter], inter = moe_intermediate_size / tp_size, stored as `dtype`
// elements (the loader always hands over float32; the store's writer converts).
struct ExpertShardLayout {
  int64_t hidden = 0;
  int64_t inter = 0;  // rank-local intermediate size
  DType dtype = DType::kFloat32;

  int64_t W13Elements() const { return 2 * inter * hidden; }
  int64_t W2Elements() const { return hidden * inter; }
  int64_t Elements() const { return W13Elements() + W2Elements(); }
  int64_t W13Bytes() const { return W13Elements() * DTypeBytes(dtype); }
  int64_t Bytes() const { return Elements() * DTypeBytes(dtype); }
};

// One MoE layer's expert pointer table: w13[e] and w2[e] point at expert e's gate/up
// ([2 * inter, hidden]) and down ([hidden, inter]) weights (elements of the layout's dtype),
// wherever the expert currently is. On the GPU, device_w13/device_w2 hold the same pointers in
// device memory (for kernels that read the table on the device); null where there is no device.
struct ExpertLayerTable {
  const void* const* w13 = nullptr;
  const void* const* w2 = nullptr;
  const void* const* device_w13 = nullptr;
  const void* const* device_w2 = nullptr;
};

// How the forward pass reaches expert weights: a per-layer pointer table, acquired before a MoE
// layer runs and released when it is done (which is when a staging buffer may be reused).
class ExpertWeights {
 public:
  virtual ~ExpertWeights() = default;
  // Called once before each forward pass (staging starts copying the first offloaded layers).
  virtual absl::Status BeginPass() = 0;
  // The pointer table of MoE layer `layer` (num_experts entries each), pointing into the resident
  // region or a staging buffer. Waits until the layer's offloaded experts are staged. Valid until
  // ReleaseLayer(layer).
  virtual absl::StatusOr<ExpertLayerTable> AcquireLayer(int layer) = 0;
  // The layer's experts are no longer read.
  virtual absl::Status ReleaseLayer(int layer) = 0;
  // Called once after each forward pass (also after a failed one).
  virtual absl::Status EndPass() = 0;
  // Whether the pass begun by BeginPass copies experts in (staging), i.e. whether AcquireLayer and
  // ReleaseLayer enqueue work. A pass without copies may be captured once in a CUDA graph and
  // replayed without calling them. Conservative default: yes.
  virtual bool PassStagesExperts() const { return true; }

  // Routed staging (the GPU engine's CudaExpertStoreWeights): a pass of few tokens may copy only
  // the offloaded experts each layer's tokens route to instead of the whole offloaded region.
  // PlanPass (before BeginPass) tells how many tokens the pass runs, which chooses; when
  // PassStagesRouted() the forward pass calls StageRouted(layer, offsets) after the layer's
  // routing (MoePermute's device array of num_experts + 1 row offsets) and before
  // AcquireLayer(layer). Defaults: whole-region staging, nothing to do.
  virtual void PlanPass(int64_t /*num_tokens*/) {}
  virtual bool PassStagesRouted() const { return false; }
  virtual absl::Status StageRouted(int /*layer*/, const int32_t* /*device_expert_offsets*/) {
    return absl::FailedPreconditionError("these expert weights do not stage routed experts");
  }
};

// Where the loader puts expert shards (the ExpertStore, or plain host buffers).
class ExpertWeightSink {
 public:
  virtual ~ExpertWeightSink() = default;
  // Stores expert `expert` of MoE layer `layer`: ExpertShardLayout::Elements() floats (converted
  // to the layout's dtype by the sink).
  virtual absl::Status StoreExpertShard(int layer, int expert, absl::Span<const float> shard) = 0;
};

// Penalties, min_tokens bans and min_p of one step's logits rows, applied to the logits before
// sampling as kernels::cpu::ProcessLogits does (its LogitsProcessing, as host spans): per-row
// arrays of the rows' count, entry_offsets of rows + 1, entry arrays of entry_offsets.back().
struct StepLogitsProcessing {
  absl::Span<const int32_t> entry_offsets;
  absl::Span<const int32_t> entry_tokens;
  absl::Span<const int32_t> entry_counts;
  absl::Span<const uint8_t> entry_flags;
  absl::Span<const float> repetition_penalties;
  absl::Span<const float> frequency_penalties;
  absl::Span<const float> presence_penalties;
  absl::Span<const float> min_ps;
};

// The sampling parameters of one step's logits rows (one entry per row, in
// ForwardBatch::logits_indices order), as kernels::cpu::SampleTokens takes them.
struct StepSampling {
  absl::Span<const float> temperatures;
  absl::Span<const int32_t> top_ks;
  absl::Span<const float> top_ps;
  absl::Span<const uint64_t> seeds;
  absl::Span<const int64_t> draw_indices;
  // Applied to a copy of the logits that only sampling reads; null when no row needs it.
  const StepLogitsProcessing* processing = nullptr;
  // Alternatives per row (kernels::cpu::TopLogprobs' top_counts, each <= max_top_logprobs);
  // empty when max_top_logprobs is 0.
  absl::Span<const int32_t> top_counts;
  // The row stride of the alternatives ForwardAndSample returns: the largest of top_counts.
  int32_t max_top_logprobs = 0;
};

// Where ForwardAndSample writes one step's results: host arrays, one entry (or one
// [max_top_logprobs] row) per logits row.
struct StepSamplingOutput {
  int32_t* tokens = nullptr;
  // The sampled token's log-probability under the raw logits (before processing and temperature).
  float* logprobs = nullptr;
  // [rows, max_top_logprobs] (kernels::cpu::TopLogprobs' out_ids and out_logprobs); may be null
  // when max_top_logprobs is 0.
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
};

// The arguments ForwardAndSample's caller (ModelRunner) owes its implementations: sampling
// parameters for each of batch.logits_indices.size() rows, top_counts for each row only when
// max_top_logprobs > 0 (which is at most kernels::cpu::kMaxTopLogprobs), and, when any row
// samples, every output array it fills. InvalidArgument (or ResourceExhausted past `max_rows`
// rows) naming what is wrong; implementations check it before they run anything.
absl::Status CheckForwardAndSampleArgs(const ForwardBatch& batch, const StepSampling& sampling,
                                       const StepSamplingOutput& out, int64_t max_rows);

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ParallelConfig& parallel() const = 0;
  virtual ExpertShardLayout expert_layout() const = 0;
  // KV heads this rank stores (split across ranks, replicated when fewer than ranks).
  virtual int64_t kv_heads_per_rank() const = 0;
  // Decoder layers with KV (ascending) and with routed experts (ascending).
  virtual const std::vector<int>& attention_layers() const = 0;
  virtual const std::vector<int>& moe_layers() const = 0;

  // Per-sequence recurrent state (linear-attention layers), held by the model in slots that
  // ForwardBatch::state_slots names. A sequence whose step starts at context 0 starts from a zero
  // state; one that continues must use the slot its previous step used, and no other sequence
  // may have used that slot in between. Models without recurrent state keep none.
  //
  // Floats of one slot on this rank (0: no recurrent state).
  virtual int64_t RecurrentStateFloatsPerSlot() const { return 0; }
  // Holds `num_slots` slots (discarding every state held). Models without recurrent state accept
  // any count and hold nothing.
  virtual absl::Status ReserveRecurrentStates(int64_t num_slots) { return absl::OkStatus(); }
  // Snapshots of recurrent state, what prefix caching needs for such a model: whether Forward takes
  // ForwardBatch::state_captures and RestoreRecurrentState works. Default: no.
  virtual bool SupportsStateSnapshots() const { return false; }
  // Makes `slot` hold the state `from` holds, captured after `num_tokens` (> 0) tokens of a
  // sequence: the sequence of the next step that names the slot continues there with num_tokens
  // tokens of context (a prefix-cache hit). The caller vouches that `from` holds such a capture.
  virtual absl::Status RestoreRecurrentState(int32_t slot, const StateSnapshotView& from,
                                             int64_t num_tokens) {
    return absl::UnimplementedError("this model keeps no recurrent-state snapshots");
  }

  // Runs every layer over `batch`: writes the new tokens' K/V into `kv`, reads experts through
  // `experts`, all-reduces through `comm` (may be null when tp_size == 1), and writes logits
  // [batch.logits_indices.size(), vocab_size] to `logits`. The caller validates the batch (token
  // ids, positions, slots and block ids in range). Not thread-safe: one caller at a time.
  virtual absl::Status Forward(const ForwardBatch& batch, const KvCacheView& kv,
                               ExpertWeights* experts, Communicator* comm, float* logits) = 0;

  // Whether ForwardAndSample is available: a model whose logits live on an accelerator samples
  // there, so the runner never copies [rows, vocab] logits to the host. Default: no.
  virtual bool SamplesOnDevice() const { return false; }
  // Forward, then, on the model's device and with the host sampler's semantics (ModelRunner):
  // every logits row processed with kernels::cpu::ProcessLogits (when sampling.processing is set)
  // and sampled with kernels::cpu::SampleTokens' (same tokens, same counter-based draws); the
  // sampled token's log-probability and the rows' alternatives taken from the raw logits with
  // kernels::cpu::TopLogprobs'. Results go to `out` (batch.logits_indices.size() rows). Only
  // called when SamplesOnDevice().
  virtual absl::Status ForwardAndSample(const ForwardBatch& batch, const KvCacheView& kv,
                                        ExpertWeights* experts, Communicator* comm,
                                        const StepSampling& sampling,
                                        const StepSamplingOutput& out) {
    return absl::UnimplementedError("this model samples on the host");
  }

  // Visits every non-expert weight this rank holds, by checkpoint-style name (tests, checksums).
  virtual void ForEachWeight(const std::function<void(absl::string_view name,
                                                      absl::Span<const float> data)>& fn) const = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_CAUSAL_LM_H_
