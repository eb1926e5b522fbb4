// The Admin gRPC service (proto/vamp/v1/admin.proto) of vamp-controller, on gRPC's callback API.
// When an admin token is configured every call must carry "authorization: Bearer <token>".
// Calls that wait for the engine (forced remaps) finish from a worker thread, never blocking a
// gRPC thread.
#ifndef VAMP_CONTROLLER_SERVER_ADMIN_SERVICE_H_
#define VAMP_CONTROLLER_SERVER_ADMIN_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "controller/serving/serving_context.h"
#include "vamp/v1/admin.grpc.pb.h"

namespace vamp {

struct AdminBackend {
  // Fills a status snapshot; called on gRPC threads, must be thread-safe.
  std::function<void(vamp::v1::GetStatusResponse*)> status;
  // The serving context (null while not serving).
  ServingContextProvider context;
  // The configured policy (arbiter, cap, restore), reported while nothing is served; while a
  // model is served the policy in force is the serving engine's.
  vamp::v1::Policy configured_policy;
  // Required bearer token; empty = none.
  std::string auth_token;
};

class AdminService final : public vamp::v1::Admin::CallbackService {
 public:
  explicit AdminService(AdminBackend backend) : backend_(std::move(backend)) {}
  // Waits for calls still running on their own threads (they wait for a step boundary; the
  // engine finishes or cancels them when it stops).
  ~AdminService() override;

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const vamp::v1::GetStatusRequest* request,
                                      vamp::v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* context,
                                      const vamp::v1::GetPolicyRequest* request,
                                      vamp::v1::Policy* response) override;
  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* context,
                                      const vamp::v1::Policy* request,
                                      vamp::v1::Policy* response) override;
  grpc::ServerUnaryReactor* GetCoefficients(grpc::CallbackServerContext* context,
                                            const vamp::v1::GetCoefficientsRequest* request,
                                            vamp::v1::CostCoefficients* response) override;
  grpc::ServerUnaryReactor* SetCoefficients(grpc::CallbackServerContext* context,
                                            const vamp::v1::CostCoefficients* request,
                                            vamp::v1::CostCoefficients* response) override;
  grpc::ServerUnaryReactor* ForceOffload(grpc::CallbackServerContext* context,
                                         const vamp::v1::ForceRemapRequest* request,
                                         vamp::v1::ForceRemapResponse* response) override;
  grpc::ServerUnaryReactor* ForceRestore(grpc::CallbackServerContext* context,
                                         const vamp::v1::ForceRemapRequest* request,
                                         vamp::v1::ForceRemapResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const vamp::v1::DrainRequest* request,
                                  vamp::v1::DrainResponse* response) override;
  grpc::ServerUnaryReactor* ListDecisions(grpc::CallbackServerContext* context,
                                          const vamp::v1::ListDecisionsRequest* request,
                                          vamp::v1::ListDecisionsResponse* response) override;

 private:
  // Checks the token; on failure finishes the reactor and returns false.
  bool Authorized(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor) const;
  // The serving context; when there is none, finishes the reactor with UNAVAILABLE and returns null.
  std::shared_ptr<const ServingContext> ServingContextOrFinish(
      grpc::ServerUnaryReactor* reactor) const;
  // Offloads or restores `num_groups` (>= 1) groups on every rank.
  grpc::ServerUnaryReactor* Remap(grpc::CallbackServerContext* context, int32_t num_groups,
                                  bool offload, vamp::v1::ForceRemapResponse* response);

  // Runs `call` on a thread of its own: it blocks until the engine reaches a step boundary,
  // which must not hold a gRPC callback thread. The destructor waits for it.
  void RunBlocking(std::function<void()> call);

  // The policy in force: the engine's when serving, else the configured one.
  vamp::v1::Policy CurrentPolicy(const std::shared_ptr<const ServingContext>& ctx) const;

  AdminBackend backend_;
  struct BlockingCall {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Mutex calls_mu_;
  std::vector<BlockingCall> calls_ ABSL_GUARDED_BY(calls_mu_);  // joined when done or at exit
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_ADMIN_SERVICE_H_
