#include "controller/openai_response.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) {
  // Byte-level detokenisation can cut a UTF-8 sequence; never fail on it.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// OpenAI's finish_reason: null while the request runs, else the scheduler's reason name.
Json FinishReasonJson(FinishReason r) {
  if (r == FinishReason::kNone) return nullptr;
  return std::string(FinishReasonName(r));
}

Json Usage(const EngineEvent& e) {
  return {{"prompt_tokens", e.prompt_tokens},
          {"completion_tokens", e.completion_tokens},
          {"total_tokens", e.prompt_tokens + e.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", e.cached_prompt_tokens}}}};
}

}  // namespace

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

ResponseOptions DefaultOptions(const ServingContext& context, bool chat, bool include_usage) {
  ResponseOptions o;
  o.chat = chat;
  o.include_usage = include_usage;
  o.parse_reasoning = chat && context.tokenizer->has_think_tags();
  return o;
}

// OpenAI reports a turn that ended in tool calls as "tool_calls" (a natural stop otherwise).
Json FinishReasonFor(FinishReason r, bool called_tools) {
  if (called_tools && r == FinishReason::kStop) return "tool_calls";
  return FinishReasonJson(r);
}

Json ToolCallJson(const ToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace

OpenAiResponseWriter::OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                                           const ResponseOptions& options, RequestId request_id,
                                           int64_t created)
    : context_(std::move(context)),
      options_(options),
      chat_(options.chat),
      include_usage_(options.include_usage),
      response_id_(absl::StrCat(options.chat ? "chatcmpl-" : "cmpl-", request_id)),
      created_(created),
      decoder_(context_->tokenizer.get()),
      parser_(options) {}

OpenAiResponseWriter::OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                                           bool chat, bool include_usage, RequestId request_id,
                                           int64_t created)
    : OpenAiResponseWriter(context, DefaultOptions(*context, chat, include_usage), request_id,
                           created) {}

std::string OpenAiResponseWriter::StreamChunk(const EngineEvent& e) {
  const char* object = chat_ ? "chat.completion.chunk" : "text_completion";
  Json chunk = {{"id", response_id_},
                {"created", created_},
                {"model", context_->model.id},
                {"object", object}};
  std::string text = decoder_.Next(e.token_ids);
  if (e.finished) text += decoder_.Finish();
  Json choice = {{"index", 0}, {"finish_reason", nullptr}, {"token_ids", e.token_ids}};
  if (chat_) {
    ChatDelta d = parser_.Next(text);
    if (e.finished) {
      ChatDelta rest = parser_.Finish();
      d.reasoning_content += rest.reasoning_content;
      d.content += rest.content;
      for (auto& c : rest.tool_calls) d.tool_calls.push_back(std::move(c));
    }
    Json delta = Json::object();
    if (first_chunk_) delta["role"] = "assistant";
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    // Plain chat keeps a content field in every chunk, as before (possibly "").
    if (!d.content.empty() || (d.reasoning_content.empty() && d.tool_calls.empty())) {
      delta["content"] = d.content;
    }
    if (!d.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ChatDelta::Call& c : d.tool_calls) {
        Json j = ToolCallJson(c.call);
        j["index"] = c.index;
        calls.push_back(std::move(j));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
    choice["finish_reason"] = FinishReasonFor(e.finish_reason, parser_.called_tools());
  } else {
    choice["text"] = text;
    choice["finish_reason"] = FinishReasonJson(e.finish_reason);
  }
  first_chunk_ = false;
  if (!e.error.empty()) choice["error"] = e.error;
  chunk["choices"] = Json::array({choice});
  std::string out = absl::StrCat("data: ", Dump(chunk), "\n\n");
  if (e.finished && include_usage_) {
    Json usage = {{"id", response_id_},
                  {"created", created_},
                  {"model", context_->model.id},
                  {"object", object},
                  {"choices", Json::array()},
                  {"usage", Usage(e)}};
    absl::StrAppend(&out, "data: ", Dump(usage), "\n\n");
  }
  if (e.finished) absl::StrAppend(&out, "data: [DONE]\n\n");
  return out;
}

void OpenAiResponseWriter::Append(const EngineEvent& e) {
  tokens_.insert(tokens_.end(), e.token_ids.begin(), e.token_ids.end());
}

absl::StatusOr<std::string> OpenAiResponseWriter::Finish(const EngineEvent& e) const {
  if (!e.error.empty()) {
    return absl::UnavailableError(absl::StrCat("request failed: ", e.error));
  }
  const std::string text = context_->tokenizer->Decode(tokens_);
  Json choice = {{"index", 0},
                 {"finish_reason", FinishReasonJson(e.finish_reason)},
                 {"token_ids", tokens_},
                 {"logprobs", nullptr}};
  if (chat_) {
    const ChatOutput parsed = ParseChatOutput(text, options_);
    Json message = {{"role", "assistant"}};
    message["content"] = parsed.content.has_value() ? Json(*parsed.content) : Json(nullptr);
    if (parsed.reasoning_content.has_value()) {
      message["reasoning_content"] = *parsed.reasoning_content;
    }
    if (!parsed.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ToolCall& c : parsed.tool_calls) calls.push_back(ToolCallJson(c));
      message["tool_calls"] = std::move(calls);
    }
    // Plain chat (no parsing asked for) keeps "content": "" for an empty reply, as before.
    if (!options_.parse_reasoning && !options_.parse_tool_calls && !parsed.content.has_value()) {
      message["content"] = "";
    }
    choice["message"] = std::move(message);
    choice["finish_reason"] = FinishReasonFor(e.finish_reason, !parsed.tool_calls.empty());
  } else {
    choice["text"] = text;
  }
  Json body = {{"id", response_id_},
               {"object", chat_ ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", context_->model.id},
               {"choices", Json::array({choice})},
               {"usage", Usage(e)}};
  return Dump(body);
}

}  // namespace vamp
