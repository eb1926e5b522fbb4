// VAMP's cost model (paper §IV-B, shared/DESIGN.md "Controller: allocation and the cost model"):
// the estimated future cost, in µs, of each way to cover a KV allocation gap.
//
//   cached-block eviction, per block   p_eff = α·r_hit / (1 + age/τ)
//                                      C_c   = Σ p_eff·(n_tok·t_prefill + t_overhead)
//                                              over the blocks evicted, LRU first
//   expert offload                     C_e   = min(g·n_groups, E)·c_eff·w
//   preemption                         C_p   = Σ_victims (t_sched + t_queue + n_partial·t_prefill)
//                                              (= C_p^(1)·G when the victims are alike)
//   combined                           C_b   = C_e(floor groups) + C_c(remaining blocks)
//
// Pure functions of their inputs, so tests can check them against hand-computed cases.
#ifndef VAMP_CONTROLLER_ARBITER_COST_MODEL_H_
#define VAMP_CONTROLLER_ARBITER_COST_MODEL_H_

#include <cstdint>

#include "controller/core/kv_block_pool.h"
#include "controller/core/memory_arbiter.h"

namespace vamp {

// Defaults are the paper's (§V) except t_overhead, which the paper does not give.
struct CostCoefficients {
  // Weight of the observed prefix-cache hit rate in a block's reuse probability.
  double alpha = 0.5;
  // Age (scheduler steps since the block was last used) at which the reuse estimate halves.
  double tau_steps = 2000;
  // Re-prefill cost per token (µs).
  double t_prefill_micros = 15;
  // Re-prefill cost per evicted block beyond its tokens (µs): block allocation, hashing and the
  // share of a step's fixed cost that one more 16-token block adds. Our choice: 10 µs, small
  // next to 16 tokens × 15 µs = 240 µs, so the token term dominates as in the paper.
  double t_overhead_micros = 10;
  // Scheduling a preempted request again (µs).
  double t_sched_micros = 500;
  // Preemption → reschedule delay before any has been observed (µs); learned afterwards.
  double t_queue_micros = 1000;
  // Per-step cost of one offloaded expert shard (µs): c_reload 0.63 ms · k / E = 0.63 ms · 10 /
  // 512. An action-comparison weight, not a measured transfer time (unless self-calibrated).
  double c_eff_micros = 12.3;
  // Clamp of the offload accounting horizon w (decode steps).
  int32_t horizon_min_steps = 1;
  int32_t horizon_max_steps = 64;
};

// p_eff = α·r_hit / (1 + age/τ). Negative ages count as 0.
double EffectiveReuse(const CostCoefficients& c, double hit_rate, int64_t age_steps);

// One block's eviction cost: p_eff·(block_tokens·t_prefill + t_overhead).
double BlockEvictionCost(const CostCoefficients& c, double hit_rate, int64_t age_steps,
                         int32_t block_tokens);

// C_c of evicting least recently used cached free blocks of `pool` at scheduler step `step`,
// each a full block of `block_size` tokens, until `n` blocks are freed (a block anchoring a
// recurrent-state snapshot frees its blocks too). -1 when eviction cannot free `n`.
double EvictionCost(const CostCoefficients& c, const KvBlockPool& pool, int64_t step,
                    int32_t block_size, double hit_rate, int32_t n);

// Whether the least recently used cached free blocks that free `n` blocks all have an age of at
// least `min_age_steps` (false when eviction cannot free n).
bool OldestCachedAreCold(const KvBlockPool& pool, int64_t step, int32_t n, int64_t min_age_steps);

// C_e = min(g·groups, E)·c_eff·w. `experts_per_layer` <= 0 means E unknown (no cap).
double OffloadCost(const CostCoefficients& c, int32_t groups, int32_t experts_per_group,
                   int32_t experts_per_layer, int32_t horizon_steps);

// C_p^(1) = t_sched + t_queue + n_partial·t_prefill for one victim (t_queue from `c`).
double PreemptionCost(const CostCoefficients& c, int32_t partial_tokens);

// w: the smallest remaining output budget among the running requests, clamped to
// [horizon_min_steps, horizon_max_steps]; horizon_max_steps when none runs.
int32_t DecodeHorizon(const CostCoefficients& c, const ArbiterContext& context);

// What preempting `request` gives and costs: the uncached blocks only it holds at the end of its
// table (its partial block and blocks allocated in the step being planned), which become
// uncached free blocks at once, and the computed tokens it will have to compute again when
// resumed (n_partial: those past its cached prefix). Full blocks are cached and go to the cached
// free queue, not to the gap; an uncached duplicate deeper in the table is not counted (rare, and
// finding it would cost a walk over the whole table).
struct PreemptionYield {
  int32_t uncached_blocks = 0;
  int32_t partial_tokens = 0;
};
PreemptionYield PreemptionYieldOf(const Request& request, const KvBlockPool& pool,
                                  int32_t block_size);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_ARBITER_COST_MODEL_H_
