#include "common/grpc_auth.h"

#include "absl/strings/str_cat.h"
#include "common/secret.h"

namespace vamp {
namespace {

constexpr char kAuthorization[] = "authorization";

// Sets `value` to the call's authorization metadata; false when it has none.
bool AuthorizationValue(const grpc::ServerContextBase& context, absl::string_view* value) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorization);
  if (it == metadata.end()) return false;
  *value = absl::string_view(it->second.data(), it->second.size());
  return true;
}

}  // namespace

bool CallPresentsBearer(const grpc::ServerContextBase& context, absl::string_view secret) {
  absl::string_view value;
  return AuthorizationValue(context, &value) && BearerMatches(value, secret);
}

bool CallPresentsBearerOfAny(const grpc::ServerContextBase& context,
                             const std::vector<std::string>& secrets) {
  absl::string_view value;
  return AuthorizationValue(context, &value) && BearerMatchesAny(value, secrets);
}

void AddBearerMetadata(grpc::ClientContext* context, absl::string_view secret) {
  if (secret.empty()) return;
  context->AddMetadata(kAuthorization, absl::StrCat("Bearer ", secret));
}

}  // namespace vamp
