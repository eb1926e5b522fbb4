// Shared secrets (agent tokens, admin tokens, API keys): reading them from files, generating them
// and comparing them. Every check of a presented secret goes through SecretEquals or
// BearerMatches, so no comparison leaks through its timing how much of a guess was right.
#ifndef VAMP_COMMON_SECRET_H_
#define VAMP_COMMON_SECRET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

// Bounds on a secret's length. The upper one is what the agents' tensor-parallel handshake
// carries (TcpCommunicator) and keeps gRPC metadata small; the lower one refuses tokens short
// enough to guess.
inline constexpr size_t kMinSecretBytes = 8;
inline constexpr size_t kMaxSecretBytes = 4096;

// The environment variable through which a vamp-controller that spawns its agents hands them
// their token (never argv, which every user of the machine can read; the environment only the
// same user). vamp-agent reads it once at start-up and wipes it.
inline constexpr char kAgentAuthTokenEnv[] = "VAMP_AGENT_AUTH_TOKEN";

// Checks that `secret` can travel in an "authorization: Bearer <secret>" header or gRPC metadata
// as is: kMinSecretBytes..kMaxSecretBytes of printable ASCII (0x21-0x7e). Anything else (a
// newline, a control or non-ASCII byte) would make gRPC refuse, and log, the metadata. The error
// never contains the secret.
absl::Status ValidateSecret(absl::string_view secret);

// Reads a secret file: exactly one line (a trailing newline and surrounding whitespace are
// ignored; blank lines too), validated with ValidateSecret. Errors start with `field` (e.g.
// "config field 'auth_token_file'" or "--token-file") and name `path`, never the content.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view field);

// Reads a file of secrets, one per line (blank lines and '#' comments skipped), each validated.
// At least one is required. Errors start with `field` and name `path` and the line number.
absl::StatusOr<std::vector<std::string>> ReadSecretListFile(const std::string& path,
                                                            absl::string_view field);

// A fresh random secret from the kernel's CSPRNG: 64 hex digits (256 bits).
absl::StatusOr<std::string> GenerateSecret();

// Whether `presented` equals `expected`, in time that depends only on their lengths.
bool SecretEquals(absl::string_view presented, absl::string_view expected);

// Whether an authorization header or metadata value is "Bearer <s>" for one of `secrets`. Every
// secret is compared (in constant time), whether or not an earlier one matched.
bool BearerMatches(absl::string_view header, absl::string_view secret);
bool BearerMatchesAny(absl::string_view header, const std::vector<std::string>& secrets);

}  // namespace vamp

#endif  // VAMP_COMMON_SECRET_H_
