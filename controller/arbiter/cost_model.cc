#include "controller/arbiter/cost_model.h"

#include <algorithm>
#include <limits>

namespace vamp {

double EffectiveReuse(const CostCoefficients& c, double hit_rate, int64_t age_steps) {
  const double age = static_cast<double>(std::max<int64_t>(0, age_steps));
  return c.alpha * hit_rate / (1.0 + age / c.tau_steps);
}

double BlockEvictionCost(const CostCoefficients& c, double hit_rate, int64_t age_steps,
                         int32_t block_tokens) {
  return EffectiveReuse(c, hit_rate, age_steps) *
         (block_tokens * c.t_prefill_micros + c.t_overhead_micros);
}

double EvictionCost(const CostCoefficients& c, const KvBlockPool& pool, int64_t step,
                    int32_t block_size, double hit_rate, int32_t n) {
  if (n > pool.num_free_cached()) return -1;
  double cost = 0;
  int32_t seen = 0;
  pool.ForEachCachedFree([&](const KvBlock& b) {
    if (seen >= n) return false;
    cost += BlockEvictionCost(c, hit_rate, step - b.last_used_step, block_size);
    seen += b.EvictionBlocks();
    return true;
  });
  return cost;
}

bool OldestCachedAreCold(const KvBlockPool& pool, int64_t step, int32_t n, int64_t min_age_steps) {
  if (n > pool.num_free_cached()) return false;
  // The queue is in LRU order, so the n-th oldest block decides.
  int32_t seen = 0;
  int64_t last_used = std::numeric_limits<int64_t>::min();
  pool.ForEachCachedFree([&](const KvBlock& b) {
    if (seen >= n) return false;
    last_used = b.last_used_step;
    seen += b.EvictionBlocks();
    return true;
  });
  return n <= 0 || step - last_used >= min_age_steps;
}

double OffloadCost(const CostCoefficients& c, int32_t groups, int32_t experts_per_group,
                   int32_t experts_per_layer, int32_t horizon_steps) {
  int64_t candidates = static_cast<int64_t>(groups) * experts_per_group;
  if (experts_per_layer > 0) candidates = std::min<int64_t>(candidates, experts_per_layer);
  return static_cast<double>(candidates) * c.c_eff_micros * horizon_steps;
}

double PreemptionCost(const CostCoefficients& c, int32_t partial_tokens) {
  return c.t_sched_micros + c.t_queue_micros + partial_tokens * c.t_prefill_micros;
}

int32_t DecodeHorizon(const CostCoefficients& c, const ArbiterContext& context) {
  if (context.num_running() == 0) return c.horizon_max_steps;
  int32_t w = std::numeric_limits<int32_t>::max();
  const int32_t max_model_len = context.config().max_model_len;
  for (int32_t i = 0; i < context.num_running(); ++i) {
    w = std::min(w, context.running(i).RemainingOutputBudget(max_model_len));
  }
  return std::clamp(w, c.horizon_min_steps, c.horizon_max_steps);
}

PreemptionYield PreemptionYieldOf(const Request& request, const KvBlockPool& pool,
                                  int32_t block_size) {
  PreemptionYield y;
  const std::vector<BlockId>& table = request.block_ids();
  size_t prefix = table.size();
  while (prefix > 0) {
    const KvBlock& b = pool.block(table[prefix - 1]);
    if (b.cached) break;
    if (b.ref_count == 1) ++y.uncached_blocks;
    --prefix;
  }
  y.partial_tokens =
      std::max(0, request.num_computed_tokens() - static_cast<int32_t>(prefix) * block_size);
  return y;
}

}  // namespace vamp
