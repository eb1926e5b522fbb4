#include "controller/core/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/integer_math.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerConfig& config,
                                                             const Clock* clock,
                                                             std::unique_ptr<MemoryArbiter> arbiter,
                                                             ExpertOffloader* offloader) {
  VAMP_RETURN_IF_ERROR(config.Validate());
  if (clock == nullptr) return absl::InvalidArgumentError("Scheduler: clock is null");
  if (arbiter == nullptr) return absl::InvalidArgumentError("Scheduler: arbiter is null");
  return std::unique_ptr<Scheduler>(new Scheduler(config, clock, std::move(arbiter), offloader));
}

Scheduler::Scheduler(const SchedulerConfig& config, const Clock* clock,
                     std::unique_ptr<MemoryArbiter> arbiter, ExpertOffloader* offloader)
    : config_(config),
      clock_(clock),
      arbiter_(std::move(arbiter)),
      offloader_(offloader),
      kv_(config.num_blocks, config.block_size, config.enable_prefix_caching,
          BlockHasher(config.prefix_cache_hash_key0, config.prefix_cache_hash_key1),
          config.recurrent_state_blocks, config.snapshot_outputs),
      waiting_(config.policy) {
  // Evicted hashes feed the arbiter's ghost list, when it keeps one.
  kv_.pool().set_eviction_listener([this](const BlockHash& hash, bool anchored) {
    if (ReuseTracker* tracker = arbiter_->reuse_tracker()) tracker->OnEvicted(hash, anchored);
  });
  if (ReuseTracker* tracker = arbiter_->reuse_tracker()) {
    tracker->set_hits_need_snapshots(config.recurrent_state_blocks > 0);
  }
}

void Scheduler::SyncReuseGeometry() {
  ReuseTracker* tracker = arbiter_->reuse_tracker();
  if (tracker == nullptr) return;
  const OffloadState e = OffloadStateNow();
  tracker->SetGeometry(e.blocks_per_group, e.offloaded_groups, e.max_groups);
}

// ---------------------------------------------------------------------------------------------
// Requests

std::vector<BlockHash> Scheduler::HashPromptBlocks(const SchedulerConfig& config,
                                                   absl::Span<const TokenId> prompt,
                                                   absl::string_view cache_salt) {
  std::vector<BlockHash> hashes;
  if (!config.enable_prefix_caching || config.block_size <= 0) return hashes;
  const BlockHasher hasher(config.prefix_cache_hash_key0, config.prefix_cache_hash_key1);
  hasher.ExtendChain(prompt, config.block_size, cache_salt, prompt.size() / config.block_size,
                     &hashes);
  return hashes;
}

absl::Status Scheduler::AddRequest(RequestSpec spec) {
  if (requests_.contains(spec.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", spec.id, " is already live"));
  }
  const size_t prompt_len = spec.prompt_token_ids.size();
  if (prompt_len == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", spec.id, ": prompt_token_ids must not be empty"));
  }
  if (prompt_len >= static_cast<size_t>(config_.max_model_len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", spec.id, ": prompt_token_ids has ", prompt_len, " tokens; max_model_len is ",
        config_.max_model_len, " and at least one output token must fit"));
  }
  // Any negative id sets the sign bit of the OR of all ids: a branch-free pass that vectorizes
  // (a 32k-token prompt is checked on the scheduling thread), then the first one for the message.
  TokenId any_sign = 0;
  for (TokenId t : spec.prompt_token_ids) any_sign |= t;
  if (any_sign < 0) {
    for (size_t i = 0; i < prompt_len; ++i) {
      if (spec.prompt_token_ids[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", spec.id, ": prompt_token_ids[", i, "] is negative"));
      }
    }
  }
  if (absl::Status s = spec.sampling_params.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("request ", spec.id, ": ", s.message()));
  }
  if (const std::vector<BlockHash>& hashes = spec.prompt_block_hashes; !hashes.empty()) {
    const size_t bs = static_cast<size_t>(config_.block_size);
    const size_t full = prompt_len / bs;
    if (hashes.size() != full) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", spec.id, ": prompt_block_hashes has ", hashes.size(),
                       " hashes; the prompt has ", full, " full blocks of ", bs, " tokens"));
    }
    // Two block hashes (≈ 0.1 µs) instead of all: the first covers the hash key and the cache
    // salt, the last the prompt's tail, so hashes computed with another key, salt, block size or
    // prompt are caught unless the prompts differ only in between.
    const absl::Span<const TokenId> prompt = spec.prompt_token_ids;
    const BlockHasher& hasher = kv_.hasher();
    const bool first_ok =
        hasher.Hash(BlockHash{}, prompt.subspan(0, bs), spec.cache_salt) == hashes.front();
    const bool last_ok =
        full == 1 ||
        hasher.Hash(hashes[full - 2], prompt.subspan((full - 1) * bs, bs), "") == hashes.back();
    if (!first_ok || !last_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", spec.id,
          ": prompt_block_hashes are not the hashes of this prompt and cache_salt under the "
          "scheduler's block_size and prefix_cache_hash_key (Scheduler::HashPromptBlocks)"));
    }
  }
  const int64_t arrival = spec.arrival_micros.value_or(clock_->NowMicros());
  const RequestId id = spec.id;
  auto request = std::make_unique<Request>(std::move(spec), arrival, next_seq_++);
  waiting_.AddArrival(request.get());
  requests_.emplace(id, std::move(request));
  ++counters_.num_requests_added;
  return absl::OkStatus();
}

absl::Status Scheduler::AbortRequest(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not live"));
  }
  Request* r = it->second.get();
  if (r->status() == RequestStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), r));
  } else {
    VAMP_CHECK(waiting_.Remove(r)) << "request " << id << " is neither running nor waiting";
    if (r->status() == RequestStatus::kPreempted) --num_waiting_preempted_;
  }
  kv_.Free(*r);
  r->Finish(FinishReason::kAbort);
  if (r->known_to_agents()) pending_finished_ids_.push_back(id);
  // A preemption a reverted plan left to deliver is covered by the finished id.
  undelivered_preempted_ids_.erase(
      std::remove(undelivered_preempted_ids_.begin(), undelivered_preempted_ids_.end(), id),
      undelivered_preempted_ids_.end());
  ++counters_.num_aborted;
  requests_.erase(it);
  return absl::OkStatus();
}

const Request* Scheduler::FindRequest(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

// ---------------------------------------------------------------------------------------------
// Scheduling

bool Scheduler::FitsBaseline(const Request& r, int64_t num_tokens) const {
  const int64_t offloaded_blocks =
      static_cast<int64_t>(offloader_->OffloadedGroups()) * offloader_->BlocksPerGroup();
  const KvBlockPool& pool = kv_.pool();
  const int64_t new_blocks = std::max<int64_t>(
      0, CeilDiv(num_tokens, config_.block_size) - static_cast<int64_t>(r.block_ids().size()));
  // Blocks no eviction can free: requests' blocks and the snapshots they hold (and a shrinking
  // tail's withdrawn blocks).
  const int64_t held =
      static_cast<int64_t>(pool.num_blocks()) - pool.num_free_uncached() - pool.num_free_cached();
  return held + new_blocks <= pool.num_blocks() - offloaded_blocks;
}

OffloadState Scheduler::OffloadStateNow() const {
  OffloadState info;
  if (offloader_ == nullptr) return info;
  info.experts_per_group = offloader_->ExpertsPerGroup();
  info.experts_per_layer = offloader_->ExpertsPerLayer();
  info.offloaded_groups = offloader_->OffloadedGroups();
  info.restore_pending = restore_pending_groups_ > 0;
  info.restore_pending_groups = restore_pending_groups_;
  info.blocks_per_group = offloader_->BlocksPerGroup();
  info.max_groups = info.offloaded_groups + offloader_->RemainingGroups();
  info.staged_bytes_per_group = offloader_->StagedBytesPerGroup();
  if (kv_.pool().shrink_pending() || !offloader_->Ready()) return info;
  info.available = true;
  info.remaining_groups = offloader_->RemainingGroups();
  return info;
}

absl::Status Scheduler::ReplaceArbiter(std::unique_ptr<MemoryArbiter> arbiter) {
  if (arbiter == nullptr) return absl::InvalidArgumentError("ReplaceArbiter: null arbiter");
  if (step_in_flight()) {
    return absl::FailedPreconditionError("ReplaceArbiter: a step is in flight");
  }
  if (restore_pending_groups_ > 0) CancelRestore();
  arbiter_ = std::move(arbiter);
  return absl::OkStatus();
}

void Scheduler::CancelRestore() {
  absl::Status s = kv_.pool().CancelShrink();
  VAMP_CHECK(s.ok()) << s;  // a pending restore always has a pending shrink
  restore_pending_groups_ = 0;
  ++counters_.num_restores_cancelled;
}

void Scheduler::StepBoundary() {
  KvBlockPool& pool = kv_.pool();
  if (restore_pending_groups_ > 0) {
    if (pool.shrink_outstanding() > 0) {
      // Requests still hold blocks of the withdrawn tail: the arbiter may preempt them rather
      // than keep paying the offload tax until they finish.
      const ArbiterContext context(pool, running_, counters_, config_, step_, clock_->NowMicros(),
                                   OffloadStateNow(), num_waiting());
      ArbiterRecord record;
      record.step = step_;
      record.plan = arbiter_->PreemptForRestore(context);
      for (RequestId id : record.plan.preempt) {
        auto it = requests_.find(id);
        if (it == requests_.end() || it->second->status() != RequestStatus::kRunning) {
          VAMP_LOG(WARNING) << arbiter_->name() << " arbiter chose request " << id
                            << " to preempt for a restore, which is not running";
          continue;
        }
        Preempt(it->second.get());
        ++record.requests_preempted;
      }
      if (record.requests_preempted > 0) {
        record.for_restore = true;
        record.requester = record.plan.preempt.front();
        record.requester_running = true;
        step_decisions_.push_back(std::move(record));
      }
      if (pool.shrink_outstanding() > 0) return;
    }
    if (!offloader_->Ready()) return;  // commits once the agents can remap again
    const int32_t before = pool.num_blocks();
    absl::Status s = pool.CommitShrink();
    VAMP_CHECK(s.ok()) << s;
    counters_.num_restored_blocks += before - pool.num_blocks();
    s = RestoreGroups(restore_pending_groups_);
    if (!s.ok()) {
      // The blocks have left the pool already; their pages stay unused until the offloader can
      // take them. Nothing else depends on them, so serving goes on.
      VAMP_LOG(ERROR) << "restoring " << restore_pending_groups_ << " expert groups failed: " << s;
    } else {
      ++counters_.num_restores;
    }
    restore_pending_groups_ = 0;
    return;  // one capacity change per step boundary
  }
  const ArbiterContext context(pool, running_, counters_, config_, step_, clock_->NowMicros(),
                               OffloadStateNow(), num_waiting());
  const int32_t groups = arbiter_->OnStepBoundary(context);
  if (groups <= 0 || offloader_ == nullptr || pool.shrink_pending() || !offloader_->Ready()) {
    return;
  }
  const int32_t offloaded = context.offload().offloaded_groups;
  if (offloaded <= 0) return;
  const int32_t n = std::min(groups, offloaded);
  const int32_t blocks = offloader_->BlocksRemovedByRestore(n);
  if (blocks <= 0) return;
  if (absl::Status s = BeginShrinkPool(blocks); !s.ok()) {
    VAMP_LOG(WARNING) << arbiter_->name() << " arbiter asked to restore " << n
                      << " expert groups: " << s;
    return;
  }
  restore_pending_groups_ = n;
  ++counters_.num_restores_started;
  ArbiterRecord record;
  record.step = step_;
  record.restore_groups = n;
  record.plan.choice = "restore";
  record.plan.tax = arbiter_->LastRestoreComparison();
  step_decisions_.push_back(std::move(record));
}

void Scheduler::Preempt(Request* victim) {
  auto pos = std::find(running_.begin(), running_.end(), victim);
  VAMP_CHECK(pos != running_.end()) << "preempting request " << victim->id() << " not running";
  const size_t index = static_cast<size_t>(pos - running_.begin());
  running_.erase(pos);
  if (index < running_cursor_) --running_cursor_;
  // A victim already planned in this step gives its tokens back. One admitted in this very step
  // never reached the agents as running, so they are not told about its preemption.
  bool admitted_this_step = false;
  for (auto it = scheduled_.begin(); it != scheduled_.end(); ++it) {
    if (it->request == victim) {
      token_budget_ += it->num_new_tokens;
      admitted_this_step = it->admitted;
      scheduled_.erase(it);
      break;
    }
  }
  kv_.Free(*victim);
  victim->set_num_computed_tokens(0);
  victim->set_status(RequestStatus::kPreempted);
  victim->count_preemption();
  victim->set_queued_since_micros(clock_->NowMicros());
  waiting_.AddPreempted(victim);
  ++num_waiting_preempted_;
  ++counters_.num_preemptions;
  ++step_num_preempted_;
  if (victim->known_to_agents() && !admitted_this_step) {
    step_preempted_ids_.push_back(victim->id());
  }
}

Scheduler::Room Scheduler::EnsureBlocks(Request* request, int32_t num_total_tokens, bool running) {
  for (;;) {
    const int32_t gap = kv_.Gap(*request, num_total_tokens);
    if (gap == 0) {
      kv_.AllocateSlots(*request, num_total_tokens);
      return Room::kOk;
    }
    ++counters_.num_arbiter_calls;
    const ArbiterContext context(kv_.pool(), running_, counters_, config_, step_,
                                 clock_->NowMicros(), OffloadStateNow(), num_waiting());
    MemoryGap need;
    need.blocks = gap;
    need.requester = request;
    need.requester_running = running;
    need.num_new_tokens = num_total_tokens - request->num_computed_tokens();
    ArbiterRecord record;
    record.step = step_;
    record.requester = request->id();
    record.requester_running = running;
    record.gap_blocks = gap;
    record.plan = arbiter_->Decide(context, need);
    const ArbiterPlan& plan = record.plan;

    bool restore_cancelled = false;
    if (plan.cancel_restore && restore_pending_groups_ > 0) {
      CancelRestore();
      restore_cancelled = true;
    }
    if (plan.offload_groups > 0) {
      const OffloadState info = OffloadStateNow();
      if (!info.available || info.remaining_groups <= 0) {
        VAMP_LOG(WARNING) << arbiter_->name() << " arbiter asked to offload " << plan.offload_groups
                          << " groups but offloading is unavailable";
      } else {
        const int32_t groups = std::min(plan.offload_groups, info.remaining_groups);
        absl::StatusOr<int32_t> added = offloader_->Offload(groups);
        if (!added.ok()) {
          VAMP_LOG(WARNING) << "offloading " << groups << " groups failed: " << added.status();
        } else if (*added > 0) {
          absl::Status grown = kv_.pool().Grow(*added);
          VAMP_CHECK(grown.ok()) << grown;  // no shrink is pending (OffloadStateNow() checked)
          record.blocks_added = *added;
          ++counters_.num_offloads;
          counters_.num_offloaded_blocks += *added;
          SyncReuseGeometry();
        }
      }
    }
    if (plan.evict_blocks > 0) {
      record.blocks_evicted = kv_.pool().EvictCached(plan.evict_blocks);
      counters_.num_evicted_blocks += record.blocks_evicted;
    }
    bool requester_preempted = false;
    for (RequestId id : plan.preempt) {
      auto it = requests_.find(id);
      if (it == requests_.end() || it->second->status() != RequestStatus::kRunning) {
        VAMP_LOG(WARNING) << arbiter_->name() << " arbiter chose request " << id
                          << " to preempt, which is not running";
        continue;
      }
      if (ReuseTracker* tracker = arbiter_->reuse_tracker()) {
        // What a pool covering the gap would have saved: the victim's computed tokens past its
        // cached blocks (those blocks stay cached; if they are evicted before it resumes, the
        // ghost list counts them).
        const Request& v = *it->second;
        tracker->RecordPreemption(
            clock_->NowMicros(), gap,
            v.num_computed_tokens() - v.num_cached_blocks() * config_.block_size);
      }
      Preempt(it->second.get());
      ++record.requests_preempted;
      if (it->second.get() == request) requester_preempted = true;
    }
    const bool progress =
        restore_cancelled ||
        record.blocks_added + record.blocks_evicted + record.requests_preempted > 0;
    step_decisions_.push_back(std::move(record));
    if (requester_preempted) return Room::kRequesterPreempted;
    if (!progress) return Room::kNoRoom;
  }
}

void Scheduler::PlanCapture(Scheduled& s) {
  Request* r = s.request;
  const int32_t point =
      kv_.SnapshotPoint(*r, s.num_computed_before, s.num_computed_before + s.num_new_tokens);
  if (point == 0) return;
  int32_t evicted = 0;
  bool taken = false;
  const bool ok = kv_.EnsureSnapshot(*r, &evicted, &taken);
  counters_.num_evicted_blocks += evicted;
  if (!ok) {
    ++counters_.num_state_captures_skipped;
    return;
  }
  s.capture_tokens = point;
  s.snapshot_taken = taken;
}

void Scheduler::RecordAdmission(const Scheduled& s, int64_t now) {
  Request* r = s.request;
  const int64_t queued = std::max<int64_t>(0, now - r->queued_since_micros());
  const bool resumed = r->num_preemptions() > 0;
  if (ReuseTracker* tracker = arbiter_->reuse_tracker(); tracker != nullptr && !resumed) {
    tracker->RecordQueueTime(now, queued);
  }
  PrefixCacheStats& pc = counters_.prefix_cache;
  const bool lookup = kv_.pool().caching_enabled() && !r->skip_prefix_cache_reads();
  if (resumed) {
    ++counters_.num_resumed;
    counters_.total_resume_delay_micros += queued;
    if (lookup) {
      ++pc.preempted_requests;
      pc.preempted_query_tokens += r->num_tokens();
      pc.preempted_hit_tokens += s.num_computed_before;
    }
  } else {
    ++counters_.num_admitted;
    counters_.total_queue_micros += queued;
    if (lookup) {
      ++pc.requests;
      pc.query_tokens += r->num_tokens();
      pc.hit_tokens += s.num_computed_before;
    }
  }
  if (r->num_cached_tokens() < 0) r->set_num_cached_tokens(s.num_computed_before);
  step_queue_times_.push_back({r->id(), queued, resumed});
}

absl::StatusOr<StepPlan> Scheduler::Schedule() {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Schedule: step ", step_, " is in flight; apply its output first"));
  }
  ++step_;
  kv_.pool().SetStep(step_);
  scheduled_.clear();
  // Preemptions of a reverted plan go out with this one (before any of this step's).
  step_preempted_ids_ = std::move(undelivered_preempted_ids_);
  undelivered_preempted_ids_.clear();
  last_plan_ = LastPlan{};
  last_plan_.counters_before = counters_;
  step_num_preempted_ = 0;
  step_decisions_.clear();
  step_queue_times_.clear();
  StepBoundary();
  SyncReuseGeometry();
  token_budget_ = config_.max_num_batched_tokens;
  const int32_t threshold = config_.long_prefill_token_threshold;

  // 1. Running requests, in admission order: decode tokens and the next chunks of prefills.
  running_cursor_ = 0;
  bool running_stalled = false;
  while (running_cursor_ < running_.size() && token_budget_ > 0) {
    Request* r = running_[running_cursor_];
    int32_t n = r->num_uncomputed_tokens();
    if (threshold > 0) n = std::min(n, threshold);
    n = std::min(n, token_budget_);
    if (n <= 0) {
      ++running_cursor_;
      continue;
    }
    const size_t first_new_block = r->block_ids().size();
    const int32_t computed = r->num_computed_tokens();
    // Preemptions inside keep running_cursor_ pointing at r.
    if (EnsureBlocks(r, computed + n, /*running=*/true) != Room::kOk) {
      running_stalled = true;
      break;
    }
    scheduled_.push_back(
        {r, n, computed, first_new_block, /*admitted=*/false, RequestStatus::kRunning});
    PlanCapture(scheduled_.back());
    token_budget_ -= n;
    ++running_cursor_;
  }

  // 2. Waiting requests, unless this step already had to preempt or a running request could not
  //    get memory (admitting more would hand newcomers the blocks that running or preempted
  //    requests are waiting for).
  bool memory_blocked = false;
  // admit_within_baseline: whether this step's admissions are held to the baseline pool.
  const bool hold_to_baseline = config_.admit_within_baseline && offloader_ != nullptr &&
                                !arbiter_->ConcurrencyPays(clock_->NowMicros());
  while (!running_stalled && step_num_preempted_ == 0 && !waiting_.empty() && token_budget_ > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.Front();
    const PrefixHit hit = kv_.FindCachedPrefix(*r);
    // The reuse tracker reads the hit blocks' LRU depths before AcquirePrefix takes them out of
    // the free queue. Resumed requests are left out: their recompute is counted as preemption.
    ReuseTracker* tracker = arbiter_->reuse_tracker();
    const bool track = tracker != nullptr && r->status() != RequestStatus::kPreempted &&
                       !r->skip_prefix_cache_reads();
    const ReuseTracker::HitNeeds needs =
        track ? tracker->MeasureHit(kv_.pool(), hit, step_) : ReuseTracker::HitNeeds{};
    int32_t n = r->num_tokens() - hit.num_tokens;
    if (threshold > 0) n = std::min(n, threshold);
    if (!config_.enable_chunked_prefill && n > token_budget_) break;
    n = std::min(n, token_budget_);
    // Take the hit blocks first so the arbiter cannot evict what this request is about to reuse.
    kv_.AcquirePrefix(*r, hit);
    r->set_num_computed_tokens(hit.num_tokens);
    if (hold_to_baseline && !FitsBaseline(*r, hit.num_tokens + n)) {
      // As a static split would: the head waits for memory, for running requests to finish. The
      // tracker sees the step as a static split's (memory-blocked, not queued for compute), so
      // the compute-bound share decays while admissions are held and the hold lifts unless the
      // other steps keep requests queued for compute. No memory wait is recorded: the pool is
      // already larger than the one that holds the head back.
      kv_.Free(*r);
      r->set_num_computed_tokens(0);
      ++counters_.num_admissions_held;
      memory_blocked = true;
      break;
    }
    if (EnsureBlocks(r, hit.num_tokens + n, /*running=*/false) != Room::kOk) {
      if (tracker != nullptr) {
        // Everybody in the queue waits this step because the head found no memory.
        tracker->RecordMemoryWait(clock_->NowMicros(), kv_.Gap(*r, hit.num_tokens + n),
                                  waiting_.size());
      }
      // Releasing the hit blocks makes them the most recently used cached blocks: a request at
      // the head of the queue is about to reuse them, so LRU should keep them longest.
      kv_.Free(*r);
      r->set_num_computed_tokens(0);
      memory_blocked = true;
      break;
    }
    if (track)
      tracker->RecordAdmission(clock_->NowMicros(), needs, *r, config_.block_size, kv_.hasher());
    VAMP_CHECK(waiting_.Remove(r));
    const RequestStatus waited_as = r->status();
    if (waited_as == RequestStatus::kPreempted) --num_waiting_preempted_;
    r->set_status(RequestStatus::kRunning);
    running_.push_back(r);
    scheduled_.push_back({r, n, hit.num_tokens, 0, /*admitted=*/true, waited_as});
    PlanCapture(scheduled_.back());
    token_budget_ -= n;
  }

  if (ReuseTracker* tracker = arbiter_->reuse_tracker()) {
    // Requests left waiting for compute (the token budget or max_num_seqs, not memory): while
    // they queue, every µs a step stalls delays them all, so extra KV is worth less.
    tracker->RecordQueueState(clock_->NowMicros(), !waiting_.empty() && !memory_blocked &&
                                                       !running_stalled &&
                                                       step_num_preempted_ == 0);
  }

  // 3. The plan.
  StepPlan plan;
  plan.step = step_;
  const int64_t now = clock_->NowMicros();
  last_plan_.requests.reserve(scheduled_.size());
  const KvBlockPool& pool = kv_.pool();
  for (const Scheduled& s : scheduled_) {
    Request* r = s.request;
    last_plan_.requests.push_back(
        {r->id(), r->seq(), s, r->known_to_agents(), r->num_cached_tokens()});
    if (s.admitted) RecordAdmission(s, now);
    // Recurrent state: the snapshot a hit restores (its last block anchors it, and the request
    // holds that block, so it cannot go), and the one the step captures into.
    const std::vector<BlockId>* restore = nullptr;
    if (s.admitted && s.num_computed_before > 0 && kv_.takes_snapshots()) {
      const BlockId anchor = r->block_ids()[s.num_computed_before / config_.block_size - 1];
      const SnapshotId id = pool.block(anchor).snapshot;
      VAMP_CHECK(id != kNoSnapshot) << "request " << r->id() << " hit a block without a snapshot";
      restore = &pool.snapshot(id).blocks;
    }
    const std::vector<BlockId>* capture = nullptr;
    if (s.capture_tokens > 0) {
      kv_.BeginCapture(*r, s.capture_tokens);
      capture = &pool.snapshot(r->snapshot()).blocks;
      ++counters_.num_state_captures;
    }
    if (!r->known_to_agents()) {
      NewRequestPlan& p = plan.new_requests.emplace_back();
      p.request_id = r->id();
      const absl::Span<const TokenId> prompt = r->all_token_ids();  // no outputs yet
      p.prompt_token_ids.assign(prompt.begin(), prompt.end());
      p.sampling_params = r->sampling_params();
      p.eos_token_id = r->eos_token_id();
      p.block_ids = r->block_ids();
      p.num_computed_tokens = s.num_computed_before;
      p.num_scheduled_tokens = s.num_new_tokens;
      if (restore != nullptr) p.restore_state_blocks = *restore;
      if (capture != nullptr) {
        p.capture_state_tokens = s.capture_tokens;
        p.capture_state_blocks = *capture;
      }
      r->set_known_to_agents();
    } else {
      CachedRequestPlan& p = plan.cached_requests.emplace_back();
      p.request_id = r->id();
      p.resumed = s.admitted;
      const std::vector<BlockId>& table = r->block_ids();
      p.new_block_ids.assign(table.begin() + (s.admitted ? 0 : s.first_new_block), table.end());
      p.num_computed_tokens = s.num_computed_before;
      p.num_scheduled_tokens = s.num_new_tokens;
      if (restore != nullptr) p.restore_state_blocks = *restore;
      if (capture != nullptr) {
        p.capture_state_tokens = s.capture_tokens;
        p.capture_state_blocks = *capture;
      }
    }
    r->set_num_computed_tokens(s.num_computed_before + s.num_new_tokens);
    plan.total_num_scheduled_tokens += s.num_new_tokens;
    in_flight_.push_back({r->id(), r->seq()});
  }
  plan.preempted_ids = std::move(step_preempted_ids_);
  step_preempted_ids_.clear();
  plan.finished_ids = std::move(pending_finished_ids_);
  pending_finished_ids_.clear();
  last_plan_.preempted_ids = plan.preempted_ids;
  last_plan_.finished_ids = plan.finished_ids;
  last_plan_.revertible = true;
  plan.num_blocks = kv_.pool().num_blocks();
  if (!plan.empty()) ++counters_.num_steps;
  counters_.num_scheduled_tokens += plan.total_num_scheduled_tokens;
  step_num_scheduled_tokens_ = static_cast<int32_t>(plan.total_num_scheduled_tokens);
  scheduled_.clear();
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Step output

absl::StatusOr<std::vector<RequestOutput>> Scheduler::UpdateFromOutput(const StepOutput& output) {
  if (in_flight_.empty()) {
    return absl::FailedPreconditionError("UpdateFromOutput: no step in flight");
  }
  if (output.step != step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "UpdateFromOutput: output of step ", output.step, " but step ", step_, " is in flight"));
  }
  for (const SampledTokens& s : output.sampled) {
    for (TokenId t : s.token_ids) {
      if (t < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step_, ": request ", s.request_id, " sampled token ", t));
      }
    }
  }
  // Match samples to the in-flight requests. Agents normally answer in plan order, which a single
  // merge walk recognises; anything else goes through a hash index.
  const size_t n = in_flight_.size();
  std::vector<const SampledTokens*> samples(n, nullptr);
  size_t j = 0;
  for (size_t i = 0; i < n && j < output.sampled.size(); ++i) {
    if (output.sampled[j].request_id == in_flight_[i].id) samples[i] = &output.sampled[j++];
  }
  if (j != output.sampled.size()) {
    absl::flat_hash_map<RequestId, const SampledTokens*> by_id;
    by_id.reserve(output.sampled.size());
    for (const SampledTokens& s : output.sampled) {
      if (!by_id.emplace(s.request_id, &s).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step_, ": request ", s.request_id, " sampled twice"));
      }
    }
    size_t matched = 0;
    for (size_t i = 0; i < n; ++i) {
      auto it = by_id.find(in_flight_[i].id);
      samples[i] = it == by_id.end() ? nullptr : it->second;
      if (samples[i] != nullptr) ++matched;
    }
    if (matched != by_id.size()) {
      absl::flat_hash_set<RequestId> scheduled;
      for (const InFlight& e : in_flight_) scheduled.insert(e.id);
      for (const SampledTokens& s : output.sampled) {
        if (!scheduled.contains(s.request_id)) {
          return absl::InvalidArgumentError(absl::StrCat("step ", step_, ": request ", s.request_id,
                                                         " was not scheduled in this step"));
        }
      }
    }
  }
  // Resolve the requests (null: aborted since the plan) and check that every request that reached
  // the end of its tokens got one.
  std::vector<Request*> requests(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    auto it = requests_.find(in_flight_[i].id);
    if (it == requests_.end() || it->second->seq() != in_flight_[i].seq) continue;
    Request* r = it->second.get();
    requests[i] = r;
    const bool must_sample = r->num_computed_tokens() == r->num_tokens();
    if (must_sample && (samples[i] == nullptr || samples[i]->token_ids.empty())) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step_, ": request ", r->id(),
                                                     " completed its tokens but got no sample"));
    }
  }

  // Apply.
  std::vector<RequestOutput> outputs;
  outputs.reserve(n);
  bool any_finished = false;
  for (size_t i = 0; i < n; ++i) {
    Request* r = requests[i];
    if (r == nullptr) continue;
    const bool sampling = r->num_computed_tokens() == r->num_tokens();
    if (sampling) {
      RequestOutput& out = outputs.emplace_back();
      out.request_id = r->id();
      for (TokenId t : samples[i]->token_ids) {
        out.new_token_ids.push_back(t);
        if (r->AppendOutputToken(t, config_.max_model_len)) break;
      }
      out.finish_reason = r->finish_reason();
      out.stop_token_id = r->stop_token_id();
    }
    // The step computed these tokens' KV: their full blocks can now be shared, and a state it
    // captured restored.
    kv_.CacheComputedBlocks(*r);
    if (r->capture_in_flight() > 0) kv_.EndCapture(*r);
    if (r->is_finished()) {
      kv_.Free(*r);
      pending_finished_ids_.push_back(r->id());
      ++counters_.num_finished;
      any_finished = true;
    }
  }
  if (any_finished) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Request* r) { return r->is_finished(); }),
                   running_.end());
    for (Request* r : requests) {
      if (r != nullptr && r->is_finished()) requests_.erase(r->id());
    }
  }
  in_flight_.clear();
  last_plan_ = LastPlan{};
  return outputs;
}

// ---------------------------------------------------------------------------------------------
// Capacity

absl::Status Scheduler::GrowPool(int32_t blocks) { return kv_.pool().Grow(blocks); }

absl::Status Scheduler::BeginShrinkPool(int32_t blocks) {
  const int64_t needed =
      (static_cast<int64_t>(config_.max_model_len) + config_.block_size - 1) / config_.block_size;
  if (static_cast<int64_t>(kv_.pool().num_blocks()) - blocks < needed) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginShrinkPool: ", kv_.pool().num_blocks(), " - ", blocks,
                     " blocks would not hold one max_model_len request (", needed, " blocks)"));
  }
  return kv_.pool().BeginShrink(blocks);
}

absl::Status Scheduler::CommitShrinkPool() {
  if (restore_pending_groups_ > 0) {
    return absl::FailedPreconditionError("CommitShrinkPool: the pending shrink is a restore's");
  }
  return kv_.pool().CommitShrink();
}

absl::StatusOr<int32_t> Scheduler::OffloadGroups(int32_t groups) {
  if (offloader_ == nullptr) {
    return absl::FailedPreconditionError("OffloadGroups: no expert offloader");
  }
  const OffloadState state = OffloadStateNow();
  if (!state.available) {
    return absl::FailedPreconditionError(
        kv_.pool().shrink_pending()
            ? "cannot offload while the pool's tail is withdrawn for a restore or shrink"
            : "cannot offload now: a remap the agents refused is being rolled back; retry later");
  }
  if (groups < 1 || groups > state.remaining_groups) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot offload ", groups, " groups: ", state.remaining_groups, " remain under the cap"));
  }
  VAMP_ASSIGN_OR_RETURN(const int32_t added, offloader_->Offload(groups));
  if (added > 0) VAMP_RETURN_IF_ERROR(kv_.pool().Grow(added));
  SyncReuseGeometry();
  return added;
}

absl::Status Scheduler::RestoreGroups(int32_t groups) {
  if (offloader_ == nullptr) {
    return absl::FailedPreconditionError("RestoreGroups: no expert offloader");
  }
  if (!offloader_->Ready()) {
    return absl::FailedPreconditionError(
        "cannot restore now: a remap the agents refused is being rolled back; retry later");
  }
  // The releases the agents must apply first (pending_finished_ids_, and preemptions of the
  // step being planned) go with the plan whose step carries the restore's remap.
  return offloader_->Restore(groups);
}

absl::Status Scheduler::RevertStep(int32_t pool_blocks_delta) {
  if (!last_plan_.revertible) {
    return absl::FailedPreconditionError(
        "RevertStep: no plan to revert (it was answered or reverted, or a later one was made)");
  }
  LastPlan plan = std::move(last_plan_);
  last_plan_ = LastPlan{};
  // Undo the requests' part, the latest scheduled first, so that admissions go back to the front
  // of the waiting queue in their order.
  for (auto it = plan.requests.rbegin(); it != plan.requests.rend(); ++it) {
    auto found = requests_.find(it->id);
    if (found == requests_.end() || found->second->seq() != it->seq) {
      // Aborted since the plan. Agents that never heard of it must not hear of its end either.
      if (!it->known_before) {
        pending_finished_ids_.erase(
            std::remove(pending_finished_ids_.begin(), pending_finished_ids_.end(), it->id),
            pending_finished_ids_.end());
      }
      continue;
    }
    Request* r = found->second.get();
    const Scheduled& s = it->scheduled;
    if (s.capture_tokens > 0) kv_.AbandonCapture(*r, s.snapshot_taken);
    if (s.admitted) {
      running_.erase(std::find(running_.begin(), running_.end(), r));
      kv_.Free(*r);
      r->set_num_computed_tokens(0);
      r->set_status(s.status_before);
      if (s.status_before == RequestStatus::kPreempted) ++num_waiting_preempted_;
      waiting_.AddPreempted(r);  // FCFS: back at the front; priority: in its place
      r->set_known_to_agents(it->known_before);
      r->set_num_cached_tokens(it->num_cached_tokens_before);
    } else {
      kv_.FreeTail(*r, s.first_new_block);
      r->set_num_computed_tokens(s.num_computed_before);
    }
  }
  in_flight_.clear();
  // The agents never saw these ids (a step with remaps may have applied them; again is harmless).
  // A request aborted since then is covered by its finished id.
  for (RequestId id : plan.preempted_ids) {
    if (requests_.contains(id)) undelivered_preempted_ids_.push_back(id);
  }
  pending_finished_ids_.insert(pending_finished_ids_.begin(), plan.finished_ids.begin(),
                               plan.finished_ids.end());
  // The pool goes back to what the agents have once they roll the step's remaps back. The blocks
  // an offload added were handed out by this plan only, and those are free again now.
  KvBlockPool& pool = kv_.pool();
  if (pool_blocks_delta != 0 && pool.shrink_pending()) {
    // A restore this plan's step boundary began after an offload queued between steps: it
    // withdrew a tail that is about to change, so it is given up (the arbiter may ask again).
    if (restore_pending_groups_ == 0) {
      return absl::InternalError("RevertStep: a shrink is pending over the remapped tail");
    }
    CancelRestore();
  }
  if (pool_blocks_delta > 0) {
    VAMP_RETURN_IF_ERROR(pool.BeginShrink(pool_blocks_delta));
    if (pool.shrink_outstanding() > 0) {
      return absl::InternalError(absl::StrCat("RevertStep: ", pool.shrink_outstanding(),
                                              " blocks of the refused offload's tail are in use"));
    }
    VAMP_RETURN_IF_ERROR(pool.CommitShrink());
  } else if (pool_blocks_delta < 0) {
    VAMP_RETURN_IF_ERROR(pool.Grow(-pool_blocks_delta));
  }
  // Planned work that did not happen is not counted.
  const SchedulerCounters& before = plan.counters_before;
  SchedulerCounters& c = counters_;
  c.prefix_cache = before.prefix_cache;
  c.num_steps = before.num_steps;
  c.num_scheduled_tokens = before.num_scheduled_tokens;
  c.num_offloads = before.num_offloads;
  c.num_offloaded_blocks = before.num_offloaded_blocks;
  c.num_restores = before.num_restores;
  c.num_restored_blocks = before.num_restored_blocks;
  c.num_admitted = before.num_admitted;
  c.total_queue_micros = before.total_queue_micros;
  c.num_resumed = before.num_resumed;
  c.total_resume_delay_micros = before.total_resume_delay_micros;
  c.num_state_captures = before.num_state_captures;
  ++c.num_reverted_steps;
  step_num_scheduled_tokens_ = 0;
  step_queue_times_.clear();
  SyncReuseGeometry();
  return absl::OkStatus();
}

absl::Status Scheduler::CancelShrinkPool() {
  if (restore_pending_groups_ > 0) {
    return absl::FailedPreconditionError("CancelShrinkPool: the pending shrink is a restore's");
  }
  return kv_.pool().CancelShrink();
}

// ---------------------------------------------------------------------------------------------
// Introspection

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s;
  const KvBlockPool& pool = kv_.pool();
  s.step = step_;
  s.num_blocks = pool.num_blocks();
  s.num_used_blocks = pool.num_used();
  s.num_free_uncached_blocks = pool.num_free_uncached();
  s.num_free_cached_blocks = pool.num_free_cached();
  s.num_withdrawn_blocks = pool.num_withdrawn();
  s.num_cached_blocks = pool.num_cached();
  s.num_snapshot_blocks = pool.num_snapshot_blocks();
  s.num_snapshots = pool.num_snapshots();
  s.kv_usage = pool.Usage();
  s.num_running = static_cast<int32_t>(running_.size());
  s.num_waiting = static_cast<int32_t>(waiting_.size());
  s.num_waiting_preempted = num_waiting_preempted_;
  s.counters = counters_;
  s.step_num_scheduled_tokens = step_num_scheduled_tokens_;
  s.step_num_preempted = step_num_preempted_;
  s.step_queue_times = step_queue_times_;
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  const KvBlockPool& pool = kv_.pool();
  VAMP_RETURN_IF_ERROR(pool.CheckInvariants());
  const int32_t bs = config_.block_size;
  std::vector<int32_t> refs(pool.num_blocks(), 0);
  absl::flat_hash_set<const Request*> running(running_.begin(), running_.end());
  if (running.size() != running_.size()) return absl::InternalError("running list has duplicates");
  size_t waiting_count = 0, waiting_preempted = 0;
  absl::Status waiting_status;
  waiting_.ForEach([&](const Request& r) {
    ++waiting_count;
    if (r.status() == RequestStatus::kPreempted) ++waiting_preempted;
    if (r.status() != RequestStatus::kWaiting && r.status() != RequestStatus::kPreempted) {
      waiting_status = absl::InternalError(
          absl::StrCat("waiting request ", r.id(), " is ", RequestStatusName(r.status())));
    } else if (!r.block_ids().empty()) {
      waiting_status = absl::InternalError(
          absl::StrCat("waiting request ", r.id(), " holds ", r.block_ids().size(), " blocks"));
    }
  });
  VAMP_RETURN_IF_ERROR(waiting_status);
  if (waiting_count + running_.size() != requests_.size()) {
    return absl::InternalError(absl::StrCat(requests_.size(), " live requests but ",
                                            running_.size(), " running + ", waiting_count,
                                            " waiting"));
  }
  if (static_cast<int32_t>(waiting_preempted) != num_waiting_preempted_) {
    return absl::InternalError("preempted waiting count is off");
  }
  for (const auto& [id, owned] : requests_) {
    const Request& r = *owned;
    if ((r.status() == RequestStatus::kRunning) != running.contains(&r)) {
      return absl::InternalError(absl::StrCat("request ", id, " status ",
                                              RequestStatusName(r.status()),
                                              " disagrees with the running list"));
    }
    // A snapshot is held while running (never attached: that ends the hold), none while waiting.
    if (r.snapshot() != kNoSnapshot &&
        (r.status() != RequestStatus::kRunning || pool.snapshot(r.snapshot()).blocks.empty() ||
         pool.snapshot(r.snapshot()).anchor != kNoBlock)) {
      return absl::InternalError(
          absl::StrCat("request ", id, " holds snapshot ", r.snapshot(), " wrongly"));
    }
    const std::vector<BlockId>& table = r.block_ids();
    if (static_cast<int64_t>(table.size()) * bs < r.num_computed_tokens()) {
      return absl::InternalError(absl::StrCat("request ", id, ": ", table.size(), " blocks for ",
                                              r.num_computed_tokens(), " computed tokens"));
    }
    absl::flat_hash_set<BlockId> seen;
    for (size_t i = 0; i < table.size(); ++i) {
      const BlockId b = table[i];
      if (b < 0 || b >= pool.num_blocks()) {
        return absl::InternalError(absl::StrCat("request ", id, " holds bad block ", b));
      }
      if (!seen.insert(b).second) {
        return absl::InternalError(absl::StrCat("request ", id, " holds block ", b, " twice"));
      }
      ++refs[b];
      const KvBlock& block = pool.block(b);
      if (block.cached) {
        if (i >= r.block_hashes().size() || block.hash != r.block_hashes()[i]) {
          return absl::InternalError(absl::StrCat("request ", id, " block ", i, " (id ", b,
                                                  ") is cached under a foreign hash"));
        }
      }
    }
  }
  for (BlockId b = 0; b < pool.num_blocks(); ++b) {
    if (refs[b] != pool.block(b).ref_count) {
      return absl::InternalError(absl::StrCat("block ", b, " ref_count ", pool.block(b).ref_count,
                                              " but held by ", refs[b], " requests"));
    }
  }
  return absl::OkStatus();
}

}  // namespace vamp
