// The gRPC Serving service (serving.proto) of vamp-controller on gRPC's callback API: Generate
// streams a request's tokens as the engine produces them; ListModels names the served model. Both
// require the same API keys as the HTTP API.
#ifndef VAMP_CONTROLLER_SERVER_SERVING_SERVICE_H_
#define VAMP_CONTROLLER_SERVER_SERVING_SERVICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/serving/serving_context.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp {

// Validates a GenerateRequest against the served model; errors name the field.
absl::StatusOr<ServingRequest> FromGenerateRequest(const vamp::v1::GenerateRequest& request,
                                                   const ServedModel& model);

class ServingService final : public vamp::v1::Serving::CallbackService {
 public:
  // `api_keys`: what every call must present as "authorization: Bearer <key>" metadata (the
  // HTTP API's --api_key_file); empty = open.
  explicit ServingService(ServingContextProvider context, std::vector<std::string> api_keys = {})
      : context_(std::move(context)), api_keys_(std::move(api_keys)) {}

  grpc::ServerWriteReactor<vamp::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const vamp::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const vamp::v1::ListModelsRequest* request,
                                       vamp::v1::ListModelsResponse* response) override;

 private:
  // Whether the call carries one of api_keys_ (always, when there are none).
  bool Authorized(const grpc::CallbackServerContext* context) const;

  ServingContextProvider context_;
  const std::vector<std::string> api_keys_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_SERVING_SERVICE_H_
