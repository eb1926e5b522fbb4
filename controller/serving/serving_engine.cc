#include "controller/serving/serving_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/core/static_arbiter.h"

namespace vamp {
namespace {

constexpr size_t kDecisionLogSize = 1000;

// Controller metrics in the style operators know from vLLM (names vamp_<subsystem>_..._<unit>).
struct EngineMetrics {
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Gauge& kv_usage;
  prometheus::Gauge& kv_blocks;
  prometheus::Gauge& offload_ratio;
  prometheus::Gauge& snapshot_blocks;
  prometheus::Gauge& snapshots;
  prometheus::Counter& state_captures;
  prometheus::Counter& state_captures_skipped;
  prometheus::Counter& admissions_held;
  prometheus::Gauge& offloaded_groups;
  // First admissions only (scheduler_stats.h, as vLLM): a resumed request's own blocks are not
  // reuse. Resumed admissions are counted apart.
  prometheus::Counter& query_tokens;
  prometheus::Counter& hit_tokens;
  prometheus::Counter& resumed_query_tokens;
  prometheus::Counter& resumed_hit_tokens;
  prometheus::Counter& preemptions;
  prometheus::Counter& steps;
  prometheus::Family<prometheus::Counter>& decisions;
  // Labelled model_name (ServingSeries); finished also by reason.
  prometheus::Family<prometheus::Counter>& finished;
  prometheus::Family<prometheus::Histogram>& ttft;
  prometheus::Family<prometheus::Histogram>& itl;
  prometheus::Family<prometheus::Histogram>& e2e;
  prometheus::Family<prometheus::Histogram>& queue;
  // The tax model's latest comparison (decision_log.h): both sides, over the arbiter's window.
  prometheus::Gauge& tax_seconds;
  prometheus::Gauge& value_seconds;
  prometheus::Gauge& ghost_tokens;
  prometheus::Gauge& preempt_tokens;
  prometheus::Gauge& h2d_bytes_per_second;
  prometheus::Gauge& routed_h2d_bytes_per_second;
  prometheus::Gauge& ttft_weight;
  prometheus::Family<prometheus::Counter>& prompt_tokens;
  prometheus::Family<prometheus::Counter>& generation_tokens;

  static EngineMetrics& Get() {
    static EngineMetrics* m = [] {
      auto& r = *MetricsRegistry();
      auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
        return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
      };
      auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
        return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
      };
      auto histograms = [&](const char* name,
                            const char* help) -> prometheus::Family<prometheus::Histogram>& {
        return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
      };
      auto counters = [&](const char* name,
                          const char* help) -> prometheus::Family<prometheus::Counter>& {
        return prometheus::BuildCounter().Name(name).Help(help).Register(r);
      };
      return new EngineMetrics{
          gauge("vamp_scheduler_requests_running", "Requests in the running batch"),
          gauge("vamp_scheduler_requests_waiting", "Requests waiting, preempted ones included"),
          gauge("vamp_kv_usage_ratio", "Used KV blocks over all KV blocks, 0..1"),
          gauge("vamp_kv_pool_blocks", "KV blocks in the pool (grows with offload)"),
          gauge("vamp_kv_offload_ratio", "Offloaded groups over the cap's groups, 0..1"),
          gauge("vamp_kv_snapshot_blocks",
                "KV blocks storing snapshots of recurrent state (models with linear attention)"),
          gauge("vamp_kv_snapshots",
                "Snapshots of recurrent state that prefix-cache hits can resume from"),
          counter("vamp_state_captures_total", "Snapshots of recurrent state captured (planned)"),
          counter("vamp_state_captures_skipped_total",
                  "Captures of recurrent state skipped because no KV blocks were free for them"),
          counter("vamp_admissions_held_total",
                  "Steps whose admissions stopped at the static pool's size on a compute-bound "
                  "GPU (--admit_within_baseline)"),
          gauge("vamp_experts_offloaded_groups", "Expert groups offloaded per eligible layer"),
          counter("vamp_prefix_cache_query_tokens_total",
                  "Prompt tokens looked up in the cache at first admissions"),
          counter("vamp_prefix_cache_hit_tokens_total",
                  "Prompt tokens the cache served at first admissions"),
          counter("vamp_prefix_cache_resumed_query_tokens_total",
                  "Tokens looked up in the cache when preempted requests resumed"),
          counter("vamp_prefix_cache_resumed_hit_tokens_total",
                  "Tokens the cache served when preempted requests resumed"),
          counter("vamp_scheduler_preemptions_total", "Requests preempted (recomputed later)"),
          counter("vamp_scheduler_steps_total", "Model steps run"),
          prometheus::BuildCounter()
              .Name("vamp_arbiter_decisions_total")
              .Help("Memory arbiter decisions by chosen action")
              .Register(r),
          counters("vamp_requests_finished_total", "Finished requests by reason"),
          histograms("vamp_request_time_to_first_token_seconds", "Arrival to first token"),
          histograms("vamp_request_inter_token_latency_seconds", "Between consecutive tokens"),
          histograms("vamp_request_e2e_latency_seconds", "Arrival to the last token"),
          histograms("vamp_request_queue_time_seconds", "Arrival to first scheduling"),
          gauge("vamp_arbiter_offload_tax_seconds",
                "Tax model, latest priced boundary move: staging stall it costs (offload) or "
                "saves (restore) over the arbiter window"),
          gauge("vamp_arbiter_kv_value_seconds",
                "Tax model, latest priced boundary move: prefill work the extra KV would save "
                "(offload) or giving it back would lose (restore) over the arbiter window"),
          gauge("vamp_arbiter_ghost_hit_tokens",
                "Tax model: prompt tokens over the arbiter window that were evicted earlier and "
                "a larger pool would have served (ghost-list hits)"),
          gauge("vamp_arbiter_preempt_recompute_tokens",
                "Tax model: tokens recomputed after preemptions over the arbiter window"),
          gauge("vamp_arbiter_h2d_bytes_per_second",
                "Tax model: host-to-device bandwidth the offload tax is priced at (learned)"),
          gauge("vamp_arbiter_routed_h2d_bytes_per_second",
                "Tax model: the same for routed staging's copies (small steps; learned)"),
          gauge("vamp_arbiter_ttft_weight",
                "Tax model, latest priced boundary move: weight its value's prefill tokens "
                "carried (1 up to vamp_ttft_weight as first tokens wait longer for memory)"),
          counters("vamp_prompt_tokens_total", "Prompt tokens of admitted requests"),
          counters("vamp_generation_tokens_total", "Tokens generated and sent to clients")};
    }();
    return *m;
  }
};

}  // namespace

// The serving series of one served model, labelled model_name as vLLM's are (dashboards and
// alerts chart them per model): token counters, latency histograms, finished requests by reason.
struct ServingSeries {
  explicit ServingSeries(const std::string& model_name)
      : model_name(model_name),
        prompt_tokens(EngineMetrics::Get().prompt_tokens.Add({{"model_name", model_name}})),
        generation_tokens(
            EngineMetrics::Get().generation_tokens.Add({{"model_name", model_name}})),
        ttft(LabelledHistogram(EngineMetrics::Get().ttft)),
        itl(LabelledHistogram(EngineMetrics::Get().itl)),
        e2e(LabelledHistogram(EngineMetrics::Get().e2e)),
        queue(LabelledHistogram(EngineMetrics::Get().queue)) {}

  prometheus::Counter& Finished(FinishReason reason) {
    return EngineMetrics::Get().finished.Add(
        {{"model_name", model_name}, {"reason", std::string(FinishReasonName(reason))}});
  }

  const std::string model_name;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Histogram& ttft;
  prometheus::Histogram& itl;
  prometheus::Histogram& e2e;
  prometheus::Histogram& queue;

 private:
  prometheus::Histogram& LabelledHistogram(
      prometheus::Family<prometheus::Histogram>& family) const {
    return family.Add({{"model_name", model_name}}, LatencyBucketsSeconds());
  }
};

namespace {

void ToProto(const SamplingParams& sp, vamp::v1::SamplingParams* out) {
  out->set_temperature(sp.temperature);
  out->set_top_k(sp.top_k);
  out->set_top_p(sp.top_p);
  out->set_min_p(sp.min_p);
  out->set_presence_penalty(sp.presence_penalty);
  out->set_frequency_penalty(sp.frequency_penalty);
  out->set_repetition_penalty(sp.repetition_penalty);
  out->set_num_top_logprobs(sp.num_top_logprobs);
  if (sp.seed.has_value()) {
    out->set_seed(*sp.seed);
    out->set_has_seed(true);
  }
}

// A snapshot of recurrent state after `tokens` tokens in `blocks` (step_plan.h's contract).
void ToProto(int32_t tokens, const std::vector<BlockId>& blocks, vamp::v1::StateSnapshot* out) {
  out->set_num_tokens(tokens);
  out->mutable_block_ids()->Add(blocks.begin(), blocks.end());
}

}  // namespace

ServingEngine::ServingEngine(AgentGroup* group, ServingEngineOptions options)
    : group_(group),
      options_(std::move(options)),
      series_(std::make_unique<ServingSeries>(options_.model_name)) {}

absl::StatusOr<std::unique_ptr<ServingEngine>> ServingEngine::Start(AgentGroup* group,
                                                                   ServingEngineOptions options) {
  std::unique_ptr<ServingEngine> engine(new ServingEngine(group, std::move(options)));
  ServingEngine* e = engine.get();
  VAMP_ASSIGN_OR_RETURN(e->offloader_,
                        RemoteOffloader::Create(e->options_.ranks, e->options_.offload));
  SchedulerConfig config = e->options_.scheduler;
  config.num_blocks = static_cast<int32_t>(e->offloader_->kv_blocks());
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<MemoryArbiter> arbiter,
                        CreateArbiter(e->options_.arbiter, e->options_.vamp));
  {
    absl::MutexLock lock(&e->mu_);
    e->arbiter_name_ = e->options_.arbiter;
    e->vamp_config_ = e->options_.vamp;
  }
  e->vamp_arbiter_ = dynamic_cast<VampArbiter*>(arbiter.get());
  VAMP_ASSIGN_OR_RETURN(e->scheduler_, Scheduler::Create(config, &SteadyClock::Get(),
                                                         std::move(arbiter), e->offloader_.get()));
  VAMP_LOG(INFO) << "serving engine: " << config.num_blocks << " KV blocks of " << config.block_size
                 << " tokens, arbiter " << e->scheduler_->arbiter().name() << ", up to "
                 << e->offloader_->max_groups() << " expert groups offloadable ("
                 << e->offloader_->BlocksPerGroup() << " blocks each)";
  e->PublishSnapshot();
  e->thread_ = std::thread([e] { e->Loop(); });
  return engine;
}

ServingEngine::~ServingEngine() { Stop(); }

void ServingEngine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    work_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<RequestId> ServingEngine::Submit(ServingRequest request, EngineSink sink) {
  if (!healthy_) {
    return absl::UnavailableError("the model's agents are not available; retry later");
  }
  if (draining_) return absl::UnavailableError("the server is draining and admits no requests");
  // Hashing the prompt's blocks here keeps it off the engine thread's step (≈ 0.1 ms per 32k
  // tokens). options_.scheduler is not changed after Start.
  std::vector<BlockHash> hashes =
      Scheduler::HashPromptBlocks(options_.scheduler, request.prompt_token_ids, request.cache_salt);
  absl::MutexLock lock(&mu_);
  const RequestId id = next_request_id_++;
  pending_.push_back(
      {id, std::move(request), std::move(sink), SteadyClock::Get().NowMicros(), std::move(hashes)});
  work_ = true;
  return id;
}

void ServingEngine::Abort(RequestId id, FinishReason reason) {
  absl::MutexLock lock(&mu_);
  aborts_.emplace_back(id, reason);
  work_ = true;
}

absl::Status ServingEngine::RunBetweenSteps(std::function<std::optional<absl::Status>()> run) {
  if (!healthy_) return absl::UnavailableError("the model's agents are not available");
  Command command{std::move(run), false, absl::OkStatus()};
  absl::MutexLock lock(&mu_);
  commands_.push_back(&command);
  work_ = true;
  auto done = [&command, this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return command.done || stop_; };
  mu_.Await(absl::Condition(&done));
  if (!command.done) return absl::CancelledError("the engine stopped");
  return command.result;
}

absl::Status ServingEngine::ForceRemap(int32_t groups) {
  if (groups == 0) return absl::InvalidArgumentError("num_groups must not be 0");
  return RunBetweenSteps(
      [this, groups, remap_id = std::string()]() mutable { return Remap(groups, &remap_id); });
}

absl::Status ServingEngine::SetArbiter(const std::string& name, const VampArbiterConfig& vamp) {
  return RunBetweenSteps([this, name, vamp]() -> std::optional<absl::Status> {
    // Same policy: reconfigure the cost model in place, keeping what it learned.
    if (name == "vamp" && vamp_arbiter_ != nullptr) {
      absl::Status s = vamp_arbiter_->Reconfigure(vamp);
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        vamp_config_ = vamp;
      }
      return s;
    }
    absl::StatusOr<std::unique_ptr<MemoryArbiter>> arbiter = CreateArbiter(name, vamp);
    if (!arbiter.ok()) return arbiter.status();
    VampArbiter* vamp_arbiter = dynamic_cast<VampArbiter*>(arbiter->get());
    if (absl::Status s = scheduler_->ReplaceArbiter(*std::move(arbiter)); !s.ok()) return s;
    vamp_arbiter_ = vamp_arbiter;
    VAMP_LOG(INFO) << "memory arbiter is now " << name;
    absl::MutexLock lock(&mu_);
    arbiter_name_ = name;
    vamp_config_ = vamp;
    return absl::OkStatus();
  });
}

std::string ServingEngine::arbiter_name() const {
  absl::MutexLock lock(&mu_);
  return arbiter_name_;
}

VampArbiterConfig ServingEngine::vamp_config() const {
  absl::MutexLock lock(&mu_);
  return vamp_config_;
}

void ServingEngine::Drain() {
  draining_ = true;
  VAMP_LOG(INFO) << "draining: no new requests are admitted";
}

void ServingEngine::Undrain() {
  draining_ = false;
  VAMP_LOG(INFO) << "drain ended: requests are admitted again";
}

void ServingEngine::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // A command waiting for a step (a forced remap) keeps the loop stepping too.
      const bool busy = healthy_ && (scheduler_->has_unfinished_requests() || !commands_.empty() ||
                                     offloader_->has_queued());
      if (!busy) {
        mu_.AwaitWithTimeout(absl::Condition(&work_),
                             absl::Microseconds(options_.idle_wait_micros * 50));
      }
      if (stop_) break;
      work_ = false;
    }
    if (!healthy_) {
      FailAll(absl::UnavailableError("agent group is unhealthy"));
      continue;
    }
    AdmitPending();
    RunCommands();
    if (scheduler_->has_unfinished_requests() || offloader_->has_queued()) RunStep();
    PublishSnapshot();
  }
  FailAll(absl::CancelledError("the server is shutting down"));
}

void ServingEngine::AdmitPending() {
  std::deque<Pending> pending;
  std::vector<std::pair<RequestId, FinishReason>> aborts;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    aborts.swap(aborts_);
  }
  for (Pending& p : pending) {
    RequestSpec spec;
    spec.id = p.id;
    spec.prompt_token_ids = std::move(p.request.prompt_token_ids);
    spec.sampling_params = std::move(p.request.sampling);
    spec.eos_token_id = options_.eos_token_id;
    spec.priority = p.request.priority;
    spec.cache_salt = std::move(p.request.cache_salt);
    // A cached prefix has no logits: a request that needs its prompt's log-probabilities
    // computes all of it (after a preemption too: the agents then report positions again and
    // CollectPromptLogprobs skips those it already has).
    spec.skip_prefix_cache_reads = p.request.prompt_logprobs;
    spec.arrival_micros = p.arrival_micros;
    spec.prompt_block_hashes = std::move(p.prompt_block_hashes);
    const int32_t prompt_tokens = static_cast<int32_t>(spec.prompt_token_ids.size());
    const int32_t k = spec.sampling_params.num_top_logprobs;
    absl::Status s = scheduler_->AddRequest(std::move(spec));
    if (!s.ok()) {
      EngineEvent event;
      event.finished = true;
      event.finish_reason = FinishReason::kAbort;
      event.error = std::string(s.message());
      event.prompt_tokens = prompt_tokens;
      p.sink(event);
      continue;
    }
    Live& live = live_[p.id];
    live.sink = std::move(p.sink);
    live.arrival_micros = p.arrival_micros;
    live.prompt_tokens = prompt_tokens;
    if (p.request.prompt_logprobs) {
      live.prompt_logprobs = std::make_unique<PromptLogprobsState>();
      live.prompt_logprobs->k = k;
    }
    series_->prompt_tokens.Increment(prompt_tokens);
  }
  const int64_t now = SteadyClock::Get().NowMicros();
  for (const auto& [id, reason] : aborts) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    const int64_t arrival_micros = it->second.arrival_micros;
    live_.erase(it);
    if (!scheduler_->AbortRequest(id).ok()) continue;
    // Clients that went away (or timed out) and stop strings end requests too: count them. A
    // stop string completes the request as the model's own stop would, so its end-to-end
    // latency counts too; an abort's does not (nobody received the request's end).
    series_->Finished(reason).Increment();
    if (reason == FinishReason::kStop) {
      series_->e2e.Observe(static_cast<double>(now - arrival_micros) * 1e-6);
    }
  }
}

void ServingEngine::RunCommands() {
  Command* command = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (commands_.empty()) return;
    command = commands_.front();
  }
  std::optional<absl::Status> result = command->run();
  if (!result.has_value()) return;  // retried after the next step
  PublishSnapshot();  // the caller reads the new state as soon as it is woken
  absl::MutexLock lock(&mu_);
  commands_.pop_front();
  command->result = *result;
  command->done = true;
}

std::optional<absl::Status> ServingEngine::Remap(int32_t groups, std::string* remap_id) {
  // Queued: done once the step that carries it was answered (or refused).
  if (!remap_id->empty()) return offloader_->Outcome(*remap_id);
  if (groups > 0) {
    absl::StatusOr<int32_t> added = scheduler_->OffloadGroups(groups);
    if (!added.ok()) return added.status();
    *remap_id = offloader_->last_remap_id();
    return std::nullopt;
  }
  groups = -groups;
  if (groups > offloader_->OffloadedGroups()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot restore ", groups, " groups: ", offloader_->OffloadedGroups(), " are offloaded"));
  }
  if (!scheduler_->pool().shrink_pending()) {
    if (absl::Status s = scheduler_->BeginShrinkPool(offloader_->BlocksRemovedByRestore(groups));
        !s.ok()) {
      return s;
    }
  }
  // The tail's blocks must be free before the agents take the pages back; requests using them
  // keep running and the command is retried after the next step.
  if (scheduler_->pool().shrink_outstanding() > 0) return std::nullopt;
  if (absl::Status s = scheduler_->CommitShrinkPool(); !s.ok()) return s;
  if (absl::Status s = scheduler_->RestoreGroups(groups); !s.ok()) return s;
  *remap_id = offloader_->last_remap_id();
  return std::nullopt;
}

void ServingEngine::RunStep() {
  absl::StatusOr<StepPlan> plan = scheduler_->Schedule();
  if (!plan.ok()) {
    VAMP_LOG(ERROR) << "scheduling failed: " << plan.status();
    FailAll(plan.status());
    return;
  }
  EngineMetrics& metrics = EngineMetrics::Get();
  for (const ArbiterRecord& d : scheduler_->step_decisions()) {
    metrics.decisions.Add({{"action", d.plan.choice.empty() ? "none" : d.plan.choice}})
        .Increment();
    if (const TaxComparison& t = d.plan.tax; t.evaluated) {
      metrics.tax_seconds.Set(t.tax_micros * 1e-6);
      metrics.value_seconds.Set(t.value_micros * 1e-6);
      metrics.ghost_tokens.Set(t.ghost_tokens);
      metrics.preempt_tokens.Set(t.preempt_tokens);
      metrics.h2d_bytes_per_second.Set(t.h2d_bytes_per_s);
      metrics.routed_h2d_bytes_per_second.Set(t.routed_h2d_bytes_per_s);
      metrics.ttft_weight.Set(t.ttft_weight);
    }
    absl::MutexLock lock(&mu_);
    decisions_.push_back(d);
    if (decisions_.size() > kDecisionLogSize) decisions_.pop_front();
  }
  const bool has_ids = !plan->preempted_ids.empty() || !plan->finished_ids.empty();
  if (plan->empty() && !has_ids && !offloader_->has_queued()) {
    // Nothing runnable (e.g. everyone waits for memory held by a pending restore): back off.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&work_), absl::Microseconds(options_.idle_wait_micros));
    return;
  }
  vamp::v1::StepRequest request;
  request.set_step_id(NextStepId());
  request.set_num_blocks(plan->num_blocks);
  for (const NewRequestPlan& n : plan->new_requests) {
    vamp::v1::NewRequest* r = request.add_new_requests();
    r->set_request_id(n.request_id);
    r->mutable_prompt_token_ids()->Add(n.prompt_token_ids.begin(), n.prompt_token_ids.end());
    r->mutable_block_ids()->Add(n.block_ids.begin(), n.block_ids.end());
    r->set_num_computed_tokens(n.num_computed_tokens);
    r->set_num_scheduled_tokens(n.num_scheduled_tokens);
    ToProto(n.sampling_params, r->mutable_sampling());
    r->set_eos_token_id(n.eos_token_id.value_or(-1));
    r->set_min_tokens(n.sampling_params.min_tokens);
    r->mutable_stop_token_ids()->Add(n.sampling_params.stop_token_ids.begin(),
                                     n.sampling_params.stop_token_ids.end());
    if (auto it = live_.find(n.request_id);
        it != live_.end() && it->second.prompt_logprobs != nullptr) {
      r->set_prompt_logprobs(true);
    }
    if (!n.restore_state_blocks.empty()) {
      ToProto(n.num_computed_tokens, n.restore_state_blocks, r->mutable_restore_state());
    }
    if (n.capture_state_tokens > 0) {
      ToProto(n.capture_state_tokens, n.capture_state_blocks, r->mutable_capture_state());
    }
  }
  for (const CachedRequestPlan& c : plan->cached_requests) {
    vamp::v1::CachedRequest* r = request.add_cached_requests();
    r->set_request_id(c.request_id);
    r->set_resumed(c.resumed);
    r->mutable_new_block_ids()->Add(c.new_block_ids.begin(), c.new_block_ids.end());
    r->set_num_computed_tokens(c.num_computed_tokens);
    r->set_num_scheduled_tokens(c.num_scheduled_tokens);
    if (!c.restore_state_blocks.empty()) {
      ToProto(c.num_computed_tokens, c.restore_state_blocks, r->mutable_restore_state());
    }
    if (c.capture_state_tokens > 0) {
      ToProto(c.capture_state_tokens, c.capture_state_blocks, r->mutable_capture_state());
    }
  }
  request.mutable_preempted_request_ids()->Add(plan->preempted_ids.begin(),
                                               plan->preempted_ids.end());
  request.mutable_finished_request_ids()->Add(plan->finished_ids.begin(),
                                              plan->finished_ids.end());
  // The offloads and restores this plan's pool already counts (and rollbacks of refused ones).
  offloader_->AttachTo(&request);
  absl::StatusOr<std::vector<vamp::v1::StepResponse>> responses = group_->Step(request);
  if (!responses.ok()) {
    if (absl::IsAborted(responses.status()) && group_->healthy()) {
      // Every rank refused the step: a remap failed on one of them and none ran anything. Roll
      // the remaps back with the next step and plan this one again on the old pool.
      absl::StatusOr<int32_t> delta = offloader_->Refused(responses.status());
      absl::Status reverted = delta.ok() ? scheduler_->RevertStep(*delta) : delta.status();
      if (reverted.ok()) return;
      VAMP_LOG(ERROR) << "step " << request.step_id()
                      << " was refused and cannot be undone: " << reverted;
      FailAll(reverted);
      return;
    }
    healthy_ = group_->healthy();
    FailAll(responses.status());
    return;
  }
  if (absl::Status s = offloader_->Confirm(*responses); !s.ok()) {
    // The agents' memory is not what the controller sized its pool by: stop serving with this
    // group; the controller initialises it again and takes the view from the agents.
    VAMP_LOG(ERROR) << s;
    FailAll(s);
    return;
  }
  if (plan->empty()) return;
  StepOutput output;
  output.step = plan->step;
  absl::flat_hash_map<RequestId, StepLogprobs> logprobs;
  for (const vamp::v1::SampledTokens& s : (*responses)[0].sampled()) {
    SampledTokens tokens;
    tokens.request_id = s.request_id();
    tokens.token_ids.assign(s.token_ids().begin(), s.token_ids().end());
    output.sampled.push_back(std::move(tokens));
    if (s.logprobs_size() == s.token_ids_size()) {
      StepLogprobs& lp = logprobs[s.request_id()];
      lp.logprobs.assign(s.logprobs().begin(), s.logprobs().end());
      if (s.token_ids_size() > 0 && s.top_token_ids_size() == s.top_logprobs_size() &&
          s.top_token_ids_size() % s.token_ids_size() == 0) {
        lp.top_token_ids.assign(s.top_token_ids().begin(), s.top_token_ids().end());
        lp.top_logprobs.assign(s.top_logprobs().begin(), s.top_logprobs().end());
      }
    }
  }
  CollectPromptLogprobs((*responses)[0]);
  absl::StatusOr<std::vector<RequestOutput>> outputs = scheduler_->UpdateFromOutput(output);
  if (!outputs.ok()) {
    VAMP_LOG(ERROR) << "agents answered step " << request.step_id()
                    << " inconsistently: " << outputs.status();
    FailAll(outputs.status());
    return;
  }
  metrics.steps.Increment();
  if (vamp_arbiter_ != nullptr) {
    // Feeds the cost model's self-calibration (a no-op unless enabled): the slowest rank's time.
    StepTiming timing;
    // Routed when every rank copied only routed experts; the largest share any rank copied
    // (a whole-region rank counts 1, whatever it left in staged_share).
    timing.routed_staging = !responses->empty();
    timing.staged_share = 0;
    for (const vamp::v1::StepResponse& r : *responses) {
      const vamp::v1::StepTimings& t = r.timings();
      timing.step_micros = std::max<double>(timing.step_micros, t.total_us());
      timing.exposed_staging_micros =
          std::max<double>(timing.exposed_staging_micros, t.staging_stall_us());
      timing.staged_bytes =
          std::max<int64_t>(timing.staged_bytes, static_cast<int64_t>(t.staged_bytes()));
      timing.routed_staging = timing.routed_staging && t.routed_staging();
      timing.staged_share =
          std::max(timing.staged_share, t.routed_staging() ? t.staged_share() : 1.0);
    }
    if (responses->empty()) timing.staged_share = 1;
    for (const NewRequestPlan& n : plan->new_requests) timing.prefill_tokens += n.num_scheduled_tokens;
    for (const CachedRequestPlan& c : plan->cached_requests) {
      const Request* r = scheduler_->FindRequest(c.request_id);
      const bool decoding = r != nullptr && c.num_computed_tokens >= r->num_prompt_tokens();
      (decoding ? timing.decode_tokens : timing.prefill_tokens) += c.num_scheduled_tokens;
    }
    timing.offloaded_experts_per_layer =
        offloader_->OffloadedGroups() * offloader_->ExpertsPerGroup();
    timing.end_micros = SteadyClock::Get().NowMicros();
    vamp_arbiter_->ObserveStep(timing);
  }
  for (const QueueTimeSample& q : scheduler_->Stats().step_queue_times) {
    series_->queue.Observe(static_cast<double>(q.queue_micros) * 1e-6);
  }
  Deliver(*outputs, logprobs);
}

void ServingEngine::CollectPromptLogprobs(const vamp::v1::StepResponse& response) {
  for (const vamp::v1::PromptLogprobs& p : response.prompt_logprobs()) {
    auto it = live_.find(p.request_id());
    if (it == live_.end() || it->second.prompt_logprobs == nullptr) continue;
    PromptLogprobsState& state = *it->second.prompt_logprobs;
    if (state.broken) continue;
    const int64_t have = 1 + static_cast<int64_t>(state.logprobs.size());  // next position
    const int64_t first = p.first_position(), count = p.logprobs_size();
    const size_t k = static_cast<size_t>(state.k);
    // Positions in [1, prompt_tokens), continuing (or overlapping) what is held, k alternatives
    // each: anything else is an agent fault, and the request's prompt log-probabilities are void.
    if (first < 1 || first > have || first + count > it->second.prompt_tokens ||
        static_cast<size_t>(p.top_token_ids_size()) != count * k ||
        static_cast<size_t>(p.top_logprobs_size()) != count * k) {
      VAMP_LOG(WARNING) << "request " << p.request_id() << ": prompt logprobs for positions "
                        << first << ".." << first + count - 1 << " (" << p.top_token_ids_size()
                        << " alternatives) do not continue the " << have - 1
                        << " held; dropping them";
      state.broken = true;
      continue;
    }
    const int64_t skip = have - first;  // recomputed positions
    if (skip >= count) continue;
    state.logprobs.insert(state.logprobs.end(), p.logprobs().begin() + skip, p.logprobs().end());
    state.top_token_ids.insert(state.top_token_ids.end(), p.top_token_ids().begin() + skip * k,
                               p.top_token_ids().end());
    state.top_logprobs.insert(state.top_logprobs.end(), p.top_logprobs().begin() + skip * k,
                              p.top_logprobs().end());
  }
}

void ServingEngine::Deliver(const std::vector<RequestOutput>& outputs,
                            const absl::flat_hash_map<RequestId, StepLogprobs>& logprobs) {
  ServingSeries& metrics = *series_;
  const int64_t now = SteadyClock::Get().NowMicros();
  for (const RequestOutput& o : outputs) {
    auto it = live_.find(o.request_id);
    if (it == live_.end()) continue;  // aborted by its client meanwhile
    Live& live = it->second;
    const Request* request = scheduler_->FindRequest(o.request_id);
    EngineEvent event;
    event.token_ids.assign(o.new_token_ids.begin(), o.new_token_ids.end());
    // The accepted tokens are a prefix of the sampled ones (the scheduler drops what follows a
    // stop token).
    if (auto it = logprobs.find(o.request_id);
        it != logprobs.end() && it->second.logprobs.size() >= event.token_ids.size()) {
      const StepLogprobs& lp = it->second;
      const size_t n = event.token_ids.size();
      event.logprobs.assign(lp.logprobs.begin(), lp.logprobs.begin() + n);
      const size_t k = lp.logprobs.empty() ? 0 : lp.top_token_ids.size() / lp.logprobs.size();
      event.top_token_ids.assign(lp.top_token_ids.begin(), lp.top_token_ids.begin() + n * k);
      event.top_logprobs.assign(lp.top_logprobs.begin(), lp.top_logprobs.begin() + n * k);
    }
    // The prompt's log-probabilities travel with its first output, once all are there (the step
    // that samples the first token computed the last prompt positions).
    if (live.prompt_logprobs != nullptr && live.completion_tokens == 0 &&
        !event.token_ids.empty()) {
      PromptLogprobsState& p = *live.prompt_logprobs;
      if (!p.broken && static_cast<int32_t>(p.logprobs.size()) == live.prompt_tokens - 1) {
        event.prompt_logprobs = std::move(p.logprobs);
        event.prompt_top_token_ids = std::move(p.top_token_ids);
        event.prompt_top_logprobs = std::move(p.top_logprobs);
        event.has_prompt_logprobs = true;
      }
      live.prompt_logprobs.reset();
    }
    const double since_arrival_s = static_cast<double>(now - live.arrival_micros) * 1e-6;
    if (!event.token_ids.empty()) {
      if (live.completion_tokens == 0) {
        metrics.ttft.Observe(since_arrival_s);
        live.ttft_micros = now - live.arrival_micros;
      } else {
        metrics.itl.Observe(static_cast<double>(now - live.last_token_micros) * 1e-6);
      }
      live.last_token_micros = now;
    }
    live.completion_tokens += static_cast<int32_t>(event.token_ids.size());
    metrics.generation_tokens.Increment(static_cast<double>(event.token_ids.size()));
    event.prompt_tokens = live.prompt_tokens;
    event.completion_tokens = live.completion_tokens;
    // The request is gone from the scheduler once finished: remember its hit while it is there.
    if (request != nullptr) live.cached_prompt_tokens = request->num_cached_tokens();
    event.cached_prompt_tokens = live.cached_prompt_tokens;
    event.micros_since_arrival = now - live.arrival_micros;
    if (o.finish_reason != FinishReason::kNone) {
      event.finished = true;
      event.finish_reason = o.finish_reason;
      metrics.e2e.Observe(since_arrival_s);
      metrics.Finished(o.finish_reason).Increment();
      // One line per request for operators; counts and times only, never prompt or output text.
      VAMP_LOG(INFO) << "request " << o.request_id << " finished: reason "
                     << FinishReasonName(o.finish_reason) << ", prompt_tokens "
                     << live.prompt_tokens << " (cached " << live.cached_prompt_tokens
                     << "), output_tokens " << live.completion_tokens << ", ttft_s "
                     << live.ttft_micros * 1e-6 << ", e2e_s " << since_arrival_s;
    }
    live.sink(event);
    if (event.finished) live_.erase(it);
  }
}

void ServingEngine::FailAll(const absl::Status& status) {
  std::deque<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    for (Command* c : commands_) {
      c->result = status;
      c->done = true;
    }
    commands_.clear();
  }
  EngineEvent event;
  event.finished = true;
  event.finish_reason = FinishReason::kAbort;
  event.error = std::string(status.message());
  for (Pending& p : pending) p.sink(event);
  for (auto& [id, live] : live_) {
    EngineEvent e = event;
    e.prompt_tokens = live.prompt_tokens;
    e.completion_tokens = live.completion_tokens;
    live.sink(e);
  }
  live_.clear();
  if (!healthy_ || !status.ok()) {
    // The scheduler's view of the agents' KV caches is void once a step failed.
    healthy_ = false;
  }
}

void ServingEngine::PublishSnapshot() {
  if (scheduler_ == nullptr) return;
  const SchedulerStats stats = scheduler_->Stats();
  const SchedulerCounters& c = scheduler_->counters();
  EngineMetrics& metrics = EngineMetrics::Get();
  metrics.running.Set(stats.num_running);
  metrics.waiting.Set(stats.num_waiting);
  metrics.kv_usage.Set(stats.num_blocks == 0 ? 0.0
                                             : static_cast<double>(stats.num_used_blocks) /
                                                   stats.num_blocks);
  metrics.kv_blocks.Set(stats.num_blocks);
  metrics.offloaded_groups.Set(offloader_->OffloadedGroups());
  metrics.offload_ratio.Set(offloader_->max_groups() == 0
                                ? 0.0
                                : static_cast<double>(offloader_->OffloadedGroups()) /
                                      offloader_->max_groups());
  // Counters are cumulative in the scheduler; the Prometheus counters follow by the difference.
  auto follow = [](prometheus::Counter& counter, int64_t total) {
    const double delta = static_cast<double>(total) - counter.Value();
    if (delta > 0) counter.Increment(delta);
  };
  follow(metrics.query_tokens, c.prefix_cache.query_tokens);
  follow(metrics.hit_tokens, c.prefix_cache.hit_tokens);
  follow(metrics.resumed_query_tokens, c.prefix_cache.preempted_query_tokens);
  follow(metrics.resumed_hit_tokens, c.prefix_cache.preempted_hit_tokens);
  follow(metrics.preemptions, c.num_preemptions);
  follow(metrics.state_captures, c.num_state_captures);
  follow(metrics.state_captures_skipped, c.num_state_captures_skipped);
  follow(metrics.admissions_held, c.num_admissions_held);
  metrics.snapshot_blocks.Set(stats.num_snapshot_blocks);
  metrics.snapshots.Set(stats.num_snapshots);

  vamp::v1::GetStatusResponse s;
  s.set_serving(healthy_);
  s.set_draining(draining_);
  s.set_policy(std::string(scheduler_->arbiter().name()));
  auto* kv = s.mutable_kv_pool();
  kv->set_total_blocks(stats.num_blocks);
  kv->set_used_blocks(stats.num_used_blocks);
  kv->set_cached_free_blocks(stats.num_free_cached_blocks);
  kv->set_uncached_free_blocks(stats.num_free_uncached_blocks);
  kv->set_block_size(scheduler_->config().block_size);
  const int64_t queries = c.prefix_cache.query_tokens;
  kv->set_prefix_cache_hit_ratio(
      queries == 0 ? 0.0 : static_cast<double>(c.prefix_cache.hit_tokens) / queries);
  kv->set_snapshot_blocks(stats.num_snapshot_blocks);
  kv->set_snapshots(stats.num_snapshots);
  kv->set_state_captures_total(c.num_state_captures);
  kv->set_state_captures_skipped_total(c.num_state_captures_skipped);
  auto* q = s.mutable_queue();
  q->set_running(stats.num_running);
  q->set_waiting(stats.num_waiting - stats.num_waiting_preempted);
  q->set_preempted(stats.num_waiting_preempted);
  q->set_finished_total(c.num_finished + c.num_aborted);
  s.set_offloaded_groups(offloader_->OffloadedGroups());
  s.set_offload_ratio(metrics.offload_ratio.Value());
  absl::MutexLock lock(&mu_);
  snapshot_ = std::move(s);
}

void ServingEngine::Snapshot(vamp::v1::GetStatusResponse* status) const {
  absl::MutexLock lock(&mu_);
  status->MergeFrom(snapshot_);
  status->set_serving(healthy_.load());
  status->set_draining(draining_.load());
}

std::vector<ArbiterRecord> ServingEngine::RecentDecisions(int limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<ArbiterRecord> out;
  for (auto it = decisions_.rbegin(); it != decisions_.rend() && static_cast<int>(out.size()) < limit;
       ++it) {
    out.push_back(*it);
  }
  return out;
}

}  // namespace vamp
