#include "controller/admin_service.h"

namespace vamp {

grpc::ServerUnaryReactor* AdminService::GetStatus(grpc::CallbackServerContext* context,
                                                  const vamp::v1::GetStatusRequest* request,
                                                  vamp::v1::GetStatusResponse* response) {
  status_(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace vamp
