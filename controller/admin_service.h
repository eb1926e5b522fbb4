// The Admin gRPC service (proto/vamp/v1/admin.proto) of vamp-controller, on gRPC's callback API.
// Methods not yet backed by the engine core answer UNIMPLEMENTED (the generated default).
#ifndef VAMP_CONTROLLER_ADMIN_SERVICE_H_
#define VAMP_CONTROLLER_ADMIN_SERVICE_H_

#include <functional>

#include "vamp/v1/admin.grpc.pb.h"

namespace vamp {

class AdminService final : public vamp::v1::Admin::CallbackService {
 public:
  // `status` fills a status snapshot; it is called on gRPC threads and must be thread-safe.
  using StatusProvider = std::function<void(vamp::v1::GetStatusResponse*)>;
  explicit AdminService(StatusProvider status) : status_(std::move(status)) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const vamp::v1::GetStatusRequest* request,
                                      vamp::v1::GetStatusResponse* response) override;

 private:
  StatusProvider status_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_ADMIN_SERVICE_H_
