// The gRPC Serving service (serving.proto) of vamp-controller on gRPC's callback API: Generate
// streams a request's tokens as the engine produces them; ListModels names the served model.
#ifndef VAMP_CONTROLLER_SERVING_SERVICE_H_
#define VAMP_CONTROLLER_SERVING_SERVICE_H_

#include "absl/status/statusor.h"
#include "controller/serving_context.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp {

// Validates a GenerateRequest against the served model; errors name the field.
absl::StatusOr<ServingRequest> FromGenerateRequest(const vamp::v1::GenerateRequest& request,
                                                   const ServedModel& model);

class ServingService final : public vamp::v1::Serving::CallbackService {
 public:
  explicit ServingService(ServingContextProvider context) : context_(std::move(context)) {}

  grpc::ServerWriteReactor<vamp::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const vamp::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const vamp::v1::ListModelsRequest* request,
                                       vamp::v1::ListModelsResponse* response) override;

 private:
  ServingContextProvider context_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_SERVICE_H_
