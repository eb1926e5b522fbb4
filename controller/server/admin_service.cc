#include "controller/server/admin_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_server.h"
#include "common/offload_cap.h"

namespace vamp {
bool AdminService::Authorized(grpc::CallbackServerContext* context,
                              grpc::ServerUnaryReactor* reactor) const {
  if (backend_.auth_token.empty() || CallPresentsBearer(*context, backend_.auth_token)) {
    return true;
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                               "admin calls need the token (authorization: Bearer <token>)"));
  return false;
}

std::shared_ptr<const ServingContext> AdminService::ServingContextOrFinish(
    grpc::ServerUnaryReactor* reactor) const {
  std::shared_ptr<const ServingContext> ctx = backend_.context();
  if (ctx == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is not being served"));
  }
  return ctx;
}

grpc::ServerUnaryReactor* AdminService::GetStatus(grpc::CallbackServerContext* context,
                                                  const vamp::v1::GetStatusRequest*,
                                                  vamp::v1::GetStatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  backend_.status(response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

vamp::v1::Policy AdminService::CurrentPolicy(
    const std::shared_ptr<const ServingContext>& ctx) const {
  vamp::v1::Policy policy = backend_.configured_policy;
  if (ctx != nullptr) {
    policy.set_arbiter(ctx->engine->arbiter_name());
    policy.set_max_offload_ratio(ctx->engine->offload_cap().ratio());
    policy.set_restore_enabled(ctx->engine->vamp_config().restore.enabled);
  }
  return policy;
}

grpc::ServerUnaryReactor* AdminService::GetPolicy(grpc::CallbackServerContext* context,
                                                  const vamp::v1::GetPolicyRequest*,
                                                  vamp::v1::Policy* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  *response = CurrentPolicy(backend_.context());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::SetPolicy(grpc::CallbackServerContext* context,
                                                  const vamp::v1::Policy* request,
                                                  vamp::v1::Policy* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = ServingContextOrFinish(reactor);
  if (ctx == nullptr) return reactor;
  if (request->arbiter() != "static" && request->arbiter() != "vamp") {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "arbiter: '" + request->arbiter() +
                                     "' is not one of static, vamp"));
    return reactor;
  }
  absl::StatusOr<OffloadCap> cap =
      OffloadCap::FromRatio(request->max_offload_ratio(), "max_offload_ratio");
  if (!cap.ok()) {
    reactor->Finish(ToGrpcStatus(cap.status()));
    return reactor;
  }
  // The cap sizes the agents' staging buffers and pinned copies at Init: the one in force is the
  // one the serving agents were initialised with.
  if (const OffloadCap in_force = ctx->engine->offload_cap(); *cap != in_force) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat("max_offload_ratio: changing the cap (", in_force.ratio(), " to ",
                                  cap->ratio(), ") needs a restart with --max_offload_ratio")));
    return reactor;
  }
  VampArbiterConfig vamp = ctx->engine->vamp_config();
  vamp.restore.enabled = request->restore_enabled();
  const std::string arbiter = request->arbiter();
  RunBlocking([this, ctx, arbiter, vamp, response, reactor] {
    absl::Status s = ctx->engine->SetArbiter(arbiter, vamp);
    if (s.ok()) *response = CurrentPolicy(ctx);
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

AdminService::~AdminService() {
  std::vector<BlockingCall> calls;
  {
    absl::MutexLock lock(&calls_mu_);
    calls.swap(calls_);
  }
  for (BlockingCall& c : calls) c.thread.join();
}

void AdminService::RunBlocking(std::function<void()> call) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([done, call = std::move(call)] {
    call();
    done->store(true);
  });
  absl::MutexLock lock(&calls_mu_);
  // Join the calls that have finished so threads do not pile up over a long run.
  std::vector<BlockingCall> running;
  for (BlockingCall& c : calls_) {
    if (c.done->load()) {
      c.thread.join();
    } else {
      running.push_back(std::move(c));
    }
  }
  running.push_back({std::move(thread), std::move(done)});
  calls_.swap(running);
}

namespace {

void ToProto(const VampArbiterConfig& c, vamp::v1::CostCoefficients* out) {
  out->set_alpha(c.costs.alpha);
  out->set_tau_steps(c.costs.tau_steps);
  out->set_t_prefill_us_per_token(c.costs.t_prefill_micros);
  out->set_t_overhead_us(c.costs.t_overhead_micros);
  out->set_t_sched_us(c.costs.t_sched_micros);
  out->set_t_queue_us(c.costs.t_queue_micros);
  out->set_c_eff_us(c.costs.c_eff_micros);
  out->set_offload_step_groups(c.offload_step_groups);
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::GetCoefficients(
    grpc::CallbackServerContext* context, const vamp::v1::GetCoefficientsRequest*,
    vamp::v1::CostCoefficients* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = ServingContextOrFinish(reactor);
  if (ctx == nullptr) return reactor;
  ToProto(ctx->engine->vamp_config(), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::SetCoefficients(grpc::CallbackServerContext* context,
                                                        const vamp::v1::CostCoefficients* request,
                                                        vamp::v1::CostCoefficients* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = ServingContextOrFinish(reactor);
  if (ctx == nullptr) return reactor;
  VampArbiterConfig vamp = ctx->engine->vamp_config();
  vamp.costs.alpha = request->alpha();
  vamp.costs.tau_steps = request->tau_steps();
  vamp.costs.t_prefill_micros = request->t_prefill_us_per_token();
  vamp.costs.t_overhead_micros = request->t_overhead_us();
  vamp.costs.t_sched_micros = request->t_sched_us();
  vamp.costs.t_queue_micros = request->t_queue_us();
  vamp.costs.c_eff_micros = request->c_eff_us();
  vamp.offload_step_groups = request->offload_step_groups();
  if (absl::Status s = vamp.Validate(); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  RunBlocking([ctx, vamp, response, reactor] {
    // The coefficients belong to the cost model: reconfigure it in place (or keep them for when
    // the policy switches to it).
    absl::Status s = ctx->engine->SetArbiter(ctx->engine->arbiter_name(), vamp);
    if (s.ok()) ToProto(ctx->engine->vamp_config(), response);
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::Remap(grpc::CallbackServerContext* context,
                                              int32_t num_groups, bool offload,
                                              vamp::v1::ForceRemapResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  const int32_t groups = offload ? num_groups : -num_groups;
  if (num_groups < 1) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "num_groups: must be >= 1"));
    return reactor;
  }
  std::shared_ptr<const ServingContext> ctx = ServingContextOrFinish(reactor);
  if (ctx == nullptr) return reactor;
  // The remap waits for a step boundary (and, for a restore, for the KV tail to drain).
  RunBlocking([ctx, groups, response, reactor] {
    absl::Status s = ctx->engine->ForceRemap(groups);
    if (s.ok()) {
      vamp::v1::GetStatusResponse status;
      ctx->engine->Snapshot(&status);
      response->set_offloaded_groups(status.offloaded_groups());
      response->set_kv_blocks(status.kv_pool().total_blocks());
    }
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ForceOffload(grpc::CallbackServerContext* context,
                                                     const vamp::v1::ForceRemapRequest* request,
                                                     vamp::v1::ForceRemapResponse* response) {
  return Remap(context, request->num_groups(), /*offload=*/true, response);
}

grpc::ServerUnaryReactor* AdminService::ForceRestore(grpc::CallbackServerContext* context,
                                                     const vamp::v1::ForceRemapRequest* request,
                                                     vamp::v1::ForceRemapResponse* response) {
  return Remap(context, request->num_groups(), /*offload=*/false, response);
}

grpc::ServerUnaryReactor* AdminService::Drain(grpc::CallbackServerContext* context,
                                              const vamp::v1::DrainRequest* request,
                                              vamp::v1::DrainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = ServingContextOrFinish(reactor);
  if (ctx == nullptr) return reactor;
  if (request->undrain()) {
    ctx->engine->Undrain();
  } else {
    ctx->engine->Drain();
  }
  vamp::v1::GetStatusResponse status;
  ctx->engine->Snapshot(&status);
  response->set_running(status.queue().running());
  response->set_waiting(status.queue().waiting());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListDecisions(grpc::CallbackServerContext* context,
                                                      const vamp::v1::ListDecisionsRequest* request,
                                                      vamp::v1::ListDecisionsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = backend_.context();
  if (ctx != nullptr) {
    const int limit = request->limit() > 0 ? request->limit() : 100;
    for (const ArbiterRecord& r : ctx->engine->RecentDecisions(limit)) {
      vamp::v1::ArbiterDecision* d = response->add_decisions();
      d->set_step_id(r.step);
      d->set_gap_blocks(r.gap_blocks);
      d->set_cost_evict_us(r.plan.costs.evict_micros);
      d->set_cost_offload_us(r.plan.costs.offload_micros);
      d->set_cost_preempt_us(r.plan.costs.preempt_micros);
      d->set_cost_combined_us(r.plan.costs.combined_micros);
      d->set_action(r.plan.choice);
      d->set_groups(r.plan.offload_groups);
      d->set_evicted_blocks(r.blocks_evicted);
      d->set_preempted_requests(r.requests_preempted);
      if (r.restore_groups > 0) d->set_groups(-r.restore_groups);
      const TaxComparison& t = r.plan.tax;
      if (t.evaluated) {
        d->set_tax_evaluated(true);
        d->set_tax_groups(t.groups);
        d->set_tax_us(t.tax_micros);
        d->set_value_us(t.value_micros);
        d->set_ghost_tokens(t.ghost_tokens);
        d->set_preempt_tokens(t.preempt_tokens);
        d->set_window_seconds(t.window_micros * 1e-6);
        d->set_h2d_gbps(t.h2d_bytes_per_s * 1e-9);
        d->set_routed_h2d_gbps(t.routed_h2d_bytes_per_s * 1e-9);
        d->set_ttft_weight(t.ttft_weight);
        d->set_mean_queue_seconds(t.mean_queue_micros * 1e-6);
        d->set_compute_bound_share(t.compute_bound_share);
        d->set_tpot_overhead(t.tpot_overhead);
      }
      d->set_detail(absl::StrCat("requester ", r.requester, r.requester_running ? " (running)"
                                                                                : " (waiting)",
                                 ", blocks added ", r.blocks_added));
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace vamp
