#include "controller/admin_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace vamp {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

bool AdminService::Authorized(grpc::CallbackServerContext* context,
                              grpc::ServerUnaryReactor* reactor) const {
  if (backend_.auth_token.empty()) return true;
  auto it = context->client_metadata().find("authorization");
  if (it != context->client_metadata().end() &&
      std::string(it->second.data(), it->second.size()) == "Bearer " + backend_.auth_token) {
    return true;
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                               "admin calls need the token (authorization: Bearer <token>)"));
  return false;
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

grpc::ServerUnaryReactor* AdminService::GetPolicy(grpc::CallbackServerContext* context,
                                                  const vamp::v1::GetPolicyRequest*,
                                                  vamp::v1::Policy* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  *response = backend_.policy;
  reactor->Finish(grpc::Status::OK);
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
  std::shared_ptr<const ServingContext> ctx = backend_.context();
  if (ctx == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is not being served"));
    return reactor;
  }
  // The remap waits for a step boundary (and, for a restore, for the KV tail to drain).
  std::thread([ctx, groups, response, reactor] {
    absl::Status s = ctx->engine->ForceRemap(groups);
    if (s.ok()) {
      vamp::v1::GetStatusResponse status;
      ctx->engine->Snapshot(&status);
      response->set_offloaded_groups(status.offloaded_groups());
      response->set_kv_blocks(status.kv_pool().total_blocks());
    }
    reactor->Finish(ToGrpc(s));
  }).detach();
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
                                              const vamp::v1::DrainRequest*,
                                              vamp::v1::DrainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Authorized(context, reactor)) return reactor;
  std::shared_ptr<const ServingContext> ctx = backend_.context();
  if (ctx == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is not being served"));
    return reactor;
  }
  ctx->engine->Drain();
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
      d->set_cost_offload_us(r.plan.costs.expand_micros);
      d->set_cost_preempt_us(r.plan.costs.preempt_micros);
      d->set_cost_combined_us(r.plan.costs.combined_micros);
      d->set_action(r.plan.choice);
      d->set_groups(r.plan.expand_groups);
      d->set_evicted_blocks(r.blocks_evicted);
      d->set_preempted_requests(r.requests_preempted);
      d->set_detail(absl::StrCat("requester ", r.requester, r.requester_running ? " (running)"
                                                                                : " (waiting)",
                                 ", blocks added ", r.blocks_added));
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace vamp
