#include "controller/frontend/openai_api.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

// Ordered: tool definitions reach the chat template with their keys in the client's order.
using Json = nlohmann::ordered_json;

// j[key] when j is an object holding a string there, else "" (never throws).
std::string StringAt(const Json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
  s.SetPayload(kParamPayload, absl::Cord(field));
  return s;
}

// Reads an optional number field within [lo, hi]; `set` receives it.
template <typename T>
absl::Status OptionalNumber(const Json& body, const char* field, double lo, double hi,
                            T* out) {
  if (!body.contains(field) || body[field].is_null()) return absl::OkStatus();
  const Json& v = body[field];
  if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return FieldError(field, "must be an integer");
  } else {
    if (!v.is_number()) return FieldError(field, "must be a number");
  }
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return FieldError(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v.dump()));
  }
  *out = v.get<T>();
  return absl::OkStatus();
}

absl::Status OptionalBool(const Json& body, const char* field, bool* out) {
  if (!body.contains(field) || body[field].is_null()) return absl::OkStatus();
  if (!body[field].is_boolean()) return FieldError(field, "must be true or false");
  *out = body[field].get<bool>();
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseBody(absl::string_view body) {
  Json doc = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return FieldError("body", "is not valid JSON");
  if (!doc.is_object()) return FieldError("body", "must be a JSON object");
  return doc;
}

absl::Status CheckTokenIds(const std::vector<int32_t>& ids, const ServedModel& model,
                           absl::string_view field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= model.vocab_size) {
      return FieldError(field, absl::StrCat("token id ", ids[i], " at index ", i,
                                            " is outside the vocabulary [0, ", model.vocab_size,
                                            ")"));
    }
  }
  return absl::OkStatus();
}

// A token id from JSON, checked against the vocabulary before any narrowing: converted to int32
// first, 4294967301 would have become 5, an in-vocabulary id the client never sent.
absl::StatusOr<int32_t> TokenIdFromJson(const Json& id, const ServedModel& model,
                                        absl::string_view field, size_t index) {
  if (!id.is_number_integer()) {
    return FieldError(field, absl::StrCat("element ", index, " is not an integer token id"));
  }
  const bool in_vocabulary =
      id.is_number_unsigned()
          ? id.get<uint64_t>() < static_cast<uint64_t>(std::max(model.vocab_size, 0))
          : id.get<int64_t>() >= 0 && id.get<int64_t>() < model.vocab_size;
  if (!in_vocabulary) {
    return FieldError(field,
                      absl::StrCat("token id ", id.dump(), " at index ", index,
                                   " is outside the vocabulary [0, ", model.vocab_size, ")"));
  }
  return static_cast<int32_t>(id.get<int64_t>());
}

// Fields shared by both endpoints: model, sampling, stop conditions, streaming, extensions.
// Chat: logprobs (bool) and top_logprobs (0..20, needs logprobs); completions: logprobs (an
// integer 0..5, the number of alternatives). `out`: whether logprobs were asked for;
// `alternatives`: how many most likely tokens to report with each one.
absl::Status ParseLogprobs(const Json& body, bool chat, bool* out, int32_t* alternatives) {
  const bool has_logprobs = body.contains("logprobs") && !body["logprobs"].is_null();
  const bool has_top = body.contains("top_logprobs") && !body["top_logprobs"].is_null();
  *alternatives = 0;
  if (chat) {
    absl::Status s = OptionalBool(body, "logprobs", out);
    if (!s.ok()) return s;
    s = OptionalNumber(body, "top_logprobs", 0, 20, alternatives);
    if (!s.ok()) return s;
    if (has_top && !*out) return FieldError("top_logprobs", "needs logprobs = true");
    return absl::OkStatus();
  }
  if (has_top) return FieldError("top_logprobs", "is a chat field; completions use logprobs");
  absl::Status s = OptionalNumber(body, "logprobs", 0, 5, alternatives);
  if (!s.ok()) return s;
  *out = has_logprobs;
  return absl::OkStatus();
}

// stop: a string or an array of strings (null and [] mean none).
absl::Status ParseStop(const Json& body, std::vector<std::string>* out) {
  if (!body.contains("stop") || body["stop"].is_null()) return absl::OkStatus();
  const Json& stop = body["stop"];
  const Json list = stop.is_string() ? Json::array({stop}) : stop;
  if (!list.is_array()) return FieldError("stop", "must be a string or an array of strings");
  if (list.size() > static_cast<size_t>(kMaxStopStrings)) {
    return FieldError("stop", absl::StrCat("at most ", kMaxStopStrings, " stop strings, got ",
                                           list.size()));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string() || list[i].get<std::string>().empty() ||
        list[i].get<std::string>().size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return FieldError("stop", absl::StrCat("element ", i, " must be a non-empty string of at most ",
                                             kMaxStopStringBytes, " bytes"));
    }
    out->push_back(list[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseCommon(const Json& body, const ServedModel& model, const RequestLimits& limits,
                         OpenAiRequest* out) {
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) return FieldError("model", "must be a string");
    out->model = body["model"].get<std::string>();
    if (out->model != model.id) {
      absl::Status s = absl::NotFoundError(
          absl::StrCat("model: '", out->model, "' is not served here (available: '", model.id,
                       "')"));
      s.SetPayload(kParamPayload, absl::Cord("model"));
      return s;
    }
  } else {
    out->model = model.id;
  }
  SamplingParams& sp = out->sampling;
  absl::Status s = OptionalNumber(body, "n", 1, limits.max_n, &out->response.n);
  if (!s.ok()) {
    return FieldError("n", absl::StrCat("must be an integer in [1, ", limits.max_n,
                                        "] (the server's --max_n)"));
  }
  int32_t max_tokens = 0;
  const char* max_field = body.contains("max_completion_tokens") ? "max_completion_tokens"
                                                                 : "max_tokens";
  s.Update(OptionalNumber(body, max_field, 1, model.max_model_len, &max_tokens));
  if (max_tokens > 0) sp.max_tokens = max_tokens;
  s.Update(OptionalNumber(body, "temperature", 0, 2, &sp.temperature));
  s.Update(OptionalNumber(body, "top_p", 1e-9, 1, &sp.top_p));
  int32_t top_k = 0;
  s.Update(OptionalNumber(body, "top_k", -1, model.vocab_size, &top_k));
  sp.top_k = top_k < 0 ? 0 : top_k;
  s.Update(OptionalNumber(body, "min_p", 0, 1, &sp.min_p));
  s.Update(OptionalNumber(body, "presence_penalty", -2, 2, &sp.presence_penalty));
  s.Update(OptionalNumber(body, "frequency_penalty", -2, 2, &sp.frequency_penalty));
  s.Update(OptionalNumber(body, "repetition_penalty", 1e-6, 100, &sp.repetition_penalty));
  s.Update(OptionalNumber(body, "min_tokens", 0, model.max_model_len, &sp.min_tokens));
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return FieldError("seed", "must be an integer");
    sp.seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  s.Update(OptionalBool(body, "ignore_eos", &sp.ignore_eos));
  s.Update(OptionalBool(body, "stream", &out->stream));
  s.Update(OptionalNumber(body, "priority", -1000000, 1000000, &out->priority));
  if (!s.ok()) return s;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return FieldError("stream_options", "must be an object");
    if (!out->stream) return FieldError("stream_options", "is only allowed with stream = true");
    absl::Status u = OptionalBool(so, "include_usage", &out->include_usage);
    if (!u.ok()) return FieldError("stream_options.include_usage", "must be true or false");
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const Json& ids = body["stop_token_ids"];
    if (!ids.is_array()) return FieldError("stop_token_ids", "must be an array of token ids");
    for (size_t i = 0; i < ids.size(); ++i) {
      absl::StatusOr<int32_t> id = TokenIdFromJson(ids[i], model, "stop_token_ids", i);
      if (!id.ok()) return id.status();
      sp.stop_token_ids.push_back(*id);
    }
  }
  s = ParseStop(body, &out->response.stop);
  if (!s.ok()) return s;
  s = ParseLogprobs(body, out->chat, &out->response.logprobs, &sp.num_top_logprobs);
  if (!s.ok()) return s;
  out->response.num_top_logprobs = sp.num_top_logprobs;
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
    return FieldError("logit_bias", "is not supported");
  }
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const Json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || rf["type"] != "text") {
      return FieldError("response_format",
                        "only {\"type\": \"text\"} is supported (no structured output)");
    }
  }
  for (const char* field : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                            "structured_outputs", "functions", "function_call", "chat_template",
                            "documents"}) {
    if (body.contains(field) && !body[field].is_null()) {
      return FieldError(field, "is not supported");
    }
  }
  if (body.contains("cache_salt") && !body["cache_salt"].is_null()) {
    if (!body["cache_salt"].is_string()) return FieldError("cache_salt", "must be a string");
    out->cache_salt = body["cache_salt"].get<std::string>();
  }
  return absl::OkStatus();
}

// Every prompt leaves room for output (and for max_tokens of it). `field` names the prompt in
// errors; a batch's elements are named by their index.
absl::Status CheckLength(OpenAiRequest* out, const ServedModel& model, absl::string_view field) {
  for (size_t i = 0; i < out->prompts.size(); ++i) {
    const std::string which =
        out->prompts.size() > 1 ? absl::StrCat("element ", i, " ") : std::string();
    if (out->prompts[i].empty()) return FieldError(field, which + "must not be empty");
    const int64_t prompt = static_cast<int64_t>(out->prompts[i].size());
    if (prompt >= model.max_model_len) {
      return FieldError(field, absl::StrCat(which, "is ", prompt,
                                            " tokens; the model's context is ", model.max_model_len,
                                            " tokens and at least one must be left for output"));
    }
    const int64_t room = model.max_model_len - prompt;
    if (out->sampling.max_tokens.has_value() && *out->sampling.max_tokens > room) {
      return FieldError(
          "max_tokens",
          absl::StrCat(*out->sampling.max_tokens, " output tokens do not fit: the ", prompt,
                       "-token prompt",
                       out->prompts.size() > 1 ? absl::StrCat(" (element ", i, ")") : "",
                       " leaves ", room, " of ", model.max_model_len));
    }
  }
  // Validate names the field as "sampling_params.<field>: ..."; the client knows it as <field>.
  absl::Status v = out->sampling.Validate();
  if (!v.ok()) {
    absl::string_view message = v.message();
    absl::ConsumePrefix(&message, "sampling_params.");
    const size_t colon = message.find(':');
    return FieldError(message.substr(0, colon),
                      colon == absl::string_view::npos ? message : message.substr(colon + 2));
  }
  return absl::OkStatus();
}

// One chat message: role, content (a string or text parts; null only for an assistant), name,
// tool_call_id (tool), tool_calls and reasoning_content (assistant).
absl::StatusOr<ChatMessage> ParseMessage(const Json& m, const std::string& where) {
  if (!m.is_object()) return FieldError(where, "must be an object");
  if (!m.contains("role") || !m["role"].is_string()) {
    return FieldError(where + ".role", "must be a string");
  }
  ChatMessage message;
  message.role = m["role"].get<std::string>();
  const std::string& role = message.role;
  if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
      role != "developer") {
    return FieldError(where + ".role",
                      absl::StrCat("'", role,
                                   "' is not one of system, developer, user, assistant, tool"));
  }
  const Json* content = m.contains("content") ? &m["content"] : nullptr;
  if (content == nullptr || content->is_null()) {
    if (role != "assistant") return FieldError(where + ".content", "is required");
  } else if (content->is_string()) {
    message.content = content->get<std::string>();
  } else if (content->is_array()) {
    for (const Json& part : *content) {
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
          !part.contains("text") || !part["text"].is_string()) {
        return FieldError(where + ".content", "parts must be {\"type\": \"text\", \"text\": ...}");
      }
      message.content += part["text"].get<std::string>();
    }
  } else {
    return FieldError(where + ".content", "must be a string or an array of text parts");
  }
  auto optional_string = [&](const char* field,
                             std::optional<std::string>* out) -> absl::Status {
    if (!m.contains(field) || m[field].is_null()) return absl::OkStatus();
    if (!m[field].is_string()) return FieldError(absl::StrCat(where, ".", field), "must be a string");
    *out = m[field].get<std::string>();
    return absl::OkStatus();
  };
  absl::Status s = optional_string("name", &message.name);
  if (s.ok()) s = optional_string("tool_call_id", &message.tool_call_id);
  if (s.ok()) s = optional_string("reasoning_content", &message.reasoning_content);
  if (s.ok() && !message.reasoning_content.has_value()) {
    s = optional_string("reasoning", &message.reasoning_content);
  }
  if (!s.ok()) return s;
  if (message.reasoning_content.has_value() && role != "assistant") {
    return FieldError(where + ".reasoning_content", "is only allowed on assistant messages");
  }
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const Json& calls = m["tool_calls"];
    if (role != "assistant") return FieldError(where + ".tool_calls", "is only allowed on assistant messages");
    if (!calls.is_array()) return FieldError(where + ".tool_calls", "must be an array");
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string at = absl::StrCat(where, ".tool_calls[", i, "]");
      const Json& c = calls[i];
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
        return FieldError(at + ".function", "must be an object {name, arguments}");
      }
      if (c.contains("type") && c["type"] != "function") {
        return FieldError(at + ".type", "must be \"function\"");
      }
      const Json& f = c["function"];
      ToolCall call;
      if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
      if (!f.contains("name") || !f["name"].is_string()) {
        return FieldError(at + ".function.name", "must be a string");
      }
      call.name = f["name"].get<std::string>();
      if (!f.contains("arguments") || f["arguments"].is_null()) {
        call.arguments = "{}";
      } else if (f["arguments"].is_string()) {
        call.arguments = f["arguments"].get<std::string>();
      } else if (f["arguments"].is_object()) {
        call.arguments = f["arguments"].dump();
      } else {
        return FieldError(at + ".function.arguments", "must be a JSON string");
      }
      message.tool_calls.push_back(std::move(call));
    }
  }
  return message;
}

// tools, tool_choice and parallel_tool_calls: the tools go to the template; the choice decides
// whether the output is parsed for calls and whether the reply is opened with one.
absl::Status ParseTools(const Json& body, const Tokenizer& tokenizer, ChatTemplateInput* input,
                        ResponseOptions* response) {
  Json tools = Json::array();
  std::vector<std::string> names;
  if (body.contains("tools") && !body["tools"].is_null()) {
    const Json& t = body["tools"];
    if (!t.is_array()) return FieldError("tools", "must be an array");
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string at = absl::StrCat("tools[", i, "]");
      if (StringAt(t[i], "type") != "function") {
        return FieldError(at + ".type", "must be \"function\"");
      }
      if (!t[i].contains("function") || !t[i]["function"].is_object()) {
        return FieldError(at + ".function", "must be an object");
      }
      const Json& f = t[i]["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
        return FieldError(at + ".function.name", "must be a non-empty string");
      }
      // The definition as vLLM hands it to templates: type, then function {name, description,
      // parameters} (whichever are given; other keys are not part of the template's input).
      Json fn = Json::object();
      fn["name"] = f["name"];
      if (f.contains("description") && !f["description"].is_null()) {
        if (!f["description"].is_string()) return FieldError(at + ".function.description", "must be a string");
        fn["description"] = f["description"];
      }
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) return FieldError(at + ".function.parameters", "must be an object");
        fn["parameters"] = f["parameters"];
      }
      names.push_back(f["name"].get<std::string>());
      Json tool = Json::object();
      tool["type"] = "function";
      tool["function"] = std::move(fn);
      tools.push_back(std::move(tool));
    }
  }
  std::string choice = tools.empty() ? "none" : "auto";
  std::string forced_name;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& c = body["tool_choice"];
    if (c.is_string()) {
      choice = c.get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        return FieldError("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
    } else if (StringAt(c, "type") == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
      choice = "named";
      forced_name = c["function"]["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), forced_name) == names.end()) {
        return FieldError("tool_choice.function.name",
                          absl::StrCat("'", forced_name, "' is not one of the tools"));
      }
    } else {
      return FieldError("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (choice != "none" && tools.empty()) {
      return FieldError("tool_choice", absl::StrCat("'", choice, "' needs a non-empty tools list"));
    }
  }
  absl::Status s = OptionalBool(body, "parallel_tool_calls", &response->parallel_tool_calls);
  if (!s.ok()) return s;
  if (!tools.empty()) input->tools_json = tools.dump();
  if (choice == "none") return absl::OkStatus();
  if (!tokenizer.has_tool_call_tags()) {
    return FieldError("tools", "this model's tokenizer has no tool-call format (<tool_call> tokens); "
                               "send tool_choice \"none\" or no tools");
  }
  response->parse_tool_calls = true;
  if (choice == "required") response->assistant_prefix = "<tool_call>\n";
  if (choice == "named") {
    response->assistant_prefix =
        absl::StrCat("<tool_call>\n{\"name\": ", Json(forced_name).dump(), ", \"arguments\": ");
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(absl::string_view text,
                                                      const ServedModel& model,
                                                      const Tokenizer& tokenizer,
                                                      const RequestLimits& limits) {
  absl::StatusOr<Json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  OpenAiRequest out;
  out.sampling.max_tokens = kDefaultCompletionMaxTokens;
  absl::Status s = ParseCommon(*body, model, limits, &out);
  if (!s.ok()) return s;
  if (!body->contains("prompt")) return FieldError("prompt", "is required");
  const Json& prompt = (*body)["prompt"];
  // One prompt (a string, or token ids), or a batch (strings, or token-id arrays); the element
  // kind is the first element's.
  std::vector<const Json*> elements;
  const bool batch =
      prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array());
  if (batch) {
    if (prompt.size() > static_cast<size_t>(limits.max_batch_prompts)) {
      return FieldError("prompt", absl::StrCat("a batch of at most ", limits.max_batch_prompts,
                                               " prompts (the server's --max_batch_prompts), got ",
                                               prompt.size()));
    }
    for (const Json& p : prompt) elements.push_back(&p);
  } else if (prompt.is_string() || prompt.is_array()) {
    elements.push_back(&prompt);
  } else {
    return FieldError("prompt",
                      "must be a string, an array of token ids, or an array of strings "
                      "or of token-id arrays");
  }
  const bool strings = elements.front()->is_string();
  for (size_t e = 0; e < elements.size(); ++e) {
    const Json& p = *elements[e];
    const std::string which = batch ? absl::StrCat("element ", e, " ") : std::string();
    // A token-id batch element must be an array itself: [[1, 2], 3] is refused here, not indexed.
    if (strings ? !p.is_string() : !p.is_array()) {
      return FieldError("prompt",
                        absl::StrCat(which, "must be a ", strings ? "string" : "token-id array",
                                     " like element 0 (a batch holds one kind)"));
    }
    std::vector<int32_t>& ids = out.prompts.emplace_back();
    if (p.is_string()) {
      ids = tokenizer.Encode(p.get<std::string>());
      // Text is encoded by the tokenizer; its ids are checked too.
      s = CheckTokenIds(ids, model, "prompt");
      if (!s.ok()) return s;
      continue;
    }
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer()) {
        return FieldError("prompt", absl::StrCat(which, batch ? "must be an array of token ids"
                                                              : "must be a string or an array of "
                                                                "token ids, or a batch of them"));
      }
      absl::StatusOr<int32_t> id = TokenIdFromJson(p[i], model, "prompt", i);
      if (!id.ok()) {
        return batch ? FieldError("prompt", absl::StrCat(which, id.status().message().substr(
                                                                    sizeof("prompt: ") - 1)))
                     : id.status();
      }
      ids.push_back(*id);
    }
  }
  const int64_t choices = static_cast<int64_t>(out.prompts.size()) * out.response.n;
  if (choices > limits.max_batch_prompts) {
    return FieldError("n", absl::StrCat(out.prompts.size(), " prompts x n ", out.response.n, " = ",
                                        choices, " choices exceed the ", limits.max_batch_prompts,
                                        " one request may start (the server's "
                                        "--max_batch_prompts)"));
  }
  out.response.num_prompts = static_cast<int32_t>(out.prompts.size());
  bool echo = false;
  s = OptionalBool(*body, "echo", &echo);
  if (!s.ok()) return s;
  if (echo && out.response.logprobs) {
    if (!model.prompt_logprobs) {
      return FieldError("echo",
                        "echo with logprobs needs the prompt's log-probabilities, which "
                        "this deployment's agents cannot compute (CUDA agents do not yet); "
                        "drop echo or logprobs");
    }
    out.response.echo_token_ids = out.prompts;
  }
  // Each prompt as text: a text prompt as given, token ids decoded.
  if (echo) {
    for (size_t e = 0; e < elements.size(); ++e) {
      out.response.echo.push_back(elements[e]->is_string() ? elements[e]->get<std::string>()
                                                           : tokenizer.Decode(out.prompts[e]));
    }
  }
  s = CheckLength(&out, model, "prompt");
  if (!s.ok()) return s;
  out.response.include_usage = out.include_usage;
  return out;
}

absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(absl::string_view text,
                                                          const ServedModel& model,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits) {
  absl::StatusOr<Json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  OpenAiRequest out;
  out.chat = true;
  absl::Status s = ParseCommon(*body, model, limits, &out);
  if (!s.ok()) return s;
  if (!body->contains("messages") || !(*body)["messages"].is_array() ||
      (*body)["messages"].empty()) {
    return FieldError("messages", "must be a non-empty array of {role, content}");
  }
  ChatTemplateInput input;
  int index = 0;
  for (const Json& m : (*body)["messages"]) {
    absl::StatusOr<ChatMessage> message = ParseMessage(m, absl::StrCat("messages[", index++, "]"));
    if (!message.ok()) return message.status();
    input.messages.push_back(*std::move(message));
  }
  s = ParseTools(*body, tokenizer, &input, &out.response);
  if (!s.ok()) return s;
  s = OptionalBool(*body, "add_generation_prompt", &input.add_generation_prompt);
  if (!s.ok()) return s;
  bool continue_final = false;
  s = OptionalBool(*body, "continue_final_message", &continue_final);
  if (!s.ok()) return s;
  if (continue_final) return FieldError("continue_final_message", "is not supported");
  if (body->contains("chat_template_kwargs") && !(*body)["chat_template_kwargs"].is_null()) {
    const Json& kw = (*body)["chat_template_kwargs"];
    if (!kw.is_object()) return FieldError("chat_template_kwargs", "must be an object");
    input.kwargs_json = kw.dump();
  }
  absl::StatusOr<std::string> prompt = tokenizer.ApplyChatTemplate(input);
  if (!prompt.ok()) {
    // The tokenizer names the field where it can ("tools: ...", "chat_template_kwargs.x: ...");
    // anything else (the template's raise_exception, a render error) is about the conversation.
    const std::string message(prompt.status().message());
    for (const char* field : {"tools", "chat_template_kwargs", "messages"}) {
      if (absl::StartsWith(message, field)) {
        const size_t end = message.find_first_of(": ");
        absl::Status e = absl::InvalidArgumentError(message);
        e.SetPayload(kParamPayload, absl::Cord(message.substr(0, end)));
        return e;
      }
    }
    return FieldError("messages", message);
  }
  out.response.chat = true;
  out.response.include_usage = out.include_usage;
  out.response.parse_reasoning = tokenizer.has_think_tags();
  if (out.response.parse_reasoning) {
    const size_t open = prompt->rfind("<think>");
    const size_t close = prompt->rfind("</think>");
    out.response.reasoning_open =
        open != std::string::npos && (close == std::string::npos || close < open);
  }
  out.prompts.push_back(tokenizer.Encode(*prompt + out.response.assistant_prefix));
  s = CheckLength(&out, model, "messages");
  if (!s.ok()) return s;
  return out;
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorBody(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  Json error = {{"message", std::string(status.message())},
                {"type", http == 404   ? "not_found_error"
                         : http < 500  ? "invalid_request_error"
                                       : "server_error"},
                {"code", http}};
  absl::optional<absl::Cord> param = status.GetPayload(kParamPayload);
  error["param"] = param.has_value() ? Json(std::string(*param)) : Json(nullptr);
  return Json({{"error", error}}).dump();
}

}  // namespace vamp
