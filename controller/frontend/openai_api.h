// The OpenAI-compatible request bodies of vamp-controller's HTTP frontend: /v1/completions and
// /v1/chat/completions, parsed and validated into one ServingRequest. Every rejection is an
// InvalidArgument (HTTP 400) or NotFound (404, unknown model) whose message starts with the
// offending field and whose payload kParamPayload carries that field's name, so the error body
// can say which parameter is wrong, as OpenAI's does.
#ifndef VAMP_CONTROLLER_FRONTEND_OPENAI_API_H_
#define VAMP_CONTROLLER_FRONTEND_OPENAI_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/core/sampling_params.h"
#include "controller/frontend/tokenizer.h"

namespace vamp {

inline constexpr char kParamPayload[] = "type.vamp.dev/param";

struct ServedModel {
  std::string id;            // what clients put in "model"
  int32_t max_model_len = 0; // prompt + output tokens
  int32_t vocab_size = 0;
};

struct ServingRequest {
  bool chat = false;
  std::string model;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string cache_salt;
  int32_t priority = 0;
};

// Default max_tokens when a completion request gives none (OpenAI's default for completions).
inline constexpr int32_t kDefaultCompletionMaxTokens = 16;

absl::StatusOr<ServingRequest> ParseCompletionRequest(absl::string_view body,
                                                      const ServedModel& model,
                                                      const Tokenizer& tokenizer);
absl::StatusOr<ServingRequest> ParseChatCompletionRequest(absl::string_view body,
                                                          const ServedModel& model,
                                                          const Tokenizer& tokenizer);

// HTTP status for a Status from the parsers or the engine (400, 404, 429, 500, 503).
int HttpStatusFor(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}} for `status`.
std::string ErrorBody(const absl::Status& status);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_FRONTEND_OPENAI_API_H_
