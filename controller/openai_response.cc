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

OpenAiResponseWriter::OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                                           bool chat, bool include_usage, RequestId request_id,
                                           int64_t created)
    : context_(std::move(context)),
      chat_(chat),
      include_usage_(include_usage),
      response_id_(absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_id)),
      created_(created) {}

std::string OpenAiResponseWriter::StreamChunk(const EngineEvent& e) {
  const char* object = chat_ ? "chat.completion.chunk" : "text_completion";
  Json chunk = {{"id", response_id_},
                {"created", created_},
                {"model", context_->model.id},
                {"object", object}};
  const std::string text = context_->tokenizer->Decode(e.token_ids);
  Json choice = {{"index", 0},
                 {"finish_reason", FinishReasonJson(e.finish_reason)},
                 {"token_ids", e.token_ids}};
  if (chat_) {
    Json delta = {{"content", text}};
    if (first_chunk_) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
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
    choice["message"] = {{"role", "assistant"}, {"content", text}};
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
