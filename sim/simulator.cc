#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/stats/run_stats.h"
#include "bench/workload/token_synth.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "controller/core/scheduler.h"
#include "controller/core/static_arbiter.h"
#include "sim/step_time_model.h"

namespace vamp::sim {

// ---------------------------------------------------------------------------------------------
// Policies and statistics

absl::StatusOr<PolicySpec> ParsePolicy(absl::string_view label, const VampArbiterConfig& vamp) {
  PolicySpec p;
  p.label = std::string(label);
  p.vamp = vamp;
  if (label == "static") return p;
  std::vector<std::string> parts = absl::StrSplit(label, '+');
  const absl::string_view head = parts[0];
  double percent = 0;
  absl::StatusOr<OffloadCap> cap = absl::InvalidArgumentError("not vamp-<r>");
  if (absl::StartsWith(head, "vamp-") && absl::SimpleAtod(head.substr(5), &percent)) {
    cap = OffloadCap::FromRatio(percent / 100.0, "r / 100");
  }
  if (!cap.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy '", label,
                     "': expected 'static' or 'vamp-<r>' with 0 <= r <= 100, optionally "
                     "followed by +paper, +restore, +norestore, +calib, +nocalib (",
                     cap.status().message(), ")"));
  }
  p.arbiter = "vamp";
  p.offload_cap = *cap;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "paper") {
      // The paper's arbiter as published: its cost model, no restore, no self-calibration.
      p.vamp.cost_model = VampCostModel::kPaper;
      p.vamp.restore.enabled = false;
      p.vamp.self_calibration.enabled = false;
    } else if (parts[i] == "restore" || parts[i] == "norestore") {
      p.vamp.restore.enabled = parts[i] == "restore";
    } else if (parts[i] == "calib" || parts[i] == "nocalib") {
      p.vamp.self_calibration.enabled = parts[i] == "calib";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("policy '", label, "': unknown option '+", parts[i],
                       "' (known: +paper, +restore, +norestore, +calib, +nocalib)"));
    }
  }
  VAMP_RETURN_IF_ERROR(p.vamp.Validate());
  return p;
}

double Percentile(std::vector<double> v, double p) {
  return v.empty() ? 0 : bench::Percentile(std::move(v), p);
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 50); }

double SimResult::RequestThroughput() const {
  const double span = last_finish_s - first_arrival_s;
  return span > 0 ? static_cast<double>(turns_completed) / span : 0;
}

double SimResult::OutputTokensPerSecond() const {
  const double span = last_finish_s - first_arrival_s;
  return span > 0 ? static_cast<double>(output_tokens) / span : 0;
}

double SimResult::MeanTpotMs() const {
  if (tpot_ms.empty()) return 0;
  double sum = 0;
  for (double t : tpot_ms) sum += t;
  return sum / static_cast<double>(tpot_ms.size());
}

double SimResult::MeanQueueSeconds() const {
  return counters.num_admitted == 0
             ? 0
             : 1e-6 * static_cast<double>(counters.total_queue_micros) / counters.num_admitted;
}

// ---------------------------------------------------------------------------------------------
// The simulation

namespace {

absl::Mutex progress_mu;

int64_t SecondsToMicros(double s) { return static_cast<int64_t>(std::llround(s * 1e6)); }

class Simulation {
 public:
  Simulation(const workload::Workload& workload, const PolicySpec& policy,
             const SimOptions& options)
      : workload_(workload),
        policy_(policy),
        options_(options),
        model_(options.calibration, options.staging, options.routed_staging_max_tokens),
        log_(std::max<size_t>(1, options.decision_log_capacity)) {}

  absl::StatusOr<SimResult> Run();

 private:
  struct SessionState {
    size_t next_turn = 0;
    std::vector<int32_t> history;  // kept only when the next turn extends it
  };
  struct Live {
    uint32_t session = 0;
    uint32_t turn = 0;
    int32_t prompt_len = 0;
    int64_t arrival_micros = 0;
    int64_t first_token_micros = -1;
  };
  using Due = std::pair<int64_t, size_t>;  // (due time µs, session)

  absl::Status Setup();
  void IssueDue();
  void Issue(size_t session);
  void Finished(RequestId id, const Live& live, int64_t now);
  int32_t Token(RequestId id, int32_t position) const {
    return static_cast<int32_t>(workload::Mix64(options_.seed * 0x9E3779B97F4A7C15ULL ^
                                                (id * 0xD6E8FEB86659FD93ULL) ^
                                                static_cast<uint64_t>(position)) %
                                static_cast<uint64_t>(vocab_));
  }
  void RecordDecisions();
  void Sample(int64_t now);
  void Progress(bool force);

  const workload::Workload& workload_;
  const PolicySpec& policy_;
  const SimOptions& options_;
  StepTimeModel model_;
  int32_t vocab_ = 1;
  ManualClock clock_;
  std::unique_ptr<SimOffloader> offloader_;
  std::unique_ptr<Scheduler> scheduler_;
  VampArbiter* vamp_ = nullptr;
  std::vector<SessionState> sessions_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;
  absl::flat_hash_map<RequestId, Live> live_;
  std::vector<SequenceWork> batch_;
  StepOutput output_;
  DecisionLog log_;
  SimResult result_;
  int64_t next_sample_micros_ = 0;
  std::chrono::steady_clock::time_point wall_start_;
  std::chrono::steady_clock::time_point next_progress_;
};

absl::Status Simulation::Setup() {
  result_.policy = policy_.label;
  result_.workload = workload_.name;
  for (const workload::Session& session : workload_.sessions) {
    result_.turns_per_session.push_back(static_cast<int32_t>(session.turns.size()));
  }
  result_.turns_total = workload_.NumTurns();
  vocab_ = std::max(2, workload_.vocab_size);
  OffloadOptions offload = options_.offload;
  offload.cap = policy_.offload_cap;
  offload.block_size = options_.scheduler.block_size;
  VAMP_ASSIGN_OR_RETURN(result_.geometry,
                        ComputeOffloadGeometry(options_.calibration.model, offload));
  SchedulerConfig config = options_.scheduler;
  config.num_blocks = result_.geometry.base_blocks();
  // A model with recurrent state: prefix-cache hits need snapshots of it, in KV blocks, as the
  // agents report to the controller (KvCacheManager keeps and evicts them).
  const int64_t state_bytes = options_.calibration.model.RecurrentStateBytesPerSeq();
  config.recurrent_state_blocks = static_cast<int32_t>(
      (state_bytes + result_.geometry.kv_block_bytes - 1) / result_.geometry.kv_block_bytes);
  if (state_bytes > 0 && options_.snapshot_blocks >= 1) {
    config.recurrent_state_blocks = options_.snapshot_blocks;
  }
  result_.base_blocks = config.num_blocks;
  result_.max_blocks = config.num_blocks;
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<MemoryArbiter> arbiter,
                        CreateArbiter(policy_.arbiter, policy_.vamp));
  if (policy_.arbiter == "vamp") {
    vamp_ = static_cast<VampArbiter*>(arbiter.get());
    offloader_ = std::make_unique<SimOffloader>(result_.geometry, options_.remap);
  }
  VAMP_ASSIGN_OR_RETURN(scheduler_,
                        Scheduler::Create(config, &clock_, std::move(arbiter), offloader_.get()));
  sessions_.resize(workload_.sessions.size());
  result_.first_arrival_s = -1;
  for (size_t s = 0; s < workload_.sessions.size(); ++s) {
    const workload::Session& session = workload_.sessions[s];
    if (session.turns.empty()) continue;
    due_.push({SecondsToMicros(session.start_s + session.turns[0].arrival_offset_s), s});
  }
  return absl::OkStatus();
}

void Simulation::IssueDue() {
  const int64_t now = clock_.NowMicros();
  while (!due_.empty() && due_.top().first <= now) {
    const auto [when, session] = due_.top();
    due_.pop();
    const workload::Session& s = workload_.sessions[session];
    SessionState& state = sessions_[session];
    const size_t k = state.next_turn;
    const workload::Turn& turn = s.turns[k];
    std::vector<int32_t> prompt;
    if (turn.extends_history) prompt = std::move(state.history);
    state.history.clear();
    prompt.insert(prompt.end(), turn.new_tokens.begin(), turn.new_tokens.end());
    const bool next_extends = k + 1 < s.turns.size() && s.turns[k + 1].extends_history;
    if (next_extends) state.history = prompt;
    // A later turn that does not wait for this one is due at its own offset.
    if (k + 1 < s.turns.size() && !s.turns[k + 1].after_previous) {
      due_.push({SecondsToMicros(s.start_s + s.turns[k + 1].arrival_offset_s), session});
    }
    ++state.next_turn;

    const RequestId id = (static_cast<RequestId>(session) << 20) | static_cast<RequestId>(k);
    Live live;
    live.session = static_cast<uint32_t>(session);
    live.turn = static_cast<uint32_t>(k);
    live.prompt_len = static_cast<int32_t>(prompt.size());
    live.arrival_micros = when;
    RequestSpec spec;
    spec.id = id;
    spec.prompt_token_ids = std::move(prompt);
    spec.sampling_params.max_tokens = turn.output_tokens;
    spec.sampling_params.ignore_eos = true;
    spec.arrival_micros = when;
    ++result_.turns_issued;
    if (result_.first_arrival_s < 0) result_.first_arrival_s = when * 1e-6;
    if (absl::Status st = scheduler_->AddRequest(std::move(spec)); !st.ok()) {
      ++result_.turns_rejected;
      // The session goes on without this turn's answer.
      if (k + 1 < s.turns.size() && s.turns[k + 1].after_previous) {
        due_.push(
            {std::max(now, SecondsToMicros(s.start_s + s.turns[k + 1].arrival_offset_s)), session});
      }
      continue;
    }
    live_.emplace(id, live);
  }
}

void Simulation::Finished(RequestId id, const Live& live, int64_t now) {
  const workload::Session& s = workload_.sessions[live.session];
  SessionState& state = sessions_[live.session];
  const size_t k = live.turn;
  const int32_t outputs = s.turns[k].output_tokens;
  ++result_.turns_completed;
  result_.output_tokens += outputs;
  result_.last_finish_s = std::max(result_.last_finish_s, now * 1e-6);
  TurnRecord& record = result_.turn_records.emplace_back();
  record.session = live.session;
  record.turn = live.turn;
  record.arrival_s = live.arrival_micros * 1e-6;
  record.ttft_s = (live.first_token_micros - live.arrival_micros) * 1e-6;
  record.finish_s = now * 1e-6;
  record.output_tokens = outputs;
  if (!(options_.exclude_first_turn && k == 0)) result_.ttft_s.push_back(record.ttft_s);
  if (outputs >= 2) {
    record.tpot_ms = (now - live.first_token_micros) * 1e-3 / (outputs - 1);
    result_.tpot_ms.push_back(record.tpot_ms);
  }
  if (k + 1 < s.turns.size() && s.turns[k + 1].extends_history) {
    for (int32_t i = 0; i < outputs; ++i) state.history.push_back(Token(id, live.prompt_len + i));
  }
  if (k + 1 < s.turns.size() && s.turns[k + 1].after_previous) {
    const workload::Turn& next = s.turns[k + 1];
    due_.push({std::max(SecondsToMicros(s.start_s + next.arrival_offset_s),
                        now + SecondsToMicros(next.think_time_s)),
               live.session});
  }
}

void Simulation::RecordDecisions() {
  log_.AppendAll(clock_.NowMicros(), scheduler_->step_decisions());
  for (const ArbiterRecord& r : scheduler_->step_decisions()) {
    const ArbiterCosts& c = r.plan.costs;
    if (c.evict_micros < 0 || c.offload_micros < 0) continue;
    if (r.plan.choice == "evict") {
      result_.evict_choice_cc_ms.push_back(c.evict_micros * 1e-3);
      result_.evict_choice_ce_ms.push_back(c.offload_micros * 1e-3);
    } else if (r.plan.choice == "offload") {
      result_.offload_choice_cc_ms.push_back(c.evict_micros * 1e-3);
      result_.offload_choice_ce_ms.push_back(c.offload_micros * 1e-3);
    }
  }
}

void Simulation::Sample(int64_t now) {
  if (now < next_sample_micros_) return;
  const KvBlockPool& pool = scheduler_->pool();
  TimeSample t;
  t.t_s = now * 1e-6;
  t.num_blocks = pool.num_blocks();
  t.num_snapshot_blocks = pool.num_snapshot_blocks();
  t.offload_ratio = offloader_ ? static_cast<double>(offloader_->offloaded_experts_per_layer()) /
                                     result_.geometry.experts_per_layer
                               : 0;
  t.kv_usage = pool.Usage();
  t.running = scheduler_->num_running();
  t.waiting = scheduler_->num_waiting();
  t.hit_rate = scheduler_->counters().prefix_cache.HitRate();
  result_.series.push_back(t);
  const int64_t interval = std::max<int64_t>(1, SecondsToMicros(options_.sample_interval_s));
  next_sample_micros_ = (now / interval + 1) * interval;
}

void Simulation::Progress(bool force) {
  if (options_.progress_label.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now < next_progress_) return;
  next_progress_ =
      now + std::chrono::milliseconds(static_cast<int64_t>(options_.progress_interval_s * 1000));
  const double wall = std::chrono::duration<double>(now - wall_start_).count();
  absl::MutexLock lock(&progress_mu);
  std::cerr << absl::StrFormat(
      "[%s] virtual %.0f s, turns %d/%d, steps %d, pool %d blocks, wall %.1f s%s\n",
      options_.progress_label, clock_.NowSeconds(), result_.turns_completed, result_.turns_total,
      result_.steps, scheduler_->pool().num_blocks(), wall, force ? " (done)" : "");
}

absl::StatusOr<SimResult> Simulation::Run() {
  wall_start_ = std::chrono::steady_clock::now();
  next_progress_ = wall_start_ + std::chrono::milliseconds(
                                     static_cast<int64_t>(options_.progress_interval_s * 1000));
  VAMP_RETURN_IF_ERROR(Setup());
  const int64_t stop = options_.max_time_s > 0 ? SecondsToMicros(options_.max_time_s) : -1;
  int64_t idle_plans = 0;
  for (;;) {
    if (stop >= 0 && clock_.NowMicros() >= stop) break;
    IssueDue();
    if (!scheduler_->has_unfinished_requests()) {
      if (due_.empty()) break;
      clock_.SetMicros(std::max(clock_.NowMicros(), due_.top().first));
      continue;
    }
    absl::StatusOr<StepPlan> plan = scheduler_->Schedule();
    if (!plan.ok()) return plan.status();
    RecordDecisions();
    const double remap_us = offloader_ ? offloader_->TakeRemapMicros() : 0;
    result_.max_blocks = std::max(result_.max_blocks, plan->num_blocks);
    if (plan->empty()) {
      // Nothing could run now. Without anything running, only an arrival can change that —
      // unless this step preempted (a restore preempts the holders of the memory it withdraws,
      // and the scheduler admits no one in the step that preempted; the preemptions may have
      // travelled with the restore rather than the plan): like the serving engine, which sends
      // such a plan and schedules again, the next step admits them.
      const bool preempted =
          !plan->preempted_ids.empty() ||
          std::any_of(scheduler_->step_decisions().begin(), scheduler_->step_decisions().end(),
                      [](const ArbiterRecord& d) { return d.requests_preempted > 0; });
      if (scheduler_->num_running() == 0 && !preempted && !due_.empty()) {
        clock_.SetMicros(
            std::max(clock_.NowMicros() + SecondsToMicros(remap_us * 1e-6), due_.top().first));
        continue;
      }
      if (++idle_plans > 1000) {
        result_.stalled = true;
        break;
      }
      clock_.AdvanceMicros(1000 + static_cast<int64_t>(remap_us));
      continue;
    }
    idle_plans = 0;

    // The simulated agents run the step.
    batch_.clear();
    output_.step = plan->step;
    output_.sampled.clear();
    int64_t prefill_tokens = 0;
    int64_t decode_tokens = 0;
    auto run = [&](RequestId id, int32_t computed, int32_t scheduled) {
      batch_.push_back({scheduled, computed});
      const Request* r = scheduler_->FindRequest(id);
      if (scheduled == 1 && r->num_output_tokens() > 0) {
        ++decode_tokens;
      } else {
        prefill_tokens += scheduled;
      }
      if (r->num_computed_tokens() == r->num_tokens()) {
        SampledTokens& s = output_.sampled.emplace_back();
        s.request_id = id;
        s.token_ids.push_back(Token(id, r->num_tokens()));
      }
    };
    for (const NewRequestPlan& p : plan->new_requests) {
      run(p.request_id, p.num_computed_tokens, p.num_scheduled_tokens);
    }
    for (const CachedRequestPlan& p : plan->cached_requests) {
      run(p.request_id, p.num_computed_tokens, p.num_scheduled_tokens);
    }
    const int32_t offloaded = offloader_ ? offloader_->offloaded_experts_per_layer() : 0;
    const StepTime t = model_.Estimate(batch_, offloaded);
    const double step_us = t.total_us + remap_us;
    clock_.AdvanceMicros(std::max<int64_t>(1, std::llround(step_us)));
    ++result_.steps;
    result_.busy_s += step_us * 1e-6;
    result_.exposed_copy_s += t.exposed_copy_us * 1e-6;
    result_.remap_s += remap_us * 1e-6;
    if (vamp_ != nullptr) {
      StepTiming timing;
      timing.step_micros = t.total_us;
      timing.exposed_staging_micros = t.exposed_copy_us;
      timing.prefill_tokens = prefill_tokens;
      timing.decode_tokens = decode_tokens;
      timing.offloaded_experts_per_layer = offloaded;
      timing.end_micros = clock_.NowMicros();
      timing.staged_share = t.copy_share;
      timing.routed_staging = t.routed;
      if (offloader_) {
        timing.staged_bytes = static_cast<int64_t>(
            t.copy_share * static_cast<double>(offloaded) /
            std::max(1, offloader_->ExpertsPerGroup()) *
            static_cast<double>(offloader_->StagedBytesPerGroup()));
      }
      vamp_->ObserveStep(timing);
    }

    absl::StatusOr<std::vector<RequestOutput>> outputs = scheduler_->UpdateFromOutput(output_);
    if (!outputs.ok()) return outputs.status();
    const int64_t now = clock_.NowMicros();
    for (const RequestOutput& o : *outputs) {
      auto it = live_.find(o.request_id);
      if (it == live_.end()) continue;
      if (it->second.first_token_micros < 0) it->second.first_token_micros = now;
      if (o.finish_reason != FinishReason::kNone) {
        const Live live = it->second;
        live_.erase(it);
        Finished(o.request_id, live, now);
      }
    }
    Sample(now);
    Progress(false);
  }
  result_.end_s = clock_.NowSeconds();
  result_.counters = scheduler_->counters();
  for (const auto& [choice, n] : log_.Counts().by_choice) {
    result_.decisions[choice.empty() ? "none" : choice] += n;
  }
  if (options_.decision_log_capacity > 0) {
    result_.recent_decisions = log_.Recent(options_.decision_log_capacity);
  }
  if (offloader_) result_.max_groups = offloader_->max_groups_reached();
  if (vamp_ != nullptr) result_.live = vamp_->live();
  if (result_.first_arrival_s < 0) result_.first_arrival_s = 0;
  result_.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  next_sample_micros_ = 0;
  Sample(clock_.NowMicros());
  Progress(true);
  return std::move(result_);
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const workload::Workload& workload, const PolicySpec& policy,
                                   const SimOptions& options) {
  Simulation simulation(workload, policy, options);
  return simulation.Run();
}

}  // namespace vamp::sim
