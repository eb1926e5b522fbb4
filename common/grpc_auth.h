// Bearer tokens on gRPC calls, both sides, for every VAMP server and client that needs one (the
// agents' service, Admin, Serving, agent registration; the controller, agents and vampctl as
// callers). The check reads the call's "authorization" metadata and compares through
// common/secret.h, in constant time, so no server has its own lookup or comparison.
#ifndef VAMP_COMMON_GRPC_AUTH_H_
#define VAMP_COMMON_GRPC_AUTH_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace vamp {

// Whether the call's "authorization" metadata is "Bearer <secret>". False without the metadata.
bool CallPresentsBearer(const grpc::ServerContextBase& context, absl::string_view secret);
// Whether it is "Bearer <s>" for one of `secrets` (every one compared, as BearerMatchesAny).
bool CallPresentsBearerOfAny(const grpc::ServerContextBase& context,
                             const std::vector<std::string>& secrets);

// Adds "authorization: Bearer <secret>" to an outgoing call; nothing when `secret` is empty.
void AddBearerMetadata(grpc::ClientContext* context, absl::string_view secret);

}  // namespace vamp

#endif  // VAMP_COMMON_GRPC_AUTH_H_
