// The OpenAI-compatible request bodies of vamp-controller's HTTP frontend: /v1/completions and
// /v1/chat/completions, parsed and validated into one OpenAiRequest. Every rejection is an
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
#include "tokenizer/tokenizer.h"

namespace vamp {

inline constexpr char kParamPayload[] = "type.vamp.dev/param";

struct ServedModel {
  std::string id;            // what clients put in "model"
  int32_t max_model_len = 0; // prompt + output tokens
  int32_t vocab_size = 0;
  // The agents compute prompt log-probabilities (InitResponse.prompt_logprobs_supported on every
  // rank): completions may ask for echo with logprobs.
  bool prompt_logprobs = false;
};

// How the response writer shapes a request's output (chat requests; completions get raw text).
struct ResponseOptions {
  bool chat = false;
  bool include_usage = false;  // stream_options.include_usage
  // Split <think>…</think> into reasoning_content (the model's vocabulary has the tags).
  bool parse_reasoning = false;
  // The prompt itself opened <think> (templates of always-thinking models end the generation
  // prompt with it): the output starts inside the reasoning and only closes it.
  bool reasoning_open = false;
  // Turn <tool_call>{json}</tool_call> blocks into tool_calls (tools offered, tool_choice not
  // "none").
  bool parse_tool_calls = false;
  // parallel_tool_calls = false: only the first call is returned.
  bool parallel_tool_calls = true;
  // Text the prompt already opened the assistant's reply with (tool_choice "required" or a named
  // function prefill "<tool_call>\n…"); the parsers read it before the generated text.
  std::string assistant_prefix;
  // Choices per prompt (n). A request of num_prompts prompts has num_prompts * n choices, choice
  // i = prompt_index * n + j for prompt prompt_index (OpenAI's and vLLM's order): the front end
  // runs each as an engine request, seeded seed + i.
  int32_t n = 1;
  // Prompts: more than one for a completions batch (a prompt array of strings or of token-id
  // arrays), else 1.
  int32_t num_prompts = 1;
  // Stop strings: each choice's text ends before the first of them (not included), finish_reason
  // "stop" (controller/frontend/stop_strings.h).
  std::vector<std::string> stop;
  // Completions with echo: per prompt, its text, sent before each of its choices' generated
  // text; empty: no echo.
  std::vector<std::string> echo;
  // Completions with echo and logprobs: per prompt, its token ids, whose log-probabilities (the
  // first token's null, as OpenAI's) and alternatives come before the output's in each of its
  // choices' logprobs (the engine requests ask for prompt log-probabilities); empty otherwise.
  std::vector<std::vector<int32_t>> echo_token_ids;
  // Return each output token's log-probability (chat: logprobs true; completions: logprobs set),
  // in OpenAI's response shapes, with num_top_logprobs alternatives each (chat: top_logprobs
  // 0..20; completions: the logprobs value 0..5).
  bool logprobs = false;
  int32_t num_top_logprobs = 0;
};

// One parsed request: what the serving engine runs (prompt, sampling, cache salt, priority;
// the HTTP frontend hands these on as a ServingRequest) and how the response is shaped.
struct OpenAiRequest {
  bool chat = false;
  std::string model;
  // The prompts' token ids: one for chat and for a single completions prompt, response.num_prompts
  // for a completions batch.
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string cache_salt;
  int32_t priority = 0;
  ResponseOptions response;  // chat output parsing; chat and include_usage mirror the fields above
};

// Default max_tokens when a completion request gives none (OpenAI's default for completions).
inline constexpr int32_t kDefaultCompletionMaxTokens = 16;
// Most stop strings a request may give, and the longest one (bytes).
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr int32_t kMaxStopStringBytes = 1024;

// Limits the server applies to requests (flags of vamp-controller).
struct RequestLimits {
  int32_t max_n = 16;  // most choices (n) per prompt
  // Most prompts in one completions request, and most choices (prompts x n) one request may
  // start: each choice is a scheduler request, so this bounds the work one request creates (the
  // default is a quarter of the scheduler's default max_num_seqs, 256). At least max_n.
  int32_t max_batch_prompts = 64;
};

// Completion requests: prompt (a string, an array of token ids, or a batch: an array of up to
// limits.max_batch_prompts strings or token-id arrays; prompts x n at most max_batch_prompts),
// echo (each prompt's text before its choices' output; with logprobs, the prompt tokens' log-
// probabilities too, refused with a 400 naming echo when model.prompt_logprobs is false), stop,
// n and the sampling fields.
absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view body,
                                                      const ServedModel& model,
                                                      const Tokenizer& tokenizer,
                                                      const RequestLimits& limits = {});
// Chat requests: messages (with tool_calls, tool_call_id, name, reasoning_content), tools,
// tool_choice ("none" | "auto" | "required" | {"type": "function", "function": {"name"}}),
// parallel_tool_calls, chat_template_kwargs and add_generation_prompt go through the tokenizer's
// chat template. "required" and a named function are enforced by opening the assistant's reply
// with "<tool_call>\n" (and the function's name), as far as the model's format allows; a model
// without a tool-call format refuses tools. response_format other than {"type": "text"} and a
// non-empty logit_bias are refused with a 400 naming the field.
absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(absl::string_view body,
                                                          const ServedModel& model,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits = {});

// HTTP status for a Status from the parsers or the engine (400, 404, 429, 500, 503).
int HttpStatusFor(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}} for `status`.
std::string ErrorBody(const absl::Status& status);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_FRONTEND_OPENAI_API_H_
