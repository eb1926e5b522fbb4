#include "controller/core/reuse_tracker.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "common/integer_math.h"

namespace vamp {
namespace {

// Log2 buckets of block ages in steps: enough for 2^47 steps.
constexpr int32_t kAgeBuckets = 48;

}  // namespace

ReuseTracker::ReuseTracker(const ReuseTrackerOptions& options)
    : tokens_(options.window_micros, options.window_slots, 2),
      wait_steps_(options.window_micros, options.window_slots, 2),
      ghost_tokens_(options.window_micros, options.window_slots, 1),
      queue_state_(options.window_micros, options.window_slots, 2),
      queue_time_(options.window_micros, options.window_slots, 2),
      preemption_tokens_(options.window_micros, options.window_slots, 1),
      hit_ages_(options.window_micros, options.window_slots, kAgeBuckets) {}

void ReuseTracker::SetGeometry(int32_t blocks_per_group, int32_t offloaded_groups,
                               int32_t max_groups) {
  bpg_ = std::max(0, blocks_per_group);
  offloaded_ = std::max(0, offloaded_groups);
  if (max_groups != max_groups_) {
    max_groups_ = std::max(0, max_groups);
    tokens_.Resize(max_groups_ + 2);
    wait_steps_.Resize(max_groups_ + 2);
  }
  ghosts_.set_capacity(static_cast<int64_t>(max_groups_) * bpg_);
}

ReuseTracker::HitNeeds ReuseTracker::MeasureHit(const KvBlockPool& pool, const PrefixHit& hit,
                                                int64_t step) const {
  HitNeeds needs;
  if (bpg_ <= 0 || hit.blocks.empty()) return needs;
  const int64_t uncached = pool.num_free_uncached();
  int32_t running_max = 0;
  for (BlockId id : hit.blocks) {
    int32_t need = 0;
    const KvBlock& block = pool.block(id);
    if (block.ref_count == 0) {
      const int64_t slack = uncached + pool.CachedFreeDepth(id);
      need = static_cast<int32_t>(std::max<int64_t>(0, offloaded_ - slack / bpg_));
      const auto age = static_cast<uint64_t>(std::max<int64_t>(0, step - block.last_used_step));
      const int32_t bucket = std::min(kAgeBuckets - 1, static_cast<int32_t>(std::bit_width(age)));
      if (!needs.ages.empty() && needs.ages.back().first == bucket) {
        ++needs.ages.back().second;
      } else {
        needs.ages.emplace_back(bucket, 1);
      }
    }
    running_max = std::max(running_max, need);
    if (!needs.runs.empty() && needs.runs.back().first == running_max) {
      ++needs.runs.back().second;
    } else {
      needs.runs.emplace_back(running_max, 1);
    }
  }
  needs.max_need = running_max;
  return needs;
}

void ReuseTracker::Record(int64_t now_micros, int32_t need, double tokens) {
  tokens_.Add(now_micros, std::min(need, max_groups_ + 1), tokens);
}

void ReuseTracker::RecordAdmission(int64_t now_micros, const HitNeeds& needs, Request& request,
                                   int32_t block_size, const BlockHasher& hasher) {
  if (bpg_ <= 0) return;
  for (const auto& [need, blocks] : needs.runs) {
    Record(now_micros, need, static_cast<double>(blocks) * block_size);
  }
  for (const auto& [bucket, blocks] : needs.ages) hit_ages_.Add(now_micros, bucket, blocks);
  if (ghosts_.size() == 0) return;
  // Past the hit: the blocks a larger pool would have kept, while the prefix chain holds (each
  // block's need is the running maximum), up to the last block a hit could have ended at.
  int32_t running_max = needs.max_need;
  const int32_t first = request.num_cached_blocks();
  const int32_t last = (request.num_tokens() - 1) / block_size;  // full blocks a hit may cover
  ghost_needs_.clear();
  size_t servable = 0;  // blocks of ghost_needs_ a hit could cover
  for (int32_t i = first; i < last; ++i) {
    request.EnsureBlockHashes(i + 1, block_size, hasher);
    const BlockHash& hash = request.block_hashes()[i];
    const int64_t depth = ghosts_.Depth(hash);
    if (depth == 0) break;
    const int64_t need = offloaded_ + CeilDiv(depth, bpg_);
    if (need > max_groups_) break;  // no reachable pool would have kept it (nor what follows)
    running_max = std::max<int32_t>(running_max, static_cast<int32_t>(need));
    ghost_needs_.push_back(running_max);
    if (!hits_need_snapshots_ || ghosts_.Anchored(hash)) servable = ghost_needs_.size();
  }
  for (size_t i = 0; i < servable;) {
    size_t j = i;
    while (j < servable && ghost_needs_[j] == ghost_needs_[i]) ++j;
    Record(now_micros, ghost_needs_[i], static_cast<double>(j - i) * block_size);
    i = j;
  }
  if (servable > 0) ghost_tokens_.Add(now_micros, 0, static_cast<double>(servable) * block_size);
}

void ReuseTracker::RecordPreemption(int64_t now_micros, int32_t gap_blocks,
                                    int32_t recompute_tokens) {
  if (bpg_ <= 0 || recompute_tokens <= 0) return;
  const int64_t need = offloaded_ + CeilDiv(std::max(1, gap_blocks), bpg_);
  Record(now_micros, static_cast<int32_t>(std::min<int64_t>(need, max_groups_ + 1)),
         recompute_tokens);
  preemption_tokens_.Add(now_micros, 0, recompute_tokens);
}

double ReuseTracker::TokensBetween(int64_t now_micros, int32_t from, int32_t to) const {
  if (from == to) return 0;
  if (from > to) return -TokensBetween(now_micros, to, from);
  return tokens_.Sum(now_micros, std::max(0, from) + 1, std::min(to, max_groups_));
}

void ReuseTracker::RecordMemoryWait(int64_t now_micros, int32_t gap_blocks, int32_t waiting) {
  if (bpg_ <= 0 || waiting <= 0) return;
  const int64_t need = offloaded_ + CeilDiv(std::max(1, gap_blocks), bpg_);
  wait_steps_.Add(now_micros, static_cast<int32_t>(std::min<int64_t>(need, max_groups_ + 1)),
                  waiting);
}

double ReuseTracker::WaitStepsBetween(int64_t now_micros, int32_t from, int32_t to) const {
  if (from == to) return 0;
  if (from > to) return -WaitStepsBetween(now_micros, to, from);
  return wait_steps_.Sum(now_micros, std::max(0, from) + 1, std::min(to, max_groups_));
}

void ReuseTracker::RecordQueueState(int64_t now_micros, bool waiting_for_compute) {
  queue_state_.Add(now_micros, 0, 1);
  if (waiting_for_compute) queue_state_.Add(now_micros, 1, 1);
}

double ReuseTracker::ComputeBoundShare(int64_t now_micros) const {
  const double steps = queue_state_.Sum(now_micros, 0, 0);
  return steps > 0 ? queue_state_.Sum(now_micros, 1, 1) / steps : 0;
}

void ReuseTracker::RecordQueueTime(int64_t now_micros, int64_t queue_micros) {
  queue_time_.Add(now_micros, 0, 1);
  queue_time_.Add(now_micros, 1, static_cast<double>(std::max<int64_t>(0, queue_micros)));
}

double ReuseTracker::MeanQueueMicros(int64_t now_micros) const {
  const double n = queue_time_.Sum(now_micros, 0, 0);
  return n > 0 ? queue_time_.Sum(now_micros, 1, 1) / n : 0;
}

double ReuseTracker::GhostTokens(int64_t now_micros) const {
  return ghost_tokens_.Sum(now_micros, 0, 0);
}

int64_t ReuseTracker::ReuseAgeSteps(int64_t now_micros, double quantile) const {
  const double total = hit_ages_.Sum(now_micros, 0, kAgeBuckets - 1);
  if (total <= 0) return 0;
  double seen = 0;
  for (int32_t b = 0; b < kAgeBuckets; ++b) {
    seen += hit_ages_.Sum(now_micros, b, b);
    if (seen >= quantile * total) return (int64_t{1} << b) - 1;
  }
  return (int64_t{1} << (kAgeBuckets - 1)) - 1;
}

void ReuseTracker::ForgetAbove(int32_t groups) {
  tokens_.Clear(std::max(0, groups) + 1, max_groups_ + 1);
  wait_steps_.Clear(std::max(0, groups) + 1, max_groups_ + 1);
}

double ReuseTracker::PreemptionTokens(int64_t now_micros) const {
  return preemption_tokens_.Sum(now_micros, 0, 0);
}

}  // namespace vamp
