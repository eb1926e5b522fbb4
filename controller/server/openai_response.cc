#include "controller/server/openai_response.h"

#include <algorithm>
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

OpenAiResponseWriter::Choice::Choice(const ServingContext& context, const ResponseOptions& options,
                                     int prompt)
    : prompt(prompt), decoder(context.tokenizer.get()), stop(options.stop), parser(options) {}

OpenAiResponseWriter::OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                                           const ResponseOptions& options, RequestId request_id,
                                           int64_t created)
    : context_(std::move(context)),
      options_(options),
      chat_(options.chat),
      include_usage_(options.include_usage),
      response_id_(absl::StrCat(options.chat ? "chatcmpl-" : "cmpl-", request_id)),
      created_(created) {
  const int n = std::max(options.n, 1);
  const int prompts = std::max(options.num_prompts, 1);
  choices_.reserve(static_cast<size_t>(prompts) * n);
  for (int i = 0; i < prompts * n; ++i) choices_.emplace_back(*context_, options_, i / n);
  prompt_tokens_.assign(prompts, 0);
  cached_prompt_tokens_.assign(prompts, 0);
}

const std::string& OpenAiResponseWriter::Echo(const Choice& c) const {
  static const std::string kNone;
  return c.prompt < static_cast<int>(options_.echo.size()) ? options_.echo[c.prompt] : kNone;
}

OpenAiResponseWriter::OpenAiResponseWriter(std::shared_ptr<const ServingContext> context,
                                           bool chat, bool include_usage, RequestId request_id,
                                           int64_t created)
    : OpenAiResponseWriter(context, DefaultOptions(*context, chat, include_usage), request_id,
                           created) {}

std::string OpenAiResponseWriter::Consume(Choice& c, const EngineEvent& e) {
  c.tokens.insert(c.tokens.end(), e.token_ids.begin(), e.token_ids.end());
  if (HasLogprobs(e)) {
    c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    c.top_token_ids.insert(c.top_token_ids.end(), e.top_token_ids.begin(), e.top_token_ids.end());
    c.top_logprobs.insert(c.top_logprobs.end(), e.top_logprobs.begin(), e.top_logprobs.end());
  } else {
    c.logprobs_complete = false;
  }
  if (e.has_prompt_logprobs) {
    c.has_prompt_logprobs = true;
    c.prompt_logprobs = e.prompt_logprobs;
    c.prompt_top_token_ids = e.prompt_top_token_ids;
    c.prompt_top_logprobs = e.prompt_top_logprobs;
  }
  c.completion_tokens = e.completion_tokens;
  prompt_tokens_[c.prompt] = e.prompt_tokens;
  cached_prompt_tokens_[c.prompt] =
      std::max(cached_prompt_tokens_[c.prompt], e.cached_prompt_tokens);
  std::string decoded = c.decoder.Next(e.token_ids);
  if (e.finished) decoded += c.decoder.Finish();
  std::string text = c.stop.Next(decoded);
  if (c.stop.matched()) {
    c.finish_reason = FinishReason::kStop;
  } else if (e.finished) {
    text += c.stop.Finish();
    c.finish_reason = e.finish_reason;
    c.error = e.error;
  }
  if (c.stop.matched() || e.finished) {
    c.done = true;
    ++num_done_;
  }
  return text;
}

Json OpenAiResponseWriter::Usage() const {
  int32_t completion = 0, prompt = 0, cached = 0;
  for (const Choice& c : choices_) completion += c.completion_tokens;
  for (int32_t p : prompt_tokens_) prompt += p;
  for (int32_t p : cached_prompt_tokens_) cached += p;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

bool OpenAiResponseWriter::HasLogprobs(const EngineEvent& e) const {
  const size_t k = static_cast<size_t>(options_.num_top_logprobs);
  return e.logprobs.size() == e.token_ids.size() &&
         e.top_token_ids.size() == e.token_ids.size() * k &&
         e.top_logprobs.size() == e.token_ids.size() * k;
}

Json OpenAiResponseWriter::LogprobsJson(const std::vector<int32_t>& tokens,
                                        const std::vector<float>& logprobs,
                                        const std::vector<int32_t>& top_token_ids,
                                        const std::vector<float>& top_logprobs,
                                        int64_t* text_offset) const {
  const size_t k = static_cast<size_t>(options_.num_top_logprobs);
  if (logprobs.size() != tokens.size() || top_token_ids.size() != tokens.size() * k ||
      top_logprobs.size() != tokens.size() * k) {
    return nullptr;
  }
  auto token_text = [&](int32_t token) {
    std::string text;
    context_->tokenizer->AppendTokenBytes(token, /*skip_special_tokens=*/false, &text);
    return text;
  };
  // Chat's {token, logprob, bytes} entry.
  auto chat_entry = [](const std::string& text, float logprob) {
    Json bytes = Json::array();
    for (unsigned char b : text) bytes.push_back(b);
    return Json{{"token", text}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
  };
  Json content = Json::array();
  Json strings = Json::array(), values = Json::array(), tops = Json::array(),
       offsets = Json::array();
  int64_t& offset = *text_offset;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string text = token_text(tokens[i]);
    if (chat_) {
      Json alternatives = Json::array();
      for (size_t j = i * k; j < (i + 1) * k; ++j) {
        alternatives.push_back(chat_entry(token_text(top_token_ids[j]), top_logprobs[j]));
      }
      Json entry = chat_entry(text, logprobs[i]);
      entry["top_logprobs"] = std::move(alternatives);
      content.push_back(std::move(entry));
      continue;
    }
    strings.push_back(text);
    values.push_back(logprobs[i]);
    // The legacy map: the chosen token and the k most likely (vLLM's shape; tokens whose strings
    // coincide keep the first entry, the chosen one's or the more likely one's).
    Json top = {{text, logprobs[i]}};
    for (size_t j = i * k; j < (i + 1) * k; ++j) {
      top.emplace(token_text(top_token_ids[j]), top_logprobs[j]);
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
  if (chat_) return {{"content", std::move(content)}};
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

Json OpenAiResponseWriter::PromptLogprobsJson(const Choice& c, int64_t* text_offset) const {
  const std::vector<int32_t>& ids = options_.echo_token_ids[c.prompt];
  const size_t k = static_cast<size_t>(options_.num_top_logprobs);
  const size_t scored = ids.empty() ? 0 : ids.size() - 1;
  if (!c.has_prompt_logprobs || c.prompt_logprobs.size() != scored ||
      c.prompt_top_token_ids.size() != scored * k || c.prompt_top_logprobs.size() != scored * k) {
    return nullptr;
  }
  Json strings = Json::array(), values = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string text;
    context_->tokenizer->AppendTokenBytes(ids[i], /*skip_special_tokens=*/false, &text);
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(text.size());
    if (i == 0) {  // nothing precedes the first token: OpenAI's and vLLM's null
      values.push_back(nullptr);
      tops.push_back(nullptr);
      strings.push_back(std::move(text));
      continue;
    }
    const float logprob = c.prompt_logprobs[i - 1];
    Json top = {{text, logprob}};
    for (size_t j = (i - 1) * k; j < i * k; ++j) {
      std::string alternative;
      context_->tokenizer->AppendTokenBytes(c.prompt_top_token_ids[j], false, &alternative);
      top.emplace(alternative, c.prompt_top_logprobs[j]);
    }
    values.push_back(logprob);
    tops.push_back(std::move(top));
    strings.push_back(std::move(text));
  }
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

Json OpenAiResponseWriter::ChoiceLogprobs(const Choice& c, bool with_prompt,
                                          const std::vector<int32_t>& tokens,
                                          const std::vector<float>& logprobs,
                                          const std::vector<int32_t>& top_token_ids,
                                          const std::vector<float>& top_logprobs,
                                          int64_t* text_offset) const {
  if (!with_prompt) return LogprobsJson(tokens, logprobs, top_token_ids, top_logprobs, text_offset);
  Json prompt = PromptLogprobsJson(c, text_offset);
  Json output = LogprobsJson(tokens, logprobs, top_token_ids, top_logprobs, text_offset);
  if (prompt.is_null() || output.is_null()) return nullptr;
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (Json& v : output[key]) prompt[key].push_back(std::move(v));
  }
  return prompt;
}

std::string OpenAiResponseWriter::StreamChunk(int index, const EngineEvent& e) {
  Choice& c = choices_[index];
  if (c.done) return "";
  const bool first_chunk = !std::exchange(c.streamed, true);
  std::string text = Consume(c, e);
  const char* object = chat_ ? "chat.completion.chunk" : "text_completion";
  Json chunk = {{"id", response_id_},
                {"created", created_},
                {"model", context_->model.id},
                {"object", object}};
  Json choice = {{"index", index}, {"finish_reason", nullptr}, {"token_ids", e.token_ids}};
  if (chat_) {
    ChatDelta d = c.parser.Next(text);
    if (c.done) {
      ChatDelta rest = c.parser.Finish();
      d.reasoning_content += rest.reasoning_content;
      d.content += rest.content;
      for (ChatDelta::Call& call : rest.tool_calls) {
        // One piece per call in a chunk: a call whose first piece came from Next continues it.
        if (!d.tool_calls.empty() && d.tool_calls.back().index == call.index) {
          d.tool_calls.back().call.arguments += call.call.arguments;
        } else {
          d.tool_calls.push_back(std::move(call));
        }
      }
    }
    Json delta = Json::object();
    if (first_chunk) delta["role"] = "assistant";
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    // Plain chat keeps a content field in every chunk, as before (possibly "").
    if (!d.content.empty() || (d.reasoning_content.empty() && d.tool_calls.empty())) {
      delta["content"] = d.content;
    }
    if (!d.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ChatDelta::Call& call : d.tool_calls) {
        // A call's first piece names it; later pieces add to its arguments (OpenAI's shape).
        Json j = call.call.id.empty()
                     ? Json{{"function", {{"arguments", call.call.arguments}}}}
                     : ToolCallJson(call.call);
        j["index"] = call.index;
        calls.push_back(std::move(j));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
    choice["finish_reason"] = FinishReasonFor(c.finish_reason, c.parser.called_tools());
  } else {
    choice["text"] = first_chunk ? Echo(c) + text : text;
    choice["finish_reason"] = FinishReasonJson(c.finish_reason);
  }
  if (options_.logprobs) {
    // Offsets into the choice's whole text (the echoed prompt's tokens come first, in the first
    // chunk), across chunks.
    const bool with_prompt = !chat_ && first_chunk && !options_.echo_token_ids.empty();
    choice["logprobs"] = ChoiceLogprobs(c, with_prompt, e.token_ids, e.logprobs, e.top_token_ids,
                                        e.top_logprobs, &c.text_offset);
  }
  if (!e.error.empty()) choice["error"] = e.error;
  chunk["choices"] = Json::array({choice});
  std::string out = absl::StrCat("data: ", Dump(chunk), "\n\n");
  if (!done()) return out;
  if (include_usage_) {
    Json usage = {{"id", response_id_},
                  {"created", created_},
                  {"model", context_->model.id},
                  {"object", object},
                  {"choices", Json::array()},
                  {"usage", Usage()}};
    absl::StrAppend(&out, "data: ", Dump(usage), "\n\n");
  }
  absl::StrAppend(&out, "data: [DONE]\n\n");
  return out;
}

void OpenAiResponseWriter::Append(int index, const EngineEvent& e) {
  Choice& c = choices_[index];
  if (!c.done) c.text += Consume(c, e);
}

absl::StatusOr<std::string> OpenAiResponseWriter::Finish() const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    if (!c.error.empty()) {
      return absl::UnavailableError(absl::StrCat("request failed: ", c.error));
    }
    int64_t offset = 0;
    const bool with_prompt = !chat_ && !options_.echo_token_ids.empty();
    Json choice = {{"index", i},
                   {"finish_reason", FinishReasonJson(c.finish_reason)},
                   {"token_ids", c.tokens},
                   {"logprobs", options_.logprobs && c.logprobs_complete
                                    ? ChoiceLogprobs(c, with_prompt, c.tokens, c.logprobs,
                                                     c.top_token_ids, c.top_logprobs, &offset)
                                    : Json(nullptr)}};
    if (chat_) {
      const ChatOutput parsed = ParseChatOutput(c.text, options_);
      Json message = {{"role", "assistant"}};
      message["content"] = parsed.content.has_value() ? Json(*parsed.content) : Json(nullptr);
      if (parsed.reasoning_content.has_value()) {
        message["reasoning_content"] = *parsed.reasoning_content;
      }
      if (!parsed.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ToolCall& call : parsed.tool_calls) calls.push_back(ToolCallJson(call));
        message["tool_calls"] = std::move(calls);
      }
      // Plain chat (no parsing asked for) keeps "content": "" for an empty reply, as before.
      if (!options_.parse_reasoning && !options_.parse_tool_calls && !parsed.content.has_value()) {
        message["content"] = "";
      }
      choice["message"] = std::move(message);
      choice["finish_reason"] = FinishReasonFor(c.finish_reason, !parsed.tool_calls.empty());
    } else {
      choice["text"] = Echo(c) + c.text;
    }
    choices.push_back(std::move(choice));
  }
  Json body = {{"id", response_id_},
               {"object", chat_ ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", context_->model.id},
               {"choices", std::move(choices)},
               {"usage", Usage()}};
  return Dump(body);
}

}  // namespace vamp
