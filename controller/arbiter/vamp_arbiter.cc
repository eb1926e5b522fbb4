#include "controller/arbiter/vamp_arbiter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/integer_math.h"
#include "controller/core/static_arbiter.h"

namespace vamp {

// ---------------------------------------------------------------------------------------------
// Configuration

absl::string_view VampCostModelName(VampCostModel model) {
  return model == VampCostModel::kTax ? "tax" : "paper";
}

absl::Status VampArbiterConfig::Validate() const {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", field, "': ", why));
  };
  if (tax.window_slots < 1) return bad("vamp_window_slots", "must be >= 1");
  if (tax.window_micros < tax.window_slots) {
    return bad("vamp_window_s", "must be at least vamp_window_slots microseconds");
  }
  if (!(tax.h2d_bytes_per_s > 0)) return bad("vamp_h2d_gbps", "must be > 0");
  if (!(tax.routed_h2d_bytes_per_s > 0)) return bad("vamp_routed_h2d_gbps", "must be > 0");
  if (!(tax.overlap_fraction >= 0 && tax.overlap_fraction <= 1)) {
    return bad("vamp_staging_overlap", "must be in [0, 1]");
  }
  if (!(tax.margin >= 0)) return bad("vamp_margin", "must be >= 0");
  if (tax.min_evidence_steps < 0) return bad("vamp_min_evidence_steps", "must be >= 0");
  if (!(tax.ttft_weight >= 0)) return bad("vamp_ttft_weight", "must be >= 0");
  if (!(tax.memory_wait_weight >= 0)) return bad("vamp_memory_wait_weight", "must be >= 0");
  if (!(tax.ttft_weight_ramp == 0 || tax.ttft_weight_ramp >= 1)) {
    return bad("vamp_ttft_weight_ramp", "must be 0 (off) or >= 1");
  }
  if (!(tax.ttft_queue_threshold_micros >= 0)) {
    return bad("vamp_ttft_queue_threshold_s", "must be >= 0");
  }
  if (!(tax.ttft_tpot_budget >= 0)) return bad("vamp_ttft_tpot_budget", "must be >= 0");
  if (!(tax.ttft_max_queue_micros >= 0)) return bad("vamp_ttft_max_queue_s", "must be >= 0");
  if (!(tax.compute_bound_share >= 0 && tax.compute_bound_share <= 1)) {
    return bad("vamp_compute_bound_share", "must be in [0, 1]");
  }
  if (restore.min_hold_steps < 0) return bad("vamp_restore_min_hold_steps", "must be >= 0");
  const CostCoefficients& c = costs;
  if (!(c.alpha >= 0)) return bad("vamp_alpha", "must be >= 0");
  if (!(c.tau_steps > 0)) return bad("vamp_tau_steps", "must be > 0");
  if (!(c.t_prefill_micros >= 0)) return bad("vamp_t_prefill_us", "must be >= 0");
  if (!(c.t_overhead_micros >= 0)) return bad("vamp_t_overhead_us", "must be >= 0");
  if (!(c.t_sched_micros >= 0)) return bad("vamp_t_sched_us", "must be >= 0");
  if (!(c.t_queue_micros >= 0)) return bad("vamp_t_queue_us", "must be >= 0");
  if (!(c.c_eff_micros >= 0)) return bad("vamp_c_eff_us", "must be >= 0");
  if (c.horizon_min_steps < 1) return bad("vamp_horizon_min_steps", "must be >= 1");
  if (c.horizon_max_steps < c.horizon_min_steps) {
    return bad("vamp_horizon_max_steps", "must be >= vamp_horizon_min_steps");
  }
  if (offload_step_groups < 1) return bad("vamp_offload_step_groups", "must be >= 1");
  if (hit_rate_window_requests < 0) return bad("vamp_hit_rate_window_requests", "must be >= 0");
  if (!(t_queue_ewma_weight > 0 && t_queue_ewma_weight <= 1)) {
    return bad("vamp_t_queue_ewma_weight", "must be in (0, 1]");
  }
  if (restore.quiet_steps < 0) return bad("vamp_restore_quiet_steps", "must be >= 0");
  if (restore.step_groups < 0) return bad("vamp_restore_step_groups", "must be >= 0");
  if (restore.cold_age_steps < 0) return bad("vamp_restore_cold_age_steps", "must be >= 0");
  if (!(restore.headroom >= 0)) return bad("vamp_restore_headroom", "must be >= 0");
  if (restore.benefit_horizon_steps < 0) {
    return bad("vamp_restore_benefit_horizon_steps", "must be >= 0");
  }
  if (!(restore.working_set_quantile > 0 && restore.working_set_quantile <= 1)) {
    return bad("vamp_restore_working_set_quantile", "must be in (0, 1]");
  }
  if (restore.working_set_min_age_steps < 0) {
    return bad("vamp_restore_working_set_min_age_steps", "must be >= 0");
  }
  if (!(restore.working_set_headroom >= 0)) {
    return bad("vamp_restore_working_set_headroom", "must be >= 0");
  }
  if (restore.check_interval_steps < 1) {
    return bad("vamp_restore_check_interval_steps", "must be >= 1");
  }
  const SelfCalibrationConfig& s = self_calibration;
  if (!(s.ewma_weight > 0 && s.ewma_weight <= 1)) {
    return bad("vamp_calibration_ewma_weight", "must be in (0, 1]");
  }
  if (s.min_samples < 1) return bad("vamp_calibration_min_samples", "must be >= 1");
  if (s.min_prefill_tokens < 1) return bad("vamp_calibration_min_prefill_tokens", "must be >= 1");
  if (s.max_decode_step_prefill_tokens < 0) {
    return bad("vamp_calibration_max_decode_prefill_tokens", "must be >= 0");
  }
  return absl::OkStatus();
}

void AddVampArbiterConfigFields(ConfigSchema& schema) {
  const VampArbiterConfig d;
  const CostCoefficients& c = d.costs;
  constexpr double kBig = 1e12;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  schema
      .Enum("vamp_cost_model", std::string(VampCostModelName(d.cost_model)), {"tax", "paper"},
            "Cost model of the vamp arbiter: 'tax' prices offload as the staging stall it adds to "
            "every step and extra KV by the reuse it measurably serves (ghost list); 'paper' "
            "reproduces the paper's C_c/C_e/C_p comparison")
      .Double("vamp_window_s", d.tax.window_micros * 1e-6, 1e-3, 1e6,
              "Tax model: seconds of scheduler time the offload tax and the value of extra KV are "
              "summed over")
      .Int("vamp_window_slots", d.tax.window_slots, 1, 4096,
           "Tax model: slots of that window (its granularity)")
      .Double("vamp_h2d_gbps", d.tax.h2d_bytes_per_s * 1e-9, 1e-6, 1e6,
              "Tax model: host-to-device bandwidth the tax starts from (GB/s); learned from "
              "copy-bound steps with vamp_self_calibration")
      .Double("vamp_routed_h2d_gbps", d.tax.routed_h2d_bytes_per_s * 1e-9, 1e-6, 1e6,
              "Tax model: the same for routed staging's copies (small steps that copy only the "
              "experts they route to, not hidden behind compute; GB/s)")
      .Double("vamp_staging_overlap", d.tax.overlap_fraction, 0, 1,
              "Tax model: share of a step's compute that expert staging copies hide behind")
      .Double("vamp_margin", d.tax.margin, 0, 1e6,
              "Tax model: hysteresis; offload when value > (1 + margin) x tax, restore when tax > "
              "(1 + margin) x value")
      .Double("vamp_ttft_weight", d.tax.ttft_weight, 0, 1e6,
              "Tax model: microseconds of per-step staging stall worth one microsecond of "
              "prefill saved on the first-token path (1 = GPU time alone)")
      .Double("vamp_memory_wait_weight", d.tax.memory_wait_weight, 0, 1e6,
              "Tax model: weight of request time spent waiting for KV memory that a larger pool "
              "would have saved (request-microseconds against microseconds of stall)")
      .Double("vamp_ttft_queue_threshold_s", d.tax.ttft_queue_threshold_micros * 1e-6, 0, 1e6,
              "Tax model: the mean admission wait over the window (seconds) around which "
              "vamp_ttft_weight phases in (vamp_ttft_weight_ramp); with the ramp off it applies "
              "only above this wait")
      .Double("vamp_ttft_weight_ramp", d.tax.ttft_weight_ramp, 0, 1e6,
              "Tax model: when > 1, vamp_ttft_weight phases in with the mean admission wait, "
              "from none at vamp_ttft_queue_threshold_s / ramp to all of it at x ramp (linear "
              "in the log of the wait); 0 or 1: all of it above the threshold, none below")
      .Double("vamp_ttft_tpot_budget", d.tax.ttft_tpot_budget, 0, 1e6,
              "Tax model: when > 0, the most TPOT overhead (staging stall / compute over the "
              "window) the TTFT weight may buy; past it, extra KV must pay its tax in GPU time "
              "alone. 0: no bound")
      .Double("vamp_ttft_max_queue_s", d.tax.ttft_max_queue_micros * 1e-6, 0, 1e6,
              "Tax model: above this mean admission wait (seconds) the queue is not draining and "
              "vamp_ttft_weight no longer applies (extra KV is valued at GPU time); 0: no bound")
      .Double("vamp_compute_bound_share", d.tax.compute_bound_share, 0, 1,
              "Tax model: above this share of recent steps that left requests queued for "
              "compute, extra KV is valued at GPU time (vamp_ttft_weight is not applied)")
      .Int("vamp_min_evidence_steps", d.tax.min_evidence_steps, 0, kInt32Max,
           "Tax model: executed steps the window must hold before measured reuse can justify an "
           "offload or a restore")
      .Int("vamp_restore_min_hold_steps", d.restore.min_hold_steps, 0, kInt32Max,
           "Tax model: steps after an offload before a restore may be considered")
      .Double("vamp_alpha", c.alpha, 0, 1e6,
              "Cost model: weight of the observed hit rate in a cached block's reuse estimate")
      .Double("vamp_tau_steps", c.tau_steps, 1e-9, kBig,
              "Cost model: block age (scheduler steps) at which its reuse estimate halves")
      .Double("vamp_t_prefill_us", c.t_prefill_micros, 0, kBig,
              "Cost model: re-prefill cost per token (µs; learned with vamp_self_calibration)")
      .Double("vamp_t_overhead_us", c.t_overhead_micros, 0, kBig,
              "Cost model: re-prefill cost per evicted block beyond its tokens (µs)")
      .Double("vamp_t_sched_us", c.t_sched_micros, 0, kBig,
              "Cost model: cost of scheduling a preempted request again (µs)")
      .Double("vamp_t_queue_us", c.t_queue_micros, 0, kBig,
              "Cost model: initial preemption-to-reschedule delay (µs); learned from observations")
      .Double("vamp_c_eff_us", c.c_eff_micros, 0, kBig,
              "Cost model: per-step cost of one offloaded expert shard (µs; learned with "
              "vamp_self_calibration)")
      .Int("vamp_horizon_min_steps", c.horizon_min_steps, 1, kInt32Max,
           "Cost model: lower clamp of the offload horizon w (decode steps)")
      .Int("vamp_horizon_max_steps", c.horizon_max_steps, 1, kInt32Max,
           "Cost model: upper clamp of the offload horizon w (decode steps)")
      .Int("vamp_offload_step_groups", d.offload_step_groups, 1, kInt32Max,
           "Expert groups per offload step (the KV pool grows by whole steps)")
      .Int("vamp_hit_rate_window_requests", d.hit_rate_window_requests, 0, kInt32Max,
           "Admissions the observed prefix-cache hit rate is computed over (0 = since start)")
      .Double("vamp_t_queue_ewma_weight", d.t_queue_ewma_weight, 1e-9, 1,
              "Weight of a new preemption-to-reschedule observation in t_queue (1 = latest)")
      .Bool("vamp_restore", d.restore.enabled,
            "Give expert groups back when KV pressure subsides (not in the paper)")
      .Int("vamp_restore_quiet_steps", d.restore.quiet_steps, 0, kInt32Max,
           "Restore: steps without pressure (a gap cold blocks could not cover) before a "
           "restore")
      .Int("vamp_restore_step_groups", d.restore.step_groups, 0, kInt32Max,
           "Restore: groups per restore (0 = vamp_offload_step_groups)")
      .Int("vamp_restore_cold_age_steps", d.restore.cold_age_steps, 0, kInt32Max,
           "Restore: cached free blocks idle this many steps count as idle capacity")
      .Double("vamp_restore_headroom", d.restore.headroom, 0, 1e6,
              "Restore: idle capacity must exceed (1 + headroom) x the blocks a restore takes")
      .Int("vamp_restore_benefit_horizon_steps", d.restore.benefit_horizon_steps, 0, kInt32Max,
           "Restore: steps over which a restore's staging saving is counted against its cost")
      .Int("vamp_restore_check_interval_steps", d.restore.check_interval_steps, 1, kInt32Max,
           "Restore: steps between restores and between checks of the idle capacity")
      .Bool("vamp_restore_preempt_holders", d.restore.preempt_holders,
            "Tax model: preempt decoding requests holding the memory a restore waits for when "
            "their recompute costs less than the tax the wait keeps")
      .Double("vamp_restore_working_set_quantile", d.restore.working_set_quantile, 1e-6, 1,
              "Tax model: share of the window's cache hits whose reuse age bounds the working set")
      .Int("vamp_restore_working_set_min_age_steps", d.restore.working_set_min_age_steps, 0,
           kInt32Max, "Tax model: the working set's reuse age is at least this many steps")
      .Double("vamp_restore_working_set_headroom", d.restore.working_set_headroom, 0, 1e6,
              "Tax model: give groups back while the working set x (1 + headroom) fits the "
              "smaller pool")
      .Bool("vamp_self_calibration", d.self_calibration.enabled,
            "Learn t_prefill and c_eff from observed step times (not in the paper)")
      .Double("vamp_calibration_ewma_weight", d.self_calibration.ewma_weight, 1e-9, 1,
              "Self-calibration: weight of a new observation")
      .Int("vamp_calibration_min_samples", d.self_calibration.min_samples, 1, kInt32Max,
           "Self-calibration: observations before an estimate replaces the configured value")
      .Int("vamp_calibration_min_prefill_tokens", d.self_calibration.min_prefill_tokens, 1,
           kInt32Max,
           "Self-calibration: steps with at least this many prefill tokens feed t_prefill")
      .Int("vamp_calibration_max_decode_prefill_tokens",
           d.self_calibration.max_decode_step_prefill_tokens, 0, kInt32Max,
           "Self-calibration: steps with at most this many prefill tokens feed c_eff");
}

absl::StatusOr<VampArbiterConfig> VampArbiterConfigFromConfig(const Config& config) {
  VampArbiterConfig v;
  v.cost_model =
      config.GetString("vamp_cost_model") == "paper" ? VampCostModel::kPaper : VampCostModel::kTax;
  v.tax.window_micros = static_cast<int64_t>(config.GetDouble("vamp_window_s") * 1e6);
  v.tax.window_slots = static_cast<int32_t>(config.GetInt("vamp_window_slots"));
  v.tax.h2d_bytes_per_s = config.GetDouble("vamp_h2d_gbps") * 1e9;
  v.tax.routed_h2d_bytes_per_s = config.GetDouble("vamp_routed_h2d_gbps") * 1e9;
  v.tax.overlap_fraction = config.GetDouble("vamp_staging_overlap");
  v.tax.margin = config.GetDouble("vamp_margin");
  v.tax.min_evidence_steps = config.GetInt("vamp_min_evidence_steps");
  v.tax.ttft_weight = config.GetDouble("vamp_ttft_weight");
  v.tax.memory_wait_weight = config.GetDouble("vamp_memory_wait_weight");
  v.tax.compute_bound_share = config.GetDouble("vamp_compute_bound_share");
  v.tax.ttft_tpot_budget = config.GetDouble("vamp_ttft_tpot_budget");
  v.tax.ttft_queue_threshold_micros = config.GetDouble("vamp_ttft_queue_threshold_s") * 1e6;
  v.tax.ttft_weight_ramp = config.GetDouble("vamp_ttft_weight_ramp");
  v.tax.ttft_max_queue_micros = config.GetDouble("vamp_ttft_max_queue_s") * 1e6;
  v.restore.min_hold_steps = static_cast<int32_t>(config.GetInt("vamp_restore_min_hold_steps"));
  CostCoefficients& c = v.costs;
  c.alpha = config.GetDouble("vamp_alpha");
  c.tau_steps = config.GetDouble("vamp_tau_steps");
  c.t_prefill_micros = config.GetDouble("vamp_t_prefill_us");
  c.t_overhead_micros = config.GetDouble("vamp_t_overhead_us");
  c.t_sched_micros = config.GetDouble("vamp_t_sched_us");
  c.t_queue_micros = config.GetDouble("vamp_t_queue_us");
  c.c_eff_micros = config.GetDouble("vamp_c_eff_us");
  c.horizon_min_steps = static_cast<int32_t>(config.GetInt("vamp_horizon_min_steps"));
  c.horizon_max_steps = static_cast<int32_t>(config.GetInt("vamp_horizon_max_steps"));
  v.offload_step_groups = static_cast<int32_t>(config.GetInt("vamp_offload_step_groups"));
  v.hit_rate_window_requests = static_cast<int32_t>(config.GetInt("vamp_hit_rate_window_requests"));
  v.t_queue_ewma_weight = config.GetDouble("vamp_t_queue_ewma_weight");
  v.restore.enabled = config.GetBool("vamp_restore");
  v.restore.quiet_steps = static_cast<int32_t>(config.GetInt("vamp_restore_quiet_steps"));
  v.restore.step_groups = static_cast<int32_t>(config.GetInt("vamp_restore_step_groups"));
  v.restore.cold_age_steps = config.GetInt("vamp_restore_cold_age_steps");
  v.restore.headroom = config.GetDouble("vamp_restore_headroom");
  v.restore.benefit_horizon_steps =
      static_cast<int32_t>(config.GetInt("vamp_restore_benefit_horizon_steps"));
  v.restore.check_interval_steps =
      static_cast<int32_t>(config.GetInt("vamp_restore_check_interval_steps"));
  v.restore.preempt_holders = config.GetBool("vamp_restore_preempt_holders");
  v.restore.working_set_quantile = config.GetDouble("vamp_restore_working_set_quantile");
  v.restore.working_set_min_age_steps = config.GetInt("vamp_restore_working_set_min_age_steps");
  v.restore.working_set_headroom = config.GetDouble("vamp_restore_working_set_headroom");
  v.self_calibration.enabled = config.GetBool("vamp_self_calibration");
  v.self_calibration.ewma_weight = config.GetDouble("vamp_calibration_ewma_weight");
  v.self_calibration.min_samples =
      static_cast<int32_t>(config.GetInt("vamp_calibration_min_samples"));
  v.self_calibration.min_prefill_tokens = config.GetInt("vamp_calibration_min_prefill_tokens");
  v.self_calibration.max_decode_step_prefill_tokens =
      config.GetInt("vamp_calibration_max_decode_prefill_tokens");
  if (absl::Status s = v.Validate(); !s.ok()) return s;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Learning

namespace {

std::unique_ptr<ReuseTracker> MakeReuseTracker(const VampArbiterConfig& config) {
  if (config.cost_model != VampCostModel::kTax) return nullptr;
  ReuseTrackerOptions o;
  o.window_micros = config.tax.window_micros;
  o.window_slots = config.tax.window_slots;
  return std::make_unique<ReuseTracker>(o);
}

std::unique_ptr<OffloadTax> MakeOffloadTax(const VampArbiterConfig& config) {
  if (config.cost_model != VampCostModel::kTax) return nullptr;
  OffloadTaxOptions o;
  o.h2d_bytes_per_s = config.tax.h2d_bytes_per_s;
  o.routed_h2d_bytes_per_s = config.tax.routed_h2d_bytes_per_s;
  o.overlap_fraction = config.tax.overlap_fraction;
  o.learn_bandwidth = config.self_calibration.enabled;
  o.ewma_weight = config.self_calibration.ewma_weight;
  o.min_samples = config.self_calibration.min_samples;
  o.window_micros = config.tax.window_micros;
  o.window_slots = config.tax.window_slots;
  return std::make_unique<OffloadTax>(o);
}

}  // namespace

VampArbiter::VampArbiter(const VampArbiterConfig& config)
    : config_(config),
      t_queue_micros_(config.costs.t_queue_micros),
      reuse_(MakeReuseTracker(config)),
      tax_(MakeOffloadTax(config)) {
  hit_snapshots_.push_back({0, 0, 0});
}

void VampArbiter::Observe(const SchedulerCounters& counters) {
  const PrefixCacheStats& pc = counters.prefix_cache;
  if (pc.requests != hit_snapshots_.back().requests) {
    hit_snapshots_.push_back({pc.requests, pc.query_tokens, pc.hit_tokens});
    const int64_t window = config_.hit_rate_window_requests;
    if (window > 0) {
      while (hit_snapshots_.size() >= 2 && hit_snapshots_[1].requests <= pc.requests - window) {
        hit_snapshots_.pop_front();
      }
    }
    const HitSnapshot& base = hit_snapshots_.front();
    const int64_t query = pc.query_tokens - base.query_tokens;
    hit_rate_ = query > 0 ? static_cast<double>(pc.hit_tokens - base.hit_tokens) / query : 0.0;
  }
  if (counters.num_resumed > seen_resumed_) {
    const double sample =
        static_cast<double>(counters.total_resume_delay_micros - seen_resume_delay_micros_) /
        static_cast<double>(counters.num_resumed - seen_resumed_);
    const double b = config_.t_queue_ewma_weight;
    t_queue_micros_ = t_queue_samples_ == 0 ? sample : (1 - b) * t_queue_micros_ + b * sample;
    ++t_queue_samples_;
    seen_resumed_ = counters.num_resumed;
    seen_resume_delay_micros_ = counters.total_resume_delay_micros;
  }
}

void VampArbiter::ObserveStep(const StepTiming& t) {
  if (tax_ != nullptr) {
    tax_->ObserveStep({t.end_micros, t.step_micros, t.exposed_staging_micros, t.staged_bytes,
                       t.staged_share, t.routed_staging});
  }
  const SelfCalibrationConfig& s = config_.self_calibration;
  if (!s.enabled) return;
  auto update = [&](double sample, double* estimate, int64_t* samples) {
    *estimate = *samples == 0 ? sample : (1 - s.ewma_weight) * *estimate + s.ewma_weight * sample;
    ++*samples;
  };
  const int64_t tokens = t.prefill_tokens + t.decode_tokens;
  if (t.prefill_tokens >= s.min_prefill_tokens && tokens > 0) {
    // Re-prefill runs in steps like this one; staging waits are priced by c_eff, not here.
    update(std::max(0.0, t.step_micros - t.exposed_staging_micros) / static_cast<double>(tokens),
           &t_prefill_estimate_, &t_prefill_samples_);
  }
  if (t.prefill_tokens <= s.max_decode_step_prefill_tokens && t.decode_tokens > 0 &&
      t.offloaded_experts_per_layer > 0) {
    update(t.exposed_staging_micros / t.offloaded_experts_per_layer, &c_eff_estimate_,
           &c_eff_samples_);
  }
}

absl::Status VampArbiter::Reconfigure(const VampArbiterConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  const TaxModelConfig& a = config_.tax;
  const TaxModelConfig& b = config.tax;
  const bool rebuild = config.cost_model != config_.cost_model ||
                       a.window_micros != b.window_micros || a.window_slots != b.window_slots ||
                       a.h2d_bytes_per_s != b.h2d_bytes_per_s ||
                       a.routed_h2d_bytes_per_s != b.routed_h2d_bytes_per_s ||
                       a.overlap_fraction != b.overlap_fraction ||
                       config.self_calibration.enabled != config_.self_calibration.enabled;
  config_ = config;
  if (rebuild) {
    // What was measured under other settings does not carry over; the scheduler picks up the
    // new tracker at its next step boundary.
    reuse_ = MakeReuseTracker(config_);
    tax_ = MakeOffloadTax(config_);
  }
  return absl::OkStatus();
}

CostCoefficients VampArbiter::Current() const {
  CostCoefficients c = config_.costs;
  c.t_queue_micros = t_queue_micros_;
  const SelfCalibrationConfig& s = config_.self_calibration;
  if (s.enabled && t_prefill_samples_ >= s.min_samples) c.t_prefill_micros = t_prefill_estimate_;
  if (s.enabled && c_eff_samples_ >= s.min_samples) c.c_eff_micros = c_eff_estimate_;
  return c;
}

LiveCoefficients VampArbiter::live() const {
  const CostCoefficients c = Current();
  LiveCoefficients l;
  l.hit_rate = hit_rate_;
  l.t_queue_micros = c.t_queue_micros;
  l.t_prefill_micros = c.t_prefill_micros;
  l.c_eff_micros = c.c_eff_micros;
  l.t_prefill_samples = t_prefill_samples_;
  l.c_eff_samples = c_eff_samples_;
  l.t_queue_samples = t_queue_samples_;
  if (tax_ != nullptr) {
    l.h2d_bytes_per_s = tax_->h2d_bytes_per_s();
    l.h2d_samples = tax_->bandwidth_samples();
    l.routed_h2d_bytes_per_s = tax_->routed_h2d_bytes_per_s();
    l.routed_h2d_samples = tax_->routed_bandwidth_samples();
  }
  return l;
}

// ---------------------------------------------------------------------------------------------
// Decisions

namespace {

// Running requests other than `exclude`, in the order preemption takes them (static_arbiter.h:
// the newest first under FCFS, the largest (priority, arrival, seq) under the priority policy).
std::vector<const Request*> PreemptionOrder(const ArbiterContext& context, const Request* exclude) {
  std::vector<const Request*> order;
  order.reserve(context.num_running());
  for (int32_t i = context.num_running() - 1; i >= 0; --i) {
    const Request* r = &context.running(i);
    if (r != exclude) order.push_back(r);
  }
  if (context.config().policy == SchedulingPolicy::kPriority) {
    std::stable_sort(order.begin(), order.end(), [](const Request* a, const Request* b) {
      return std::make_tuple(a->priority(), a->arrival_micros(), a->seq()) >
             std::make_tuple(b->priority(), b->arrival_micros(), b->seq());
    });
  }
  return order;
}

// Preemption victims, in preemption order, until the uncached blocks they free cover `need`, and
// their cost C_p; no victims when they cannot cover it (or the requester is waiting).
struct Victims {
  std::vector<RequestId> ids;
  double cost_micros = -1;
};
Victims ChooseVictims(const ArbiterContext& context, const MemoryGap& gap,
                      const CostCoefficients& c, int32_t need) {
  Victims out;
  if (!gap.requester_running) return out;
  double cost = 0;
  int64_t freed = 0;
  for (const Request* v : PreemptionOrder(context, gap.requester)) {
    const PreemptionYield y = PreemptionYieldOf(*v, context.pool(), context.config().block_size);
    if (y.uncached_blocks == 0) continue;  // frees nothing the gap can use
    out.ids.push_back(v->id());
    cost += PreemptionCost(c, y.partial_tokens);
    freed += y.uncached_blocks;
    if (freed >= need) break;
  }
  if (freed >= need) {
    out.cost_micros = cost;
  } else {
    out.ids.clear();
  }
  return out;
}

// Index of the first block of `table` at or above `first` (>= 0), or table.size(). Ids and
// `first` are non-negative, so id >= first exactly when id - first has its sign bit clear, and a
// run of ids holds none at or above `first` when the AND of those differences is negative: a few
// vector instructions per 4 ids and no branch per id. The restore's holder check runs this over
// every running request's table: 1,024 × 2,048 ids at 32k contexts took 0.82 ms id by id on the
// dev box, 0.52 ms so (then bound by reading the 8 MiB of tables).
size_t FirstBlockAtOrAbove(const std::vector<BlockId>& table, BlockId first) {
  constexpr size_t kChunk = 64;
  const BlockId* ids = table.data();
  const size_t n = table.size();
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t end = std::min(n, begin + kChunk);
    BlockId all_below = -1;
    for (size_t k = begin; k < end; ++k) all_below &= ids[k] - first;
    if (all_below < 0) continue;
    for (size_t k = begin; k < end; ++k) {
      if (ids[k] >= first) return k;
    }
  }
  return n;
}

// What still makes progress when no plan covers the gap: the static arbiter's plan (evict what is
// cached, preempt the newest running request — the requester itself if it is the newest).
ArbiterPlan StaticFallback(const ArbiterContext& context, const MemoryGap& gap, ArbiterPlan plan) {
  plan.evict_blocks = std::min(gap.blocks, context.pool().num_free_cached());
  if (gap.requester_running) {
    if (const Request* v = NewestRunningRequest(context, context.config().policy)) {
      plan.preempt.push_back(v->id());
    }
  }
  if (plan.empty()) {
    plan.choice = "wait";
  } else if (plan.preempt.empty()) {
    plan.choice = "fallback:evict";
  } else {
    plan.choice = plan.evict_blocks > 0 ? "fallback:evict+preempt" : "fallback:preempt";
  }
  return plan;
}

}  // namespace

ArbiterPlan VampArbiter::Decide(const ArbiterContext& context, const MemoryGap& gap) {
  Observe(context.counters());
  return config_.cost_model == VampCostModel::kTax ? DecideTax(context, gap)
                                                   : DecidePaper(context, gap);
}

ArbiterPlan VampArbiter::DecidePaper(const ArbiterContext& context, const MemoryGap& gap) {
  const CostCoefficients c = Current();
  const KvBlockPool& pool = context.pool();
  const OffloadState& e = context.offload();
  const int32_t block_size = context.config().block_size;
  const int64_t step = context.step();
  const int32_t need = gap.blocks;
  const int32_t free_cached = pool.num_free_cached();
  const int32_t remaining = e.available ? e.remaining_groups : 0;
  const int64_t bpg = e.blocks_per_group;
  const bool can_offload = remaining > 0 && bpg > 0;
  const int64_t offload_step = config_.offload_step_groups;

  // With restore on, cold cached blocks are idle capacity: a gap they cover is no pressure.
  const bool cold_covers = config_.restore.enabled && free_cached >= need &&
                           OldestCachedAreCold(pool, step, need, config_.restore.cold_age_steps);
  if (!cold_covers) last_pressure_step_ = step;
  if (e.restore_pending && !cold_covers) {
    // The memory a pending restore holds back is needed after all: take it first.
    ArbiterPlan cancel;
    cancel.cancel_restore = true;
    cancel.choice = "cancel-restore";
    return cancel;
  }

  ArbiterPlan plan;
  ArbiterInputs& in = plan.inputs;
  in.hit_rate = hit_rate_;
  in.horizon_steps = DecodeHorizon(c, context);
  in.free_cached_blocks = free_cached;
  in.remaining_groups = remaining;
  in.blocks_per_group = e.blocks_per_group;
  in.t_prefill_micros = c.t_prefill_micros;
  in.c_eff_micros = c.c_eff_micros;
  in.t_queue_micros = c.t_queue_micros;
  ArbiterCosts& costs = plan.costs;

  // C_c: the gap's worth of LRU cached blocks.
  if (free_cached >= need) {
    costs.evict_micros = EvictionCost(c, pool, step, block_size, hit_rate_, need);
  }
  // C_e: whole offload steps covering the gap.
  int32_t offload_groups = 0;
  if (can_offload && remaining * bpg >= need) {
    const int64_t steps = CeilDiv(CeilDiv(need, bpg), offload_step);
    offload_groups = static_cast<int32_t>(std::min<int64_t>(steps * offload_step, remaining));
    costs.offload_micros =
        OffloadCost(c, offload_groups, e.experts_per_group, e.experts_per_layer, in.horizon_steps);
  }
  // C_b: offload without overshooting (or up to the limit), evict the rest.
  int32_t combined_groups = 0;
  int32_t combined_evict = 0;
  if (can_offload) {
    const int64_t groups = remaining * bpg >= need ? (need / bpg) / offload_step * offload_step
                                                   : static_cast<int64_t>(remaining);
    const int64_t rest = need - groups * bpg;
    if (groups > 0 && rest > 0 && rest <= free_cached) {
      combined_groups = static_cast<int32_t>(groups);
      combined_evict = static_cast<int32_t>(rest);
      costs.combined_micros = OffloadCost(c, combined_groups, e.experts_per_group,
                                          e.experts_per_layer, in.horizon_steps) +
                              EvictionCost(c, pool, step, block_size, hit_rate_, combined_evict);
    }
  }
  // C_p: victims until the uncached blocks they free cover the gap.
  Victims chosen = ChooseVictims(context, gap, c, need);
  std::vector<RequestId> victims = std::move(chosen.ids);
  if (!victims.empty()) {
    costs.preempt_micros = chosen.cost_micros;
    in.victims = static_cast<int32_t>(victims.size());
  }

  // The cheapest feasible plan; ties to the earlier candidate.
  enum Kind { kNone, kEvict, kCombined, kOffload, kPreempt };
  Kind best = kNone;
  double best_cost = std::numeric_limits<double>::infinity();
  for (auto [kind, cost] :
       {std::pair{kEvict, costs.evict_micros}, std::pair{kCombined, costs.combined_micros},
        std::pair{kOffload, costs.offload_micros}, std::pair{kPreempt, costs.preempt_micros}}) {
    if (cost >= 0 && cost < best_cost) {
      best = kind;
      best_cost = cost;
    }
  }
  // Spend idle capacity before growing the pool again (the restore rule's other half).
  if (cold_covers) best = kEvict;
  switch (best) {
    case kEvict:
      plan.evict_blocks = need;
      plan.choice = "evict";
      return plan;
    case kCombined:
      plan.offload_groups = combined_groups;
      plan.evict_blocks = combined_evict;
      plan.choice = "offload+evict";
      return plan;
    case kOffload:
      plan.offload_groups = offload_groups;
      plan.choice = "offload";
      return plan;
    case kPreempt:
      plan.preempt = std::move(victims);
      plan.choice = "preempt";
      return plan;
    case kNone:
      break;
  }
  // Nothing covers the gap in one plan: make what progress there is; the scheduler asks again.
  if (can_offload) {
    plan.offload_groups = remaining;
    plan.evict_blocks = static_cast<int32_t>(
        std::clamp<int64_t>(need - remaining * bpg, 0, static_cast<int64_t>(free_cached)));
    plan.choice = "fallback:offload";
    return plan;
  }
  return StaticFallback(context, gap, std::move(plan));
}

bool VampArbiter::ConcurrencyPays(int64_t now_micros) const {
  // The paper's cost model keeps no tracker: it never holds admissions back.
  return reuse_ == nullptr ||
         reuse_->ComputeBoundShare(now_micros) <= config_.tax.compute_bound_share;
}

double VampArbiter::QueueShare(double mean_queue_micros) const {
  const double threshold = config_.tax.ttft_queue_threshold_micros;
  const double ramp = config_.tax.ttft_weight_ramp;
  if (ramp <= 1) return mean_queue_micros > threshold ? 1.0 : 0.0;
  const double lo = threshold / ramp;
  if (!(mean_queue_micros > lo)) return 0.0;
  return std::min(1.0, std::log(mean_queue_micros / lo) / std::log(ramp * ramp));
}

double VampArbiter::TtftWeight(int64_t now, bool for_restore) const {
  // The TTFT weight applies while first tokens are late because of memory: requests wait in the
  // queue (the mean over the window, phased in around ttft_queue_threshold: QueueShare) and not
  // for compute. Queued for
  // compute, every µs of stall delays them all; with short queues, TTFT is not what hurts: GPU
  // time is the measure then (weight 1). Nor with a queue older than ttft_max_queue: it is not
  // draining, and only throughput (GPU time) shortens it.
  // A restore keeps the weight while the queue is long even when compute-bound: the admission hold
  // then keeps new requests within the static pool anyway, and what the groups still hold (cached
  // prefixes, running requests' growth) is on the queue's first-token path. Judged at GPU time,
  // the compute-bound share (pinned near its threshold by the hold's own feedback) flipped the
  // weight between a restore and the offload after it: in vamp-sim's Figure 9 at c = 28 the
  // boundary gave back and took back up to 64 groups 18 times; without the flip TTFT p99 halves
  // (bench/results/2026-12-03-restore-weight/).
  const double queue = reuse_->MeanQueueMicros(now);
  const double max_queue = config_.tax.ttft_max_queue_micros;
  if (max_queue > 0 && queue > max_queue) return 1.0;
  const double share = QueueShare(queue);
  if (share <= 0 || !(for_restore || ConcurrencyPays(now))) return 1.0;
  return 1.0 + (config_.tax.ttft_weight - 1.0) * share;
}

TaxComparison VampArbiter::Compare(int64_t now, int32_t from, int32_t to, double t_prefill) const {
  TaxComparison cmp;
  cmp.evaluated = true;
  cmp.groups = to - from;
  const int32_t lo = std::min(from, to);
  const int32_t hi = std::max(from, to);
  const double hi_tax = tax_->WindowMicros(now, hi);
  cmp.tax_micros = hi_tax - tax_->WindowMicros(now, lo);
  // The TPOT overhead of hi: its stall as a share of the window's compute. The budget is judged
  // at hi for growing to it and for restoring from it alike, so the two cannot flap across it.
  const double compute = tax_->ComputeMicros(now);
  cmp.tpot_overhead = compute > 0 ? hi_tax / compute : std::numeric_limits<double>::infinity();
  const double budget = config_.tax.ttft_tpot_budget;
  cmp.ttft_weight =
      budget <= 0 || cmp.tpot_overhead <= budget ? TtftWeight(now, /*for_restore=*/to < from) : 1.0;
  cmp.value_micros = reuse_->TokensBetween(now, lo, hi) * t_prefill * cmp.ttft_weight +
                     reuse_->WaitStepsBetween(now, lo, hi) * tax_->MeanStepMicros(now) *
                         config_.tax.memory_wait_weight;
  cmp.ghost_tokens = reuse_->GhostTokens(now);
  cmp.preempt_tokens = reuse_->PreemptionTokens(now);
  cmp.window_micros = tax_->window_micros();
  cmp.observed_steps = tax_->StepsInWindow(now);
  cmp.h2d_bytes_per_s = tax_->h2d_bytes_per_s();
  cmp.routed_h2d_bytes_per_s = tax_->routed_h2d_bytes_per_s();
  cmp.mean_queue_micros = reuse_->MeanQueueMicros(now);
  cmp.compute_bound_share = reuse_->ComputeBoundShare(now);
  return cmp;
}

ArbiterPlan VampArbiter::DecideTax(const ArbiterContext& context, const MemoryGap& gap) {
  const CostCoefficients c = Current();
  const OffloadState& e = context.offload();
  const int64_t step = context.step();
  const int64_t now = context.now_micros();
  const int32_t need = gap.blocks;
  const int32_t free_cached = context.pool().num_free_cached();
  const int64_t bpg = e.blocks_per_group;
  const int32_t offloaded = e.offloaded_groups;
  const double margin = config_.tax.margin;
  tax_->SetGeometry(e.staged_bytes_per_group, e.max_groups);

  ArbiterPlan plan;
  ArbiterInputs& in = plan.inputs;
  in.hit_rate = hit_rate_;
  in.free_cached_blocks = free_cached;
  in.remaining_groups = e.available ? e.remaining_groups : 0;
  in.blocks_per_group = e.blocks_per_group;
  in.t_prefill_micros = c.t_prefill_micros;
  in.c_eff_micros = c.c_eff_micros;
  in.t_queue_micros = c.t_queue_micros;
  const auto net = [margin](const TaxComparison& cmp) {
    return cmp.value_micros - (1 + margin) * cmp.tax_micros;
  };

  // The groups a move can bring: a pending restore's by cancelling it, else whole offload steps
  // up to the cap.
  const int32_t pending = e.restore_pending ? e.restore_pending_groups : 0;
  const int32_t remaining = pending > 0 ? 0 : (e.available ? e.remaining_groups : 0);
  const bool can_grow = bpg > 0 && (pending > 0 || remaining > 0);
  const auto grow = [&](int32_t groups, const TaxComparison& cmp, absl::string_view choice) {
    plan.tax = cmp;
    plan.costs.offload_micros = (1 + margin) * cmp.tax_micros;
    if (pending > 0) {
      plan.cancel_restore = true;
      plan.choice = "cancel-restore";
      // Keeping the groups counts as an offload: the same hold applies before the next restore,
      // or a restore whose evidence was forgotten (ForgetAbove) could start again at once.
      last_offload_step_ = step;
      return plan;
    }
    plan.offload_groups = groups;
    const int64_t rest = need - groups * bpg;
    if (rest > 0) plan.evict_blocks = static_cast<int32_t>(std::min<int64_t>(rest, free_cached));
    plan.choice = plan.evict_blocks > 0 ? absl::StrCat(choice, "+evict") : std::string(choice);
    last_offload_step_ = step;
    return plan;
  };

  // 1. The offload worth more than its tax, the most net value first — once the window holds
  // enough steps to tell.
  TaxComparison first;  // the smallest move, for the log when nothing grows
  const bool evidence = tax_->StepsInWindow(now) >= config_.tax.min_evidence_steps;
  if (can_grow) {
    int32_t best_groups = 0;
    double best_net = 0;
    TaxComparison best;
    const int32_t unit = pending > 0 ? pending : config_.offload_step_groups;
    const int32_t limit = pending > 0 ? pending : remaining;
    for (int32_t g = std::min(unit, limit);; g = std::min(g + unit, limit)) {
      const TaxComparison cmp =
          Compare(now, offloaded - pending, offloaded - pending + g, c.t_prefill_micros);
      if (!first.evaluated) first = cmp;
      if (evidence && net(cmp) > best_net) {
        best_net = net(cmp);
        best_groups = g;
        best = cmp;
      }
      if (g >= limit) break;
    }
    if (best_groups > 0) return grow(best_groups, best, "offload");
  }
  plan.tax = first;
  if (first.evaluated) plan.costs.offload_micros = (1 + margin) * first.tax_micros;

  // 2. Reuse that nobody measured is free to evict.
  plan.costs.evict_micros = 0;
  if (free_cached >= need) {
    plan.evict_blocks = need;
    plan.choice = "evict";
    return plan;
  }

  // 3. A running requester: preempt, or grow when the tax over the window is the smaller price.
  // Both sides in GPU time: a preemption wastes the victims' computed tokens and a scheduling
  // round (the paper's t_queue is one request's waiting time, not work, and under overload it
  // grows without bound, which would make any offload look cheap).
  CostCoefficients gpu = c;
  gpu.t_queue_micros = 0;
  Victims victims = ChooseVictims(context, gap, gpu, need);
  if (!victims.ids.empty()) {
    plan.costs.preempt_micros = victims.cost_micros;
    in.victims = static_cast<int32_t>(victims.ids.size());
  }
  // When no set of other requests covers the gap, the alternative to growing is the static
  // arbiter's: preempt the newest running request (perhaps the requester itself).
  double preempt_price = victims.cost_micros;
  if (victims.ids.empty() && gap.requester_running) {
    if (const Request* v = NewestRunningRequest(context, context.config().policy)) {
      preempt_price = PreemptionCost(
          gpu, PreemptionYieldOf(*v, context.pool(), context.config().block_size).partial_tokens);
    }
  }
  if (gap.requester_running && can_grow && preempt_price >= 0 && (evidence || pending > 0)) {
    const int64_t short_blocks = need - free_cached;
    int32_t cover = pending;
    if (pending == 0) {
      const int64_t unit = config_.offload_step_groups;
      cover = static_cast<int32_t>(
          std::min<int64_t>(CeilDiv(CeilDiv(short_blocks, bpg), unit) * unit, remaining));
    }
    if (cover * bpg >= short_blocks) {
      TaxComparison cmp =
          Compare(now, offloaded - pending, offloaded - pending + cover, c.t_prefill_micros);
      // A one-off preemption against a tax paid on every step for as long as the groups stay:
      // at least restore.min_hold_steps (restores wait that long), the whole window without
      // restore. Per-step rates come from the window (no offload before it holds
      // min_evidence_steps: at start-up it has seen only prefill-heavy steps, behind which any
      // copy hides); with no step seen at all the tax is the bare copy time.
      const double hold = static_cast<double>(
          config_.restore.enabled ? config_.restore.min_hold_steps : cmp.observed_steps);
      const double steps = static_cast<double>(cmp.observed_steps);
      const double tax = steps > 0 ? cmp.tax_micros / steps : tax_->StepMicros(cover, 0);
      const double value = steps > 0 ? cmp.value_micros / steps : 0;
      if (((1 + margin) * tax - value) * hold < preempt_price) {
        return grow(cover, cmp, "offload:avoid-preempt");
      }
    }
  }
  if (!victims.ids.empty()) {
    plan.preempt = std::move(victims.ids);
    plan.choice = "preempt";
    return plan;
  }
  // 4. Nothing covers the gap at a price worth paying: what the static arbiter would do.
  return StaticFallback(context, gap, std::move(plan));
}

int32_t VampArbiter::RestoreTax(const ArbiterContext& context) {
  const RestoreConfig& r = config_.restore;
  const OffloadState& e = context.offload();
  const int64_t step = context.step();
  const int64_t now = context.now_micros();
  if (e.offloaded_groups <= 0 || e.restore_pending || e.blocks_per_group <= 0) return 0;
  if (step < next_restore_check_step_) return 0;
  if (tax_->StepsInWindow(now) < config_.tax.min_evidence_steps) return 0;
  if (last_offload_step_ >= 0 && step - last_offload_step_ < r.min_hold_steps) return 0;
  next_restore_check_step_ = step + r.check_interval_steps;
  // The restore saving the most tax net of the value it loses, in whole restore steps: when the
  // offload serves nothing any more, all of it goes back at once (a restore waits for its tail
  // blocks to be released, so restoring step by step would keep most of the tax for many turns).
  const int32_t unit = std::max(1, r.step_groups > 0 ? r.step_groups : config_.offload_step_groups);
  const double t_prefill = Current().t_prefill_micros;
  // The working set: blocks in use plus cached free blocks used within the reuse age that covers
  // working_set_quantile of the window's hits. What lies beyond it is idle by the traffic's own
  // measure, however much the window's older evidence valued it; when the working set fits in a
  // smaller pool with headroom, the groups that make the difference go back now.
  const KvBlockPool& pool = context.pool();
  const int64_t reuse_age = std::max<int64_t>(r.working_set_min_age_steps,
                                              reuse_->ReuseAgeSteps(now, r.working_set_quantile));
  // (Counted from the pool's step index: walking the blocks cost up to 0.6 ms per check.)
  const int64_t idle_cached = pool.CountCachedFreeUsedBefore(step - reuse_age);
  const int64_t working = int64_t{pool.num_blocks()} - pool.num_free_uncached() - idle_cached;
  // Over the whole restore steps: the one with the most net saving by the window's evidence, and
  // the largest that leaves the working set room (the pool only shrinks as g grows).
  int32_t best_groups = 0;
  double best_net = 0;
  int32_t idle_groups = 0;
  for (int32_t g = std::min(unit, e.offloaded_groups);;
       g = std::min(g + unit, e.offloaded_groups)) {
    const TaxComparison cmp = Compare(now, e.offloaded_groups, e.offloaded_groups - g, t_prefill);
    const double net = cmp.tax_micros - (1 + config_.tax.margin) * cmp.value_micros;
    if (net > best_net) {
      best_net = net;
      best_groups = g;
      last_restore_ = cmp;
    }
    const int64_t left = int64_t{pool.num_blocks()} - int64_t{g} * e.blocks_per_group;
    if (static_cast<double>(working) * (1 + r.working_set_headroom) <= static_cast<double>(left)) {
      idle_groups = g;
    }
    if (g >= e.offloaded_groups) break;
  }
  if (idle_groups > best_groups) {
    best_groups = idle_groups;
    last_restore_ = Compare(now, e.offloaded_groups, e.offloaded_groups - idle_groups, t_prefill);
    reuse_->ForgetAbove(e.offloaded_groups - idle_groups);
  }
  if (best_groups > 0) {
    last_restore_.working_set_blocks = working;
    last_restore_.reuse_age_steps = reuse_age;
  }
  return best_groups;
}

ArbiterPlan VampArbiter::PreemptForRestore(const ArbiterContext& context) {
  ArbiterPlan plan;
  const RestoreConfig& r = config_.restore;
  const OffloadState& e = context.offload();
  const KvBlockPool& pool = context.pool();
  const int64_t step = context.step();
  const int64_t now = context.now_micros();
  if (config_.cost_model != VampCostModel::kTax || !r.enabled || !r.preempt_holders ||
      !e.restore_pending || e.restore_pending_groups <= 0 || !pool.shrink_pending() ||
      step < next_evacuation_check_step_) {
    return plan;
  }
  next_evacuation_check_step_ = step + r.check_interval_steps;
  const int64_t steps = tax_->StepsInWindow(now);
  if (steps <= 0) return plan;
  // Staging stall per step that the pending restore removes once it completes (µs).
  const double saving_per_step =
      (tax_->WindowMicros(now, e.offloaded_groups) -
       tax_->WindowMicros(now, e.offloaded_groups - e.restore_pending_groups)) /
      static_cast<double>(steps);
  const double t_prefill = Current().t_prefill_micros;
  // The recompute is prefill queued ahead of whoever waits for admission: on their first-token
  // path (weighted like one) while anyone waits. With an empty queue it delays no first token and
  // is GPU time like the tax. (The window's TTFT weight alone is history: at the end of a busy
  // phase it still weighed the last holders' recompute 16x while nobody waited, and the restore
  // waited for them through the light phase's first minute.)
  const double recompute_weight = context.num_waiting() > 0 ? TtftWeight(now) : 1.0;
  const int32_t block_size = context.config().block_size;
  // The holders: remaining steps (the restore completes after the last one's) and recompute.
  struct Holder {
    RequestId id;
    int64_t remaining_steps;
    double recompute_micros;
  };
  std::vector<Holder> holders;
  for (int32_t i = 0; i < context.num_running(); ++i) {
    const Request& q = context.running(i);
    // A request still in prefill has its first token ahead of it: preempting it would put that
    // on the line (TTFT weighs more than the tax), and its prefill ends soon anyway.
    if (q.num_computed_tokens() < q.num_prompt_tokens()) continue;
    const size_t k = FirstBlockAtOrAbove(q.block_ids(), pool.shrink_begin());
    if (k == q.block_ids().size()) continue;  // holds nothing of the tail
    // Its blocks before the first withdrawn one stay cached and are hit again on resume.
    const int64_t recompute =
        std::max<int64_t>(0, q.num_computed_tokens() - static_cast<int64_t>(k) * block_size);
    const int64_t remaining = std::min<int64_t>(
        q.RemainingOutputBudget(context.config().max_model_len), r.benefit_horizon_steps);
    holders.push_back(
        {q.id(), remaining, static_cast<double>(recompute) * t_prefill * recompute_weight});
  }
  if (holders.empty()) return plan;
  std::sort(holders.begin(), holders.end(),
            [](const Holder& a, const Holder& b) { return a.remaining_steps > b.remaining_steps; });
  // Preempting the n longest-running holders ends the wait when the (n+1)-th finishes.
  double recompute = 0;
  double best_net = 0;
  size_t best_n = 0;
  TaxComparison best;
  for (size_t n = 1; n <= holders.size(); ++n) {
    recompute += holders[n - 1].recompute_micros;
    const int64_t wait_after = n < holders.size() ? holders[n].remaining_steps : 0;
    const double saving =
        saving_per_step * static_cast<double>(holders[0].remaining_steps - wait_after);
    const double net = saving - (1 + config_.tax.margin) * recompute;
    if (net > best_net) {
      best_net = net;
      best_n = n;
      best = Compare(now, e.offloaded_groups, e.offloaded_groups - e.restore_pending_groups,
                     t_prefill);
      best.tax_micros = saving;
      best.value_micros = recompute;
    }
  }
  for (size_t n = 0; n < best_n; ++n) plan.preempt.push_back(holders[n].id);
  if (best_n > 0) {
    plan.choice = "restore-preempt";
    plan.tax = best;
  }
  return plan;
}

int32_t VampArbiter::OnStepBoundary(const ArbiterContext& context) {
  Observe(context.counters());
  if (tax_ != nullptr) {
    // Before the steps that follow are observed, so that their tax is counted for every group
    // count the cap allows.
    tax_->SetGeometry(context.offload().staged_bytes_per_group, context.offload().max_groups);
  }
  if (!config_.restore.enabled) return 0;
  return config_.cost_model == VampCostModel::kTax ? RestoreTax(context) : RestorePaper(context);
}

int32_t VampArbiter::RestorePaper(const ArbiterContext& context) {
  const RestoreConfig& r = config_.restore;
  const OffloadState& e = context.offload();
  const int64_t step = context.step();
  if (e.offloaded_groups <= 0 || e.restore_pending || e.blocks_per_group <= 0) return 0;
  if (step - last_pressure_step_ < r.quiet_steps ||
      step - last_restore_step_ < r.check_interval_steps) {
    return 0;
  }
  if (step < next_restore_check_step_) return 0;
  const int32_t groups =
      std::min(r.step_groups > 0 ? r.step_groups : config_.offload_step_groups, e.offloaded_groups);
  const double required =
      (1.0 + r.headroom) * static_cast<double>(groups) * static_cast<double>(e.blocks_per_group);
  const KvBlockPool& pool = context.pool();
  int64_t idle = pool.num_free_uncached();
  if (idle < required) {
    pool.ForEachCachedFree([&](const KvBlock& b) {
      if (step - b.last_used_step < r.cold_age_steps) return false;  // LRU: the rest are younger
      return (idle += b.EvictionBlocks()) < required;
    });
  }
  if (idle < required) {
    next_restore_check_step_ = step + r.check_interval_steps;
    return 0;
  }
  // Price it: the restore takes the tail [first, num_blocks) whatever it holds.
  const CostCoefficients c = Current();
  const int32_t block_size = context.config().block_size;
  const BlockId first = static_cast<BlockId>(
      std::max<int64_t>(0, pool.num_blocks() - static_cast<int64_t>(groups) * e.blocks_per_group));
  double cost = 0;
  for (BlockId id = first; id < pool.num_blocks(); ++id) {
    const KvBlock& b = pool.block(id);
    if (b.ref_count == 0 && b.cached) {
      cost += BlockEvictionCost(c, hit_rate_, step - b.last_used_step, block_size);
    }
  }
  for (int32_t i = 0; i < context.num_running(); ++i) {
    const std::vector<BlockId>& table = context.running(i).block_ids();
    for (size_t k = 0; k < table.size(); ++k) {
      if (table[k] >= first) {
        cost +=
            static_cast<double>(table.size() - k) * BlockEvictionCost(c, hit_rate_, 0, block_size);
        break;
      }
    }
  }
  const double saving =
      OffloadCost(c, groups, e.experts_per_group, /*experts_per_layer=*/0, r.benefit_horizon_steps);
  if (cost >= saving) {
    next_restore_check_step_ = step + r.check_interval_steps;
    return 0;
  }
  last_restore_step_ = step;
  return groups;
}

absl::StatusOr<std::unique_ptr<MemoryArbiter>> CreateArbiter(absl::string_view name,
                                                             const VampArbiterConfig& vamp) {
  if (name == "static") return std::make_unique<StaticArbiter>();
  if (name == "vamp") {
    if (absl::Status s = vamp.Validate(); !s.ok()) return s;
    return std::make_unique<VampArbiter>(vamp);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown arbiter '", name, "' (known: static, vamp)"));
}

}  // namespace vamp
