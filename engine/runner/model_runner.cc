#include "engine/runner/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/integer_math.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/sampling.h"

namespace vamp {
namespace {

// splitmix64: the default per-request seed from the runner seed and the request id.
uint64_t MixSeed(uint64_t seed, uint64_t id) {
  uint64_t x = seed ^ (id * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const RunnerConfig& config,
                                                                 CausalLm* model,
                                                                 ExpertWeights* experts,
                                                                 Communicator* comm,
                                                                 KvCacheView kv) {
  auto bad = [](absl::string_view field, auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("runner config field '", field, "' ", what...));
  };
  if (model == nullptr) return absl::InvalidArgumentError("ModelRunner needs a model");
  const ModelConfig& mc = model->config();
  if (config.block_size < 1) return bad("block_size", "must be >= 1, got ", config.block_size);
  if (config.max_num_seqs < 1)
    return bad("max_num_seqs", "must be >= 1, got ", config.max_num_seqs);
  if (config.max_num_batched_tokens < 1) {
    return bad("max_num_batched_tokens", "must be >= 1, got ", config.max_num_batched_tokens);
  }
  if (config.max_model_len < 0 || config.max_model_len > mc.max_position_embeddings) {
    return bad("max_model_len",
               "must be in [0, max_position_embeddings = ", mc.max_position_embeddings, "], got ",
               config.max_model_len);
  }
  if (kv.block_size != config.block_size) {
    return bad("block_size", config.block_size, " differs from the KV cache's ", kv.block_size);
  }
  // A model may sum across ranks on its own (the GPU model through a device all-reduce), so a
  // missing host communicator is the model's to refuse; a mismatched one is always an error.
  if (model->parallel().tp_size > 1 && comm != nullptr &&
      (comm->size() != model->parallel().tp_size || comm->rank() != model->parallel().tp_rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", model->parallel().tp_rank, " of ",
                     model->parallel().tp_size, " needs a communicator of that rank and size"));
  }
  if (!model->moe_layers().empty() && experts == nullptr) {
    return absl::InvalidArgumentError("ModelRunner needs expert weights for a MoE model");
  }
  RunnerConfig c = config;
  if (c.max_model_len == 0) c.max_model_len = mc.max_position_embeddings;
  const int64_t max_blocks = CeilDiv(c.max_model_len, c.block_size);
  // A model with recurrent state (Qwen3-Next's linear attention) keeps one slot per persistent-
  // batch slot: a request's state lives in its slot from its first token to its last.
  int64_t snapshot_blocks = 0;
  if (const int64_t floats = model->RecurrentStateFloatsPerSlot(); floats > 0) {
    VAMP_RETURN_IF_ERROR(model->ReserveRecurrentStates(c.max_num_seqs));
    const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
    if (model->SupportsStateSnapshots() && kv.blocks != nullptr && kv.block_bytes > 0) {
      snapshot_blocks = CeilDiv(bytes, kv.block_bytes);
    }
    VAMP_LOG(INFO) << mc.model_type << " keeps per-request recurrent state: " << bytes / 1024
                   << " KiB per request, " << c.max_num_seqs << " requests; "
                   << (snapshot_blocks > 0
                           ? absl::StrCat("prefix-cache hits resume from snapshots of ",
                                          snapshot_blocks, " KV blocks")
                           : std::string("no snapshots: a prefix-cache hit is refused"));
  }
  return std::unique_ptr<ModelRunner>(
      new ModelRunner(c, model, experts, comm, std::move(kv), max_blocks, snapshot_blocks));
}

ModelRunner::ModelRunner(const RunnerConfig& config, CausalLm* model, ExpertWeights* experts,
                         Communicator* comm, KvCacheView kv, int64_t max_blocks_per_seq,
                         int64_t snapshot_blocks)
    : config_(config),
      model_(model),
      experts_(experts),
      comm_(comm),
      kv_(std::move(kv)),
      batch_(config.max_num_seqs, max_blocks_per_seq),
      snapshot_blocks_(snapshot_blocks) {}

absl::Status ModelRunner::SetKvCache(KvCacheView kv) {
  if (kv.block_size != config_.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache block size ", kv.block_size, " differs from the runner's ", config_.block_size));
  }
  if (snapshot_blocks_ > 0 && kv.block_bytes != kv_.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV block of ", kv.block_bytes, " bytes differs from the runner's ", kv_.block_bytes));
  }
  // Snapshots in blocks the pool no longer has are gone.
  std::vector<int32_t> gone;
  for (const auto& [block, first] : snapshot_of_block_) {
    if (block >= kv.num_blocks) gone.push_back(block);
  }
  ForgetSnapshotsIn(gone);
  kv_ = std::move(kv);
  return absl::OkStatus();
}

size_t ModelRunner::Fingerprint(absl::Span<const int32_t> tokens, int32_t n) {
  return absl::Hash<absl::Span<const int32_t>>()(tokens.subspan(0, static_cast<size_t>(n)));
}

void ModelRunner::ForgetSnapshotsIn(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    auto it = snapshot_of_block_.find(b);
    if (it == snapshot_of_block_.end()) continue;
    auto snapshot = snapshots_.find(it->second);
    for (int32_t held : snapshot->second.block_ids) snapshot_of_block_.erase(held);
    snapshots_.erase(snapshot);
  }
}

StateSnapshotView ModelRunner::SnapshotView(const StateSnapshotBlocks& blocks) const {
  StateSnapshotView view;
  view.chunk_bytes = kv_.block_bytes;
  for (int32_t b : blocks.block_ids) view.chunks.push_back(kv_.blocks + b * kv_.block_bytes);
  return view;
}

absl::Status ModelRunner::CheckPrefixHit(absl::string_view what, RunnerRequestId id,
                                         int32_t num_computed_tokens,
                                         absl::Span<const int32_t> tokens,
                                         const StateSnapshotBlocks& restore) const {
  if (model_->RecurrentStateFloatsPerSlot() == 0) {
    if (!restore.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", id, ": restore_state for a model without recurrent state"));
    }
    return absl::OkStatus();
  }
  if (num_computed_tokens == 0) {
    if (!restore.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", id, ": restore_state without a prefix-cache hit"));
    }
    return absl::OkStatus();
  }
  const std::string hit = absl::StrCat(what, " ", id, ": num_computed_tokens ", num_computed_tokens,
                                       " (a prefix-cache hit) cannot be "
                                       "served: ");
  if (snapshot_blocks_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        hit, model_->config().model_type,
        " keeps per-request linear-attention state and this engine keeps no snapshots of it; "
        "serve it with prefix caching off"));
  }
  if (restore.num_tokens != num_computed_tokens || restore.block_ids.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        hit, "it needs restore_state, a snapshot of the recurrent state after exactly those ",
        num_computed_tokens, " tokens; got one after ", restore.num_tokens, " tokens in ",
        restore.block_ids.size(), " blocks"));
  }
  auto it = snapshots_.find(restore.block_ids.front());
  if (it == snapshots_.end() || it->second.block_ids != restore.block_ids) {
    return absl::FailedPreconditionError(absl::StrCat(
        hit, "blocks [", absl::StrJoin(restore.block_ids, ", "),
        "] hold no snapshot of recurrent state (never captured here, or reused since)"));
  }
  if (it->second.num_tokens != num_computed_tokens ||
      it->second.fingerprint != Fingerprint(tokens, num_computed_tokens)) {
    return absl::FailedPreconditionError(
        absl::StrCat(hit, "the snapshot in blocks [", absl::StrJoin(restore.block_ids, ", "),
                     "] holds the state after ", it->second.num_tokens,
                     " tokens of another context, not after these ", num_computed_tokens));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Validate(const StepInput& input) const {
  const int64_t vocab = model_->config().vocab_size;
  const int64_t bs = config_.block_size;
  // The state of every request the step touches, as it will be after the diffs.
  struct State {
    bool live = false;
    int64_t num_tokens = 0;
    int64_t num_computed = 0;
    int64_t num_blocks = 0;
  };
  absl::flat_hash_map<RunnerRequestId, State> state;
  auto current = [&](RunnerRequestId id) -> State& {
    auto [it, inserted] = state.try_emplace(id);
    if (inserted) {
      const int slot = batch_.SlotOf(id);
      if (slot >= 0) {
        it->second = {true, static_cast<int64_t>(batch_.tokens(slot).size()),
                      batch_.num_computed(slot), batch_.num_blocks(slot)};
      }
    }
    return it->second;
  };
  auto check_blocks = [&](RunnerRequestId id, absl::string_view field,
                          absl::Span<const int32_t> blocks) -> absl::Status {
    for (int32_t b : blocks) {
      if (b < 0 || b >= kv_.num_blocks) {
        return absl::OutOfRangeError(absl::StrCat("request ", id, ": ", field, " has block ", b,
                                                  " outside the KV pool of ", kv_.num_blocks,
                                                  " blocks"));
      }
    }
    return absl::OkStatus();
  };
  int64_t live = batch_.num_requests();
  for (RunnerRequestId id : input.finished_ids) {
    State& s = current(id);
    if (s.live) --live;
    s = State{};
  }
  for (const NewRequestData& r : input.new_requests) {
    State& s = current(r.id);
    if (s.live) {
      return absl::AlreadyExistsError(absl::StrCat("new request ", r.id, " is already running"));
    }
    if (r.prompt_token_ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("new request ", r.id, ": prompt_token_ids is empty"));
    }
    for (int32_t t : r.prompt_token_ids) {
      if (t < 0 || t >= vocab) {
        return absl::OutOfRangeError(absl::StrCat("new request ", r.id,
                                                  ": prompt_token_ids has "
                                                  "token ",
                                                  t, " outside the vocabulary of ", vocab));
      }
    }
    if (static_cast<int64_t>(r.prompt_token_ids.size()) > config_.max_model_len) {
      return absl::OutOfRangeError(
          absl::StrCat("new request ", r.id, ": ", r.prompt_token_ids.size(),
                       " prompt tokens exceed max_model_len ", config_.max_model_len));
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.id, "block_ids", r.block_ids));
    if (static_cast<int64_t>(r.block_ids.size()) > batch_.max_blocks_per_seq()) {
      return absl::OutOfRangeError(absl::StrCat("new request ", r.id, ": ", r.block_ids.size(),
                                                " block_ids exceed the ",
                                                batch_.max_blocks_per_seq(), " a request holds"));
    }
    if (r.num_computed_tokens < 0 ||
        r.num_computed_tokens > static_cast<int64_t>(r.prompt_token_ids.size()) ||
        r.num_computed_tokens > static_cast<int64_t>(r.block_ids.size()) * bs) {
      return absl::OutOfRangeError(absl::StrCat("new request ", r.id, ": num_computed_tokens ",
                                                r.num_computed_tokens,
                                                " exceeds its tokens or blocks"));
    }
    VAMP_RETURN_IF_ERROR(CheckPrefixHit("new request", r.id, r.num_computed_tokens,
                                        r.prompt_token_ids, r.restore_state));
    if (!(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "new request ", r.id, ": sampling.top_p must be in (0, 1], got ", r.sampling.top_p));
    }
    const RunnerSamplingParams& sp = r.sampling;
    if (!(sp.repetition_penalty > 0.0f) || !std::isfinite(sp.repetition_penalty) ||
        !std::isfinite(sp.frequency_penalty) || !std::isfinite(sp.presence_penalty) ||
        !(sp.min_p >= 0.0f && sp.min_p <= 1.0f) || sp.min_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "new request ", r.id, ": repetition_penalty must be > 0, the other penalties finite, "
          "min_p in [0, 1] and min_tokens >= 0; got ", sp.repetition_penalty, ", ",
          sp.frequency_penalty, ", ", sp.presence_penalty, ", ", sp.min_p, ", ", sp.min_tokens));
    }
    for (int32_t id : sp.min_tokens_banned_ids) {
      if (id < 0 || id >= vocab) {
        return absl::OutOfRangeError(absl::StrCat("new request ", r.id, ": banned token ", id,
                                                  " is outside the vocabulary of ", vocab));
      }
    }
    s = {true, static_cast<int64_t>(r.prompt_token_ids.size()), r.num_computed_tokens,
         static_cast<int64_t>(r.block_ids.size())};
    if (++live > config_.max_num_seqs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("new request ", r.id, " exceeds max_num_seqs ", config_.max_num_seqs));
    }
  }
  for (const CachedRequestData& r : input.cached_requests) {
    State& s = current(r.id);
    if (!s.live) {
      return absl::NotFoundError(absl::StrCat("cached request ", r.id, " is not running"));
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.id, "new_block_ids", r.new_block_ids));
    const int64_t blocks = (r.resumed_from_preemption ? 0 : s.num_blocks) +
                           static_cast<int64_t>(r.new_block_ids.size());
    if (blocks > batch_.max_blocks_per_seq()) {
      return absl::OutOfRangeError(absl::StrCat("cached request ", r.id, ": ", blocks,
                                                " blocks exceed the ", batch_.max_blocks_per_seq(),
                                                " a request holds"));
    }
    if (r.resumed_from_preemption) {
      if (r.num_computed_tokens < 0 || r.num_computed_tokens > s.num_tokens ||
          r.num_computed_tokens > blocks * bs) {
        return absl::OutOfRangeError(absl::StrCat("resumed request ", r.id,
                                                  ": num_computed_tokens ", r.num_computed_tokens,
                                                  " exceeds its tokens or blocks"));
      }
      const int slot = batch_.SlotOf(r.id);
      VAMP_RETURN_IF_ERROR(CheckPrefixHit(
          "resumed request", r.id, r.num_computed_tokens,
          slot >= 0 ? absl::MakeConstSpan(batch_.tokens(slot)) : absl::Span<const int32_t>(),
          r.restore_state));
    } else if (!r.restore_state.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cached request ", r.id, ": restore_state on a request not resumed"));
    } else if (r.num_computed_tokens != s.num_computed) {
      return absl::FailedPreconditionError(
          absl::StrCat("cached request ", r.id, ": num_computed_tokens ", r.num_computed_tokens,
                       " but the runner has computed ", s.num_computed));
    }
    s.num_blocks = blocks;
    s.num_computed = r.num_computed_tokens;
  }
  if (static_cast<int64_t>(input.scheduled.size()) > config_.max_num_seqs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        input.scheduled.size(), " scheduled requests exceed max_num_seqs ", config_.max_num_seqs));
  }
  int64_t total = 0;
  absl::flat_hash_set<RunnerRequestId> seen;
  for (const ScheduledRequest& r : input.scheduled) {
    State& s = current(r.id);
    if (!s.live) {
      return absl::NotFoundError(absl::StrCat("scheduled request ", r.id, " is not running"));
    }
    if (!seen.insert(r.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, " is scheduled twice"));
    }
    if (r.num_tokens < 1 || s.num_computed + r.num_tokens > s.num_tokens) {
      return absl::OutOfRangeError(
          absl::StrCat("scheduled request ", r.id, ": num_tokens ", r.num_tokens, " after ",
                       s.num_computed, " computed exceeds its ", s.num_tokens, " known tokens"));
    }
    const int64_t end = s.num_computed + r.num_tokens;
    if (end > config_.max_model_len) {
      return absl::OutOfRangeError(absl::StrCat("scheduled request ", r.id, " reaches ", end,
                                                " tokens, past max_model_len ",
                                                config_.max_model_len));
    }
    if (CeilDiv(end, bs) > s.num_blocks) {
      return absl::OutOfRangeError(absl::StrCat("scheduled request ", r.id, " needs ",
                                                CeilDiv(end, bs), " blocks for ", end,
                                                " tokens but has ", s.num_blocks));
    }
    if (const StateSnapshotBlocks& c = r.capture_state; !c.empty()) {
      if (snapshot_blocks_ == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "scheduled request ", r.id, ": capture_state, but this model keeps no snapshots"));
      }
      if (c.num_tokens <= s.num_computed || c.num_tokens > end) {
        return absl::OutOfRangeError(
            absl::StrCat("scheduled request ", r.id, ": capture_state after ", c.num_tokens,
                         " tokens is outside the step's (", s.num_computed, ", ", end, "]"));
      }
      if (static_cast<int64_t>(c.block_ids.size()) < snapshot_blocks_) {
        return absl::InvalidArgumentError(
            absl::StrCat("scheduled request ", r.id, ": capture_state has ", c.block_ids.size(),
                         " blocks; a snapshot takes ", snapshot_blocks_));
      }
      VAMP_RETURN_IF_ERROR(check_blocks(r.id, "capture_state.block_ids", c.block_ids));
      absl::flat_hash_set<int32_t> distinct(c.block_ids.begin(), c.block_ids.end());
      if (distinct.size() != c.block_ids.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "scheduled request ", r.id, ": capture_state.block_ids holds a block twice"));
      }
    }
    total += r.num_tokens;
  }
  if (total > config_.max_num_batched_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat("the step schedules ", total,
                                                     " tokens, more than max_num_batched_tokens ",
                                                     config_.max_num_batched_tokens));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::ApplyDiffs(const StepInput& input) {
  // Prefix-cache hits take their snapshots before anything of this step is written (a snapshot's
  // blocks handed to a request this step would be a controller's fault; the restore still reads
  // what was captured).
  auto restore = [&](int slot, int32_t num_computed, const StateSnapshotBlocks& from) {
    if (from.empty() || num_computed == 0) return absl::OkStatus();
    return model_->RestoreRecurrentState(slot, SnapshotView(from), num_computed);
  };
  for (RunnerRequestId id : input.finished_ids) batch_.Remove(id);
  for (const NewRequestData& r : input.new_requests) {
    const uint64_t seed =
        r.sampling.seed.has_value() ? *r.sampling.seed : MixSeed(config_.seed, r.id);
    VAMP_ASSIGN_OR_RETURN(const int slot, batch_.Add(r, seed));
    VAMP_RETURN_IF_ERROR(restore(slot, r.num_computed_tokens, r.restore_state));
  }
  for (const CachedRequestData& r : input.cached_requests) {
    const int slot = batch_.SlotOf(r.id);
    if (r.resumed_from_preemption) {
      VAMP_RETURN_IF_ERROR(batch_.ReplaceBlocks(slot, r.new_block_ids));
      VAMP_RETURN_IF_ERROR(restore(slot, r.num_computed_tokens, r.restore_state));
    } else {
      VAMP_RETURN_IF_ERROR(batch_.AppendBlocks(slot, r.new_block_ids));
    }
    batch_.set_num_computed(slot, r.num_computed_tokens);
  }
  // Blocks handed to requests, or captured into this step, no longer hold what they held.
  if (!snapshots_.empty()) {
    for (const NewRequestData& r : input.new_requests) ForgetSnapshotsIn(r.block_ids);
    for (const CachedRequestData& r : input.cached_requests) ForgetSnapshotsIn(r.new_block_ids);
    for (const ScheduledRequest& r : input.scheduled) {
      ForgetSnapshotsIn(r.capture_state.block_ids);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> ModelRunner::ExecuteStep(const StepInput& input) {
  VAMP_RETURN_IF_ERROR(Validate(input));
  VAMP_RETURN_IF_ERROR(ApplyDiffs(input));

  StepOutput out;
  const int64_t bs = config_.block_size;
  const int64_t vocab = model_->config().vocab_size;
  const size_t num_seqs = input.scheduled.size();
  token_ids_.clear();
  positions_.clear();
  slot_mapping_.clear();
  seq_lens_.clear();
  logits_indices_.clear();
  query_start_loc_.assign(1, 0);
  int64_t max_blocks = 1;
  int32_t max_seq_len = 0;
  std::vector<int> slots(num_seqs);
  state_slots_.resize(num_seqs);
  // Per sequence: whether it samples, and the row of its last token among the logits rows.
  std::vector<int> sample_row(num_seqs, -1);
  // Sequences that asked for prompt log-probabilities and compute prompt positions with a
  // successor in the prompt: positions [first_position - 1, first_position - 1 + count) give the
  // log-probabilities of tokens [first_position, first_position + count), from the `count`
  // logits rows starting at `row`.
  struct PromptRows {
    size_t seq;
    int32_t first_position;
    int32_t count;
    int row;
  };
  std::vector<PromptRows> prompt_rows;
  for (size_t i = 0; i < num_seqs; ++i) {
    const int slot = batch_.SlotOf(input.scheduled[i].id);
    slots[i] = slot;
    state_slots_[i] = slot;
    const int32_t nc = batch_.num_computed(slot);
    const int32_t n = input.scheduled[i].num_tokens;
    const std::vector<int32_t>& tokens = batch_.tokens(slot);
    const int32_t* row = batch_.block_row(slot);
    const int32_t first_row = static_cast<int32_t>(token_ids_.size());
    for (int32_t pos = nc; pos < nc + n; ++pos) {
      token_ids_.push_back(tokens[pos]);
      positions_.push_back(pos);
      slot_mapping_.push_back(static_cast<int64_t>(row[pos / bs]) * bs + pos % bs);
    }
    query_start_loc_.push_back(static_cast<int32_t>(token_ids_.size()));
    seq_lens_.push_back(nc + n);
    max_seq_len = std::max(max_seq_len, nc + n);
    max_blocks = std::max<int64_t>(max_blocks, batch_.num_blocks(slot));
    const bool samples = nc + n == static_cast<int32_t>(tokens.size());
    // Prompt positions before the last prompt token: their rows score the prompt's next token
    // (the last prompt position's row is the sampling row, which scores the first output).
    const int32_t scored =
        batch_.sampling(slot).prompt_logprobs
            ? std::max(0, std::min(nc + n, batch_.num_prompt_tokens(slot) - 1) - nc)
            : 0;
    const int first_logits_row = static_cast<int>(logits_indices_.size());
    if (input.return_all_logits) {
      for (int32_t r = 0; r < n; ++r) logits_indices_.push_back(first_row + r);
      if (samples) sample_row[i] = static_cast<int>(logits_indices_.size()) - 1;
    } else {
      for (int32_t r = 0; r < scored; ++r) logits_indices_.push_back(first_row + r);
      if (samples) {
        logits_indices_.push_back(first_row + n - 1);
        sample_row[i] = static_cast<int>(logits_indices_.size()) - 1;
      }
    }
    if (scored > 0) prompt_rows.push_back({i, nc + 1, scored, first_logits_row});
  }
  block_tables_.assign(num_seqs * max_blocks, 0);
  for (size_t i = 0; i < num_seqs; ++i) {
    std::copy_n(batch_.block_row(slots[i]), batch_.num_blocks(slots[i]),
                block_tables_.begin() + i * max_blocks);
  }
  out.num_tokens = static_cast<int64_t>(token_ids_.size());
  if (num_seqs == 0) return out;

  ForwardBatch fb;
  fb.token_ids = token_ids_;
  fb.positions = positions_;
  fb.slot_mapping = slot_mapping_;
  fb.query_start_loc = query_start_loc_;
  fb.seq_lens = seq_lens_;
  fb.max_seq_len = max_seq_len;
  fb.block_tables = block_tables_;
  fb.block_table_stride = max_blocks;
  fb.logits_indices = logits_indices_;
  fb.state_slots = state_slots_;
  state_captures_.clear();
  for (size_t i = 0; i < num_seqs; ++i) {
    const StateSnapshotBlocks& c = input.scheduled[i].capture_state;
    if (c.empty()) continue;
    state_captures_.push_back({static_cast<int32_t>(i),
                               c.num_tokens - (seq_lens_[i] - input.scheduled[i].num_tokens),
                               SnapshotView(c)});
  }
  fb.state_captures = state_captures_;

  // Sampling parameters of the sequences that sample, in logits-row order (they do not depend on
  // the logits: the draw index is the position of the token being generated, stable across
  // batching and recomputation).
  temperatures_.clear();
  top_ks_.clear();
  top_ps_.clear();
  seeds_.clear();
  draw_indices_.clear();
  top_counts_.clear();
  std::vector<size_t> sampling_seqs;
  for (size_t i = 0; i < num_seqs; ++i) {
    if (sample_row[i] < 0) continue;
    const int slot = slots[i];
    const RunnerSamplingParams& p = batch_.sampling(slot);
    temperatures_.push_back(p.temperature);
    top_ks_.push_back(p.top_k);
    top_ps_.push_back(p.top_p);
    seeds_.push_back(batch_.seed(slot));
    draw_indices_.push_back(static_cast<int64_t>(batch_.tokens(slot).size()));
    top_counts_.push_back(
        static_cast<int32_t>(std::min<int64_t>(p.num_top_logprobs, model_->config().vocab_size)));
    sampling_seqs.push_back(i);
  }
  const int32_t max_top =
      top_counts_.empty() ? 0 : *std::max_element(top_counts_.begin(), top_counts_.end());
  const int64_t m = static_cast<int64_t>(sampling_seqs.size());
  sampled_.resize(m);
  logprobs_.resize(m);
  // Penalties, min_tokens bans and min_p, for every sampling row once any row needs them.
  bool process = false;
  for (size_t i : sampling_seqs) process |= batch_.sampling(slots[i]).needs_processing();
  entry_offsets_.assign(1, 0);
  entry_tokens_.clear();
  entry_counts_.clear();
  entry_flags_.clear();
  repetition_penalties_.clear();
  frequency_penalties_.clear();
  presence_penalties_.clear();
  min_ps_.clear();
  if (process) {
    for (size_t i : sampling_seqs) {
      const RunnerSamplingParams& p = batch_.sampling(slots[i]);
      batch_.AppendProcessingEntries(slots[i], &entry_tokens_, &entry_counts_, &entry_flags_);
      entry_offsets_.push_back(static_cast<int32_t>(entry_tokens_.size()));
      repetition_penalties_.push_back(p.repetition_penalty);
      frequency_penalties_.push_back(p.frequency_penalty);
      presence_penalties_.push_back(p.presence_penalty);
      min_ps_.push_back(p.min_p);
    }
  }
  const StepLogitsProcessing processing{entry_offsets_,       entry_tokens_,
                                        entry_counts_,        entry_flags_,
                                        repetition_penalties_, frequency_penalties_,
                                        presence_penalties_,  min_ps_};

  // Without return_all_logits or prompt rows the logits rows are exactly the sampling rows, in
  // order: a model that samples on its device does so and returns only tokens, logprobs and
  // alternatives. Otherwise the step's logits come to the host and it samples there (with the
  // same semantics, CausalLm::ForwardAndSample).
  const bool device_sampling =
      !input.return_all_logits && prompt_rows.empty() && model_->SamplesOnDevice();
  top_ids_.resize(m * max_top);
  top_logprobs_.resize(m * max_top);
  auto start = std::chrono::steady_clock::now();
  if (device_sampling) {
    // top_counts only when some row asks for alternatives (StepSampling's contract).
    const absl::Span<const int32_t> top_counts =
        max_top > 0 ? absl::Span<const int32_t>(top_counts_) : absl::Span<const int32_t>();
    const StepSampling sampling{temperatures_, top_ks_,       top_ps_,
                                seeds_,        draw_indices_, process ? &processing : nullptr,
                                top_counts,    max_top};
    VAMP_RETURN_IF_ERROR(model_->ForwardAndSample(
        fb, kv_, experts_, comm_, sampling,
        {sampled_.data(), logprobs_.data(), top_ids_.data(), top_logprobs_.data()}));
  } else {
    logits_.resize(logits_indices_.size() * vocab);
    VAMP_RETURN_IF_ERROR(model_->Forward(fb, kv_, experts_, comm_, logits_.data()));
  }
  out.forward_us = MicrosSince(start);
  // The captures hold what the step computed: hits may restore them from now on.
  for (const StateCapture& c : state_captures_) {
    const ScheduledRequest& r = input.scheduled[c.seq];
    ForgetSnapshotsIn(r.capture_state.block_ids);
    const int32_t first = r.capture_state.block_ids.front();
    for (int32_t b : r.capture_state.block_ids) snapshot_of_block_[b] = first;
    snapshots_[first] = {r.capture_state.num_tokens,
                         Fingerprint(batch_.tokens(slots[c.seq]), r.capture_state.num_tokens),
                         r.capture_state.block_ids};
  }

  // Every scheduled request has computed its tokens, sampled or not.
  for (size_t i = 0; i < num_seqs; ++i) {
    batch_.set_num_computed(slots[i],
                            batch_.num_computed(slots[i]) + input.scheduled[i].num_tokens);
  }

  start = std::chrono::steady_clock::now();
  if (!device_sampling) {
    std::vector<float> rows;
    rows.reserve(m * vocab);
    for (size_t i : sampling_seqs) {
      rows.insert(rows.end(), logits_.begin() + sample_row[i] * vocab,
                  logits_.begin() + (sample_row[i] + 1) * vocab);
    }
    // Penalties, bans and min_p shape what is sampled, on a copy: logprobs and alternatives are
    // the raw model's (vLLM's default logprobs mode), whatever the request's processing.
    std::vector<float> processed;
    if (process) {
      processed = rows;
      kernels::cpu::ProcessLogits(
          processed.data(), vocab, m, vocab,
          {entry_offsets_.data(), entry_tokens_.data(), entry_counts_.data(), entry_flags_.data(),
           repetition_penalties_.data(), frequency_penalties_.data(), presence_penalties_.data(),
           min_ps_.data(), temperatures_.data()});
    }
    // Without processing or alternatives, SampleTokens' own logprob is the raw one; otherwise
    // TopLogprobs computes it on the raw rows with the alternatives' normaliser.
    const bool separate_logprobs = process || max_top > 0;
    sample_indices_.resize(m * vocab);
    sample_values_.resize(m * vocab);
    kernels::cpu::SampleTokens(process ? processed.data() : rows.data(), vocab, m, vocab,
                               temperatures_.data(), top_ks_.data(), top_ps_.data(), seeds_.data(),
                               draw_indices_.data(), sample_indices_.data(), sample_values_.data(),
                               sampled_.data(), separate_logprobs ? nullptr : logprobs_.data());
    if (separate_logprobs) {
      kernels::cpu::TopLogprobs(rows.data(), vocab, m, vocab, top_counts_.data(), max_top,
                                top_ids_.data(), top_logprobs_.data(), sampled_.data(),
                                logprobs_.data());
    }
  }
  // Prompt log-probabilities: each prompt row scores the prompt token after it, under the raw
  // logits, as TopLogprobs scores sampled tokens (before AppendToken changes the token lists).
  for (const PromptRows& p : prompt_rows) {
    const int slot = slots[p.seq];
    const int32_t k = static_cast<int32_t>(
        std::min<int64_t>(batch_.sampling(slot).num_top_logprobs, model_->config().vocab_size));
    PromptLogprobs& lp = out.prompt_logprobs.emplace_back();
    lp.id = input.scheduled[p.seq].id;
    lp.first_position = p.first_position;
    lp.logprobs.resize(p.count);
    lp.top_token_ids.resize(static_cast<size_t>(p.count) * k);
    lp.top_logprobs.resize(static_cast<size_t>(p.count) * k);
    const std::vector<int32_t> counts(p.count, k);
    kernels::cpu::TopLogprobs(logits_.data() + static_cast<int64_t>(p.row) * vocab, vocab, p.count,
                              vocab, counts.data(), k, lp.top_token_ids.data(),
                              lp.top_logprobs.data(), batch_.tokens(slot).data() + p.first_position,
                              lp.logprobs.data());
  }
  for (int64_t j = 0; j < m; ++j) {
    const size_t i = sampling_seqs[j];
    batch_.AppendToken(slots[i], sampled_[j]);
    SampledToken& s = out.sampled.emplace_back(
        SampledToken{input.scheduled[i].id, sampled_[j], logprobs_[j], {}, {}});
    const auto top = top_ids_.begin() + j * max_top;
    const auto top_lp = top_logprobs_.begin() + j * max_top;
    s.top_token_ids.assign(top, top + top_counts_[j]);
    s.top_logprobs.assign(top_lp, top_lp + top_counts_[j]);
  }
  out.sample_us = MicrosSince(start);

  if (input.return_all_logits) {
    for (size_t i = 0; i < num_seqs; ++i) {
      out.logits.emplace_back(logits_.begin() + query_start_loc_[i] * vocab,
                              logits_.begin() + query_start_loc_[i + 1] * vocab);
    }
  }
  return out;
}

absl::StatusOr<KvCacheView> KvRegionView(const KvRegion& region, int num_decoder_layers,
                                         absl::string_view backend, absl::string_view engine) {
  const KvBlockGeometry& g = region.geometry();
  if (region.region().pool()->backend()->name() != backend) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", engine, " engine needs the KV region on the ", backend,
                     " memory backend, not '", region.region().pool()->backend()->name(), "'"));
  }
  const bool bf16_ok = engine != "CPU";
  if (g.dtype_bytes != 4 && !(bf16_ok && g.dtype_bytes == 2)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", engine, " engine stores KV in ", bf16_ok ? "float32 or bfloat16" : "float32",
        "; the KV geometry has ", g.dtype_bytes, "-byte elements"));
  }
  KvCacheView view;
  view.block_size = g.block_size;
  view.num_blocks = region.num_blocks();
  view.dtype = g.dtype_bytes == 2 ? DType::kBFloat16 : DType::kFloat32;
  view.strides.block_stride = static_cast<int64_t>(g.block_bytes) / g.dtype_bytes;
  view.strides.token_stride = g.kv_heads_per_rank * g.head_dim;
  view.strides.head_stride = g.head_dim;
  view.k.assign(num_decoder_layers, nullptr);
  view.v.assign(num_decoder_layers, nullptr);
  auto* base = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(region.base()));
  for (int layer = 0; layer < num_decoder_layers; ++layer) {
    if (!g.HasKv(layer)) continue;
    view.k[layer] = base + g.KOffset(layer);
    view.v[layer] = base + g.VOffset(layer);
  }
  view.blocks = base;
  view.block_bytes = static_cast<int64_t>(g.block_bytes);
  return view;
}

absl::StatusOr<KvCacheView> HostKvRegionView(const KvRegion& region, int num_decoder_layers) {
  return KvRegionView(region, num_decoder_layers, "host", "CPU");
}

}  // namespace vamp
