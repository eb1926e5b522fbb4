// The OpenAI-compatible response bodies of one completion or chat completion request, built from
// the engine's events: SSE chunks ("data: {...}\n\n", then the usage chunk when asked for and
// "data: [DONE]\n\n") for a streaming request, one JSON body for a unary one. Transport-free, so
// every HTTP (or other) front end formats output the same way and tests need no socket.
// Text is detokenised incrementally: a chunk carries whole UTF-8 characters only, and the chunks
// add up to the unary text. Chat output is split into reasoning_content, content and tool_calls
// (finish_reason "tool_calls") as the request's ResponseOptions say (controller/frontend/
// chat_output.h). Stop strings end a choice's text before them, with hold-back while streaming
// (controller/frontend/stop_strings.h); a request's num_prompts x n choices are indexed
// prompt_index * n + j in one response; completions with echo send each choice's prompt text
// first; with logprobs asked for, each choice carries its tokens' log-probabilities (token strings
// are the tokens' own bytes; completions' text_offset counts bytes of the choice's whole text),
// and with echo its prompt's tokens come first (the first one's logprob and top_logprobs null).
// Not thread-safe: one writer per request, used by one thread at a time.
#ifndef VAMP_CONTROLLER_SERVER_OPENAI_RESPONSE_H_
#define VAMP_CONTROLLER_SERVER_OPENAI_RESPONSE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/frontend/chat_output.h"
#include "controller/frontend/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "controller/serving/serving_context.h"
#include "controller/serving/serving_engine.h"
#include "nlohmann/json.hpp"

namespace vamp {

class OpenAiResponseWriter {
 public:
  // `context` must outlive the writer (the front end holds it for the request's lifetime).
  // `created` is the request's arrival in Unix seconds; `request_id` the engine's id of choice 0.
  // `options` come from the parsed request (OpenAiRequest::response); options.num_prompts x
  // options.n choices, choice i answering prompt i / options.n.
  OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                       const ResponseOptions& options, RequestId request_id, int64_t created);
  // Without the request's options: one choice, no tool-call parsing; reasoning parsed when the
  // model's vocabulary has <think> tags (a model-wide setting, as vLLM's --reasoning-parser).
  OpenAiResponseWriter(std::shared_ptr<const ServingContext> context, bool chat,
                       bool include_usage, RequestId request_id, int64_t created);

  // Streaming: the SSE bytes for choice `index`'s `event` ("" once that choice is done). A choice
  // is done at its final event or when a stop string matched (then this chunk is its last, with
  // finish_reason "stop", and the caller ends the engine request). After the last choice: the
  // usage chunk when include_usage was asked for (each prompt's tokens counted once, completion
  // tokens summed over the choices), and the [DONE] marker.
  std::string StreamChunk(int index, const EngineEvent& event);

  // Unary: records choice `index`'s `event`. Once done(), Finish() gives the body.
  void Append(int index, const EngineEvent& event);
  // The whole response body (choices in index order), or the first failed choice's error
  // (Unavailable). Call once done().
  absl::StatusOr<std::string> Finish() const;

  // Whether choice `index` has ended (final event, or a stop string matched).
  bool choice_done(int index) const { return choices_[index].done; }
  // Whether every choice has ended.
  bool done() const { return num_done_ == static_cast<int>(choices_.size()); }

  // "cmpl-<id>" or "chatcmpl-<id>".
  const std::string& response_id() const { return response_id_; }

 private:
  struct Choice {
    Choice(const ServingContext& context, const ResponseOptions& options, int prompt);
    const int prompt;  // index of the prompt it answers
    StreamDecoder decoder;
    StopStringMatcher stop;
    ChatStreamParser parser;   // streaming chat
    std::vector<int32_t> tokens;  // every generated token so far
    std::vector<float> logprobs;  // per token of `tokens`, when the agents sent them all
    // options.num_top_logprobs alternatives per token of `tokens` (token-major).
    std::vector<int32_t> top_token_ids;
    std::vector<float> top_logprobs;
    bool logprobs_complete = true;
    // Echo with logprobs: the prompt's (EngineEvent::prompt_logprobs), once they came.
    bool has_prompt_logprobs = false;
    std::vector<float> prompt_logprobs;
    std::vector<int32_t> prompt_top_token_ids;
    std::vector<float> prompt_top_logprobs;
    std::string text;          // unary: the output text so far (stop strings applied)
    bool streamed = false;     // a chunk has been sent (the first carries the role / echo)
    int64_t text_offset = 0;   // streamed completions: bytes of the token strings sent so far
    bool done = false;
    FinishReason finish_reason = FinishReason::kNone;
    std::string error;
    int32_t completion_tokens = 0;
  };
  // Decodes `event` into choice `c`'s text (the stop strings applied) and marks it done at the
  // end of its output; returns the new text.
  std::string Consume(Choice& c, const EngineEvent& event);
  // The usage object: each prompt's tokens once, completion tokens over every choice.
  nlohmann::json Usage() const;
  // The echoed text of choice `c`'s prompt ("" without echo).
  const std::string& Echo(const Choice& c) const;
  // Whether `event` carries a logprob per token and options.num_top_logprobs alternatives each.
  bool HasLogprobs(const EngineEvent& event) const;
  // OpenAI's logprobs object for `tokens` with `logprobs` and k = options.num_top_logprobs
  // alternatives per token (token-major `top_token_ids` / `top_logprobs`; chat: {"content":
  // [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes} x k]}]}; completions:
  // {"tokens", "token_logprobs", "top_logprobs": [{token string: logprob}], "text_offset"}, each
  // map holding the chosen token and the k alternatives, offsets counted from *text_offset, which
  // advances past the tokens' bytes), or null when any are missing.
  nlohmann::json LogprobsJson(const std::vector<int32_t>& tokens,
                              const std::vector<float>& logprobs,
                              const std::vector<int32_t>& top_token_ids,
                              const std::vector<float>& top_logprobs, int64_t* text_offset) const;

  // Completions' logprobs of choice `c`'s prompt tokens (options.echo_token_ids): token 0 with
  // null logprob and top_logprobs, then each with its log-probability and alternatives; offsets
  // from *text_offset, which advances. Null when they are missing.
  nlohmann::json PromptLogprobsJson(const Choice& c, int64_t* text_offset) const;
  // Choice `c`'s logprobs object for `tokens` (LogprobsJson), preceded by its prompt's
  // (PromptLogprobsJson) when `with_prompt`; null when any part is missing.
  nlohmann::json ChoiceLogprobs(const Choice& c, bool with_prompt,
                                const std::vector<int32_t>& tokens,
                                const std::vector<float>& logprobs,
                                const std::vector<int32_t>& top_token_ids,
                                const std::vector<float>& top_logprobs, int64_t* text_offset) const;

  const std::shared_ptr<const ServingContext> context_;
  const ResponseOptions options_;
  const bool chat_;
  const bool include_usage_;
  const std::string response_id_;
  const int64_t created_;
  std::vector<Choice> choices_;
  int num_done_ = 0;
  // Per prompt: its tokens and the most of them any of its choices found cached.
  std::vector<int32_t> prompt_tokens_;
  std::vector<int32_t> cached_prompt_tokens_;
};

// Unix time in seconds (the "created" field).
int64_t UnixSeconds();

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_OPENAI_RESPONSE_H_
