// ModelRunner: executes model steps for one tensor-parallel rank. It keeps a persistent batch of
// live requests updated from each step's diffs (step_input.h), builds the step's metadata
// (positions, KV slot mapping, block tables, the rows whose logits are needed), runs the model's
// forward pass over a mixed batch of prefill chunks and decodes, and samples one token for every
// request that has consumed all of its known tokens.
//
// A request that asks for prompt log-probabilities (RunnerSamplingParams::prompt_logprobs) also
// gets the logits rows of the prompt positions a step computes, scored against the next prompt
// token (StepOutput::prompt_logprobs); such a step samples on the host even when the model
// samples on its device. Nothing else changes: the model computes the rows it is given.
//
// Every rank of a tensor-parallel group runs its own ModelRunner over the same StepInputs; they
// sample identical tokens (identical logits after the all-reduce, identical per-request seeds).
//
// A model with recurrent state (CausalLm::RecurrentStateFloatsPerSlot, Qwen3-Next) gets one state
// slot per persistent-batch slot (reserved by Create, so a fresh runner forgets every state) and
// each sequence's slot in ForwardBatch::state_slots. A prefix-cache hit on such a model (a new or
// resumed request with num_computed_tokens > 0) resumes from a snapshot of the state after exactly
// those tokens: the controller has a step copy a request's state into KV blocks no table holds
// (ScheduledRequest::capture_state) and names them when a later request hits there
// (restore_state). The runner remembers what each capture holds (its blocks, token count and a
// fingerprint of the tokens) until one of its blocks is handed to a request, captured into again
// or unmapped, and refuses, before anything changes, a hit that no such snapshot serves: never a
// restore of a state that is not the hit's. Models that keep no snapshots
// (CausalLm::SupportsStateSnapshots) refuse every hit; the agent tells the controller
// (InitResponse.prefix_caching_unsupported), which then serves them without prefix caching.
//
// Not thread-safe: one thread calls ExecuteStep at a time.
#ifndef VAMP_ENGINE_RUNNER_MODEL_RUNNER_H_
#define VAMP_ENGINE_RUNNER_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kv/kv_region.h"
#include "engine/model/causal_lm.h"
#include "engine/runner/persistent_batch.h"
#include "engine/runner/step_input.h"

namespace vamp {

struct RunnerConfig {
  // Tokens per KV block (must match the controller's KV manager and the KV region).
  int64_t block_size = 16;
  // Requests the persistent batch holds.
  int64_t max_num_seqs = 256;
  // Tokens one step may compute.
  int64_t max_num_batched_tokens = 8192;
  // Longest sequence (prompt + outputs); 0 = the model's max_position_embeddings.
  int64_t max_model_len = 0;
  // Base of the sampling seeds of requests without their own seed.
  uint64_t seed = 0;
};

class ModelRunner {
 public:
  // `model` and `experts` must outlive the runner; `comm` is the host communicator the model's
  // Forward gets (null when tp_size == 1, or when the model sums on the device itself). `kv` is
  // the rank's KV cache; its block_size must equal config.block_size. InvalidArgument (naming the
  // field) for inconsistent settings.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const RunnerConfig& config,
                                                             CausalLm* model,
                                                             ExpertWeights* experts,
                                                             Communicator* comm, KvCacheView kv);

  // Applies the step's diffs and runs it. A StepInput that is inconsistent with the runner's
  // state (unknown or duplicate request, block id outside the pool, token id outside the vocab,
  // more tokens than are known or than the block table covers, ...) is rejected with an error
  // naming the request and the field, before anything changes.
  absl::StatusOr<StepOutput> ExecuteStep(const StepInput& input);

  // The KV pool changed size (expert offload/restore moved pages); block addresses never move.
  absl::Status SetKvCache(KvCacheView kv);

  const RunnerConfig& config() const { return config_; }
  const PersistentBatch& batch() const { return batch_; }
  const KvCacheView& kv_cache() const { return kv_; }
  // KV blocks one snapshot of a request's recurrent state fills on this rank; 0 when the model
  // keeps no snapshots (no recurrent state, or CausalLm::SupportsStateSnapshots is false).
  int64_t snapshot_blocks() const { return snapshot_blocks_; }
  // Snapshots the runner holds (captured and not invalidated since).
  size_t num_snapshots() const { return snapshots_.size(); }

 private:
  // What a capture left in its blocks.
  struct Snapshot {
    int32_t num_tokens = 0;
    size_t fingerprint = 0;  // of the request's first num_tokens tokens (Fingerprint)
    std::vector<int32_t> block_ids;
  };

  ModelRunner(const RunnerConfig& config, CausalLm* model, ExpertWeights* experts,
              Communicator* comm, KvCacheView kv, int64_t max_blocks_per_seq,
              int64_t snapshot_blocks);
  absl::Status Validate(const StepInput& input) const;
  // A request that starts past token 0 (`num_computed_tokens` of `tokens` cached: a prefix-cache
  // hit) on a model with recurrent state needs `restore` to be a snapshot this runner holds of
  // exactly those tokens: FailedPrecondition otherwise, and for a model without snapshots.
  absl::Status CheckPrefixHit(absl::string_view what, RunnerRequestId id,
                              int32_t num_computed_tokens, absl::Span<const int32_t> tokens,
                              const StateSnapshotBlocks& restore) const;
  // Where a snapshot's blocks are, for the model.
  StateSnapshotView SnapshotView(const StateSnapshotBlocks& blocks) const;
  static size_t Fingerprint(absl::Span<const int32_t> tokens, int32_t n);
  // Forgets the snapshots any of `blocks` holds (they are about to hold something else).
  void ForgetSnapshotsIn(absl::Span<const int32_t> blocks);
  absl::Status ApplyDiffs(const StepInput& input);

  const RunnerConfig config_;
  CausalLm* const model_;
  ExpertWeights* const experts_;
  Communicator* const comm_;
  KvCacheView kv_;
  PersistentBatch batch_;
  const int64_t snapshot_blocks_;
  // Snapshots by their first block, and the first block of the snapshot each stored block holds.
  absl::flat_hash_map<int32_t, Snapshot> snapshots_;
  absl::flat_hash_map<int32_t, int32_t> snapshot_of_block_;

  // Step metadata, reused across steps.
  std::vector<int32_t> token_ids_, query_start_loc_, seq_lens_, block_tables_, logits_indices_;
  // The persistent-batch slot of each scheduled request: its recurrent-state slot.
  std::vector<int32_t> state_slots_;
  std::vector<StateCapture> state_captures_;
  std::vector<int64_t> positions_, slot_mapping_;
  std::vector<float> logits_;
  // Sampling inputs and workspaces.
  std::vector<float> temperatures_, top_ps_, sample_values_, logprobs_;
  std::vector<int32_t> top_ks_, sample_indices_, sampled_;
  // Per sampling row: alternatives asked for; then [rows, max] top ids and logprobs.
  std::vector<int32_t> top_counts_, top_ids_;
  std::vector<float> top_logprobs_;
  std::vector<uint64_t> seeds_;
  std::vector<int64_t> draw_indices_;
  // The step's ProcessLogits arrays (StepLogitsProcessing), empty when no row needs them.
  std::vector<int32_t> entry_offsets_, entry_tokens_, entry_counts_;
  std::vector<uint8_t> entry_flags_;
  std::vector<float> repetition_penalties_, frequency_penalties_, presence_penalties_, min_ps_;
};

// The KvCacheView of `region`'s currently mapped blocks, for the `engine` ("CPU", "GPU") that
// needs the region on memory backend `backend` ("host", "cuda"): block addresses are that
// backend's addresses, the element type follows the geometry's dtype_bytes (4: float32, 2:
// bfloat16). FailedPrecondition for another backend or an element size the engine does not store
// (the CPU engine: float32 only).
absl::StatusOr<KvCacheView> KvRegionView(const KvRegion& region, int num_decoder_layers,
                                         absl::string_view backend, absl::string_view engine);

// The KvCacheView of a KvRegion on the host memory backend (block addresses are host pointers),
// covering its currently mapped blocks. FailedPrecondition for another backend or a non-float32
// geometry.
absl::StatusOr<KvCacheView> HostKvRegionView(const KvRegion& region, int num_decoder_layers);

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_MODEL_RUNNER_H_
