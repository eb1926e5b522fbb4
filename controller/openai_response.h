// The OpenAI-compatible response bodies of one completion or chat completion request, built from
// the engine's events: SSE chunks ("data: {...}\n\n", then the usage chunk when asked for and
// "data: [DONE]\n\n") for a streaming request, one JSON body for a unary one. Transport-free, so
// every HTTP (or other) front end formats output the same way and tests need no socket.
// Text is detokenised incrementally: a chunk carries whole UTF-8 characters only, and the chunks
// add up to the unary text. Chat output is split into reasoning_content, content and tool_calls
// (finish_reason "tool_calls") as the request's ResponseOptions say (controller/frontend/
// chat_output.h).
// Not thread-safe: one writer per request, used by one thread at a time.
#ifndef VAMP_CONTROLLER_OPENAI_RESPONSE_H_
#define VAMP_CONTROLLER_OPENAI_RESPONSE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/frontend/chat_output.h"
#include "controller/frontend/tokenizer.h"
#include "controller/serving_context.h"
#include "controller/serving_engine.h"

namespace vamp {

class OpenAiResponseWriter {
 public:
  // `context` must outlive the writer (the front end holds it for the request's lifetime).
  // `created` is the request's arrival in Unix seconds; `request_id` the engine's id.
  // `options` come from the parsed request (ServingRequest::response).
  OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                       const ResponseOptions& options, RequestId request_id, int64_t created);
  // Without the request's options: no tool-call parsing; reasoning parsed when the model's
  // vocabulary has <think> tags (a model-wide setting, as vLLM's --reasoning-parser).
  OpenAiResponseWriter(std::shared_ptr<const ServingContext> context, bool chat,
                       bool include_usage, RequestId request_id, int64_t created);

  // Streaming: the SSE bytes for `event` (its chunk; after the last event also the usage chunk
  // when include_usage was asked for, and the [DONE] marker).
  std::string StreamChunk(const EngineEvent& event);

  // Unary: records `event`'s tokens. Once `event.finished`, Finish() gives the body.
  void Append(const EngineEvent& event);
  // The whole response body after the final event, or the request's failure (Unavailable).
  absl::StatusOr<std::string> Finish(const EngineEvent& final_event) const;

  // "cmpl-<id>" or "chatcmpl-<id>".
  const std::string& response_id() const { return response_id_; }

 private:
  const std::shared_ptr<const ServingContext> context_;
  const ResponseOptions options_;
  const bool chat_;
  const bool include_usage_;
  const std::string response_id_;
  const int64_t created_;
  bool first_chunk_ = true;
  std::vector<int32_t> tokens_;  // unary: every generated token so far
  StreamDecoder decoder_;        // streaming
  ChatStreamParser parser_;      // streaming chat
};

// Unix time in seconds (the "created" field).
int64_t UnixSeconds();

}  // namespace vamp

#endif  // VAMP_CONTROLLER_OPENAI_RESPONSE_H_
