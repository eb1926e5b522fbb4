#include "controller/frontend/openai_api.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::json;

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
absl::Status ParseCommon(const Json& body, const ServedModel& model, ServingRequest* out) {
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
  int32_t n = 1;
  absl::Status s;
  s.Update(OptionalNumber(body, "n", 1, 1, &n));
  if (!s.ok()) return FieldError("n", "only n = 1 is supported");
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
  // Accepted by the API but not by the agents' samplers yet: refuse them here, per request,
  // rather than fail a whole batch on the agents.
  if (sp.min_tokens != 0) return FieldError("min_tokens", "is not supported yet");
  if (sp.min_p != 0) return FieldError("min_p", "is not supported yet");
  if (sp.presence_penalty != 0) return FieldError("presence_penalty", "is not supported yet");
  if (sp.frequency_penalty != 0) return FieldError("frequency_penalty", "is not supported yet");
  if (sp.repetition_penalty != 1) return FieldError("repetition_penalty", "is not supported yet");
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
  if (body.contains("stop") && !body["stop"].is_null() &&
      !(body["stop"].is_array() && body["stop"].empty())) {
    return FieldError("stop", "stop strings are not supported yet; use stop_token_ids");
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null() &&
      !(body["logprobs"].is_boolean() && !body["logprobs"].get<bool>())) {
    return FieldError("logprobs", "log probabilities are not supported");
  }
  if (body.contains("cache_salt") && !body["cache_salt"].is_null()) {
    if (!body["cache_salt"].is_string()) return FieldError("cache_salt", "must be a string");
    out->cache_salt = body["cache_salt"].get<std::string>();
  }
  return absl::OkStatus();
}

absl::Status CheckLength(ServingRequest* out, const ServedModel& model, absl::string_view field) {
  if (out->prompt_token_ids.empty()) return FieldError(field, "must not be empty");
  const int64_t prompt = static_cast<int64_t>(out->prompt_token_ids.size());
  if (prompt >= model.max_model_len) {
    return FieldError(field, absl::StrCat("is ", prompt, " tokens; the model's context is ",
                                          model.max_model_len,
                                          " tokens and at least one must be left for output"));
  }
  const int64_t room = model.max_model_len - prompt;
  if (out->sampling.max_tokens.has_value() && *out->sampling.max_tokens > room) {
    return FieldError(out->chat ? "max_tokens" : "max_tokens",
                      absl::StrCat(*out->sampling.max_tokens, " output tokens do not fit: the ",
                                   prompt, "-token prompt leaves ", room, " of ",
                                   model.max_model_len));
  }
  absl::Status v = out->sampling.Validate();
  if (!v.ok()) return FieldError("sampling", v.message());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServingRequest> ParseCompletionRequest(absl::string_view text,
                                                      const ServedModel& model,
                                                      const Tokenizer& tokenizer) {
  absl::StatusOr<Json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  ServingRequest out;
  out.sampling.max_tokens = kDefaultCompletionMaxTokens;
  absl::Status s = ParseCommon(*body, model, &out);
  if (!s.ok()) return s;
  if (!body->contains("prompt")) return FieldError("prompt", "is required");
  const Json& prompt = (*body)["prompt"];
  // A one-element batch is accepted as that element; larger batches are not (n = 1 per request).
  const Json* p = &prompt;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    p = &prompt[0];
  }
  if (p->is_string()) {
    out.prompt_token_ids = tokenizer.Encode(p->get<std::string>());
  } else if (p->is_array()) {
    for (size_t i = 0; i < p->size(); ++i) {
      if (!(*p)[i].is_number_integer()) {
        return FieldError("prompt", "must be a string or an array of token ids (one prompt)");
      }
      absl::StatusOr<int32_t> id = TokenIdFromJson((*p)[i], model, "prompt", i);
      if (!id.ok()) return id.status();
      out.prompt_token_ids.push_back(*id);
    }
  } else {
    return FieldError("prompt", "must be a string or an array of token ids");
  }
  // Text is encoded by the tokenizer; its ids are checked too.
  s = CheckTokenIds(out.prompt_token_ids, model, "prompt");
  if (!s.ok()) return s;
  if (body->contains("echo") && (*body)["echo"].is_boolean() && (*body)["echo"].get<bool>()) {
    return FieldError("echo", "echo is not supported");
  }
  s = CheckLength(&out, model, "prompt");
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<ServingRequest> ParseChatCompletionRequest(absl::string_view text,
                                                          const ServedModel& model,
                                                          const Tokenizer& tokenizer) {
  absl::StatusOr<Json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  ServingRequest out;
  out.chat = true;
  absl::Status s = ParseCommon(*body, model, &out);
  if (!s.ok()) return s;
  if (!body->contains("messages") || !(*body)["messages"].is_array() ||
      (*body)["messages"].empty()) {
    return FieldError("messages", "must be a non-empty array of {role, content}");
  }
  std::vector<ChatMessage> messages;
  int index = 0;
  for (const Json& m : (*body)["messages"]) {
    const std::string where = absl::StrCat("messages[", index++, "]");
    if (!m.is_object()) return FieldError(where, "must be an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return FieldError(where + ".role", "must be a string");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer") {
      return FieldError(where + ".role",
                        absl::StrCat("'", role,
                                     "' is not one of system, developer, user, assistant, tool"));
    }
    ChatMessage message{role, ""};
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
    messages.push_back(std::move(message));
  }
  out.prompt_token_ids = tokenizer.Encode(tokenizer.ApplyChatTemplate(messages));
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
