#include "bench/vamp_bench/protocol.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {

using Json = nlohmann::json;

void SseParser::Feed(absl::string_view bytes, const EventCallback& on_event) {
  buffer_.append(bytes.data(), bytes.size());
  size_t begin = 0;
  while (true) {
    const size_t nl = buffer_.find('\n', begin);
    if (nl == std::string::npos) break;
    absl::string_view line(buffer_.data() + begin, nl - begin);
    begin = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (has_data_) on_event(data_);
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.front() == ':') continue;  // comment
    absl::string_view field = line, value;
    if (const size_t colon = line.find(':'); colon != absl::string_view::npos) {
      field = line.substr(0, colon);
      value = line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field != "data") continue;
    if (has_data_) data_.push_back('\n');
    data_.append(value.data(), value.size());
    has_data_ = true;
  }
  buffer_.erase(0, begin);
}

absl::StatusOr<CompletionChunk> ParseCompletionChunk(absl::string_view data) {
  CompletionChunk c;
  if (absl::StripAsciiWhitespace(data) == "[DONE]") {
    c.done = true;
    return c;
  }
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion stream event ", why, ": '", data.substr(0, 120), "'"));
  };
  Json j = Json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("is not a JSON object");
  if (j.contains("error")) {
    const Json& e = j["error"];
    c.error = e.is_object() && e.contains("message") && e["message"].is_string()
                  ? e["message"].get<std::string>()
                  : e.dump();
    return c;
  }
  if (j.contains("choices")) {
    if (!j["choices"].is_array()) return bad("has non-array 'choices'");
    for (const Json& choice : j["choices"]) {
      if (!choice.is_object()) return bad("has a non-object choice");
      if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
        for (const Json& t : choice["token_ids"]) {
          if (!t.is_number_integer()) return bad("has a non-integer token id");
          c.token_ids.push_back(t.get<int32_t>());
        }
      }
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        c.finish_reason = choice["finish_reason"].get<std::string>();
      }
      if (choice.contains("error") && choice["error"].is_string()) {
        c.error = choice["error"].get<std::string>();
      }
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const Json& u = j["usage"];
    c.has_usage = true;
    c.prompt_tokens = u.value("prompt_tokens", int64_t{0});
    c.completion_tokens = u.value("completion_tokens", int64_t{0});
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      c.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{-1});
    }
  }
  return c;
}

std::string CompletionRequestBody(const std::vector<int32_t>& prompt, int32_t max_tokens,
                                  const std::string& model) {
  std::string body = "{";
  if (!model.empty()) absl::StrAppend(&body, "\"model\":", Json(model).dump(), ",");
  body += "\"prompt\":[";
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i > 0) body.push_back(',');
    absl::StrAppend(&body, prompt[i]);
  }
  absl::StrAppend(&body, "],\"max_tokens\":", max_tokens,
                  ",\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                  "\"stream_options\":{\"include_usage\":true}}");
  return body;
}

namespace {

bool ParseDouble(absl::string_view s, double* out) {
  if (s == "NaN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (s == "+Inf" || s == "Inf") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-Inf") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  return absl::SimpleAtod(s, out);
}

}  // namespace

absl::StatusOr<std::vector<PromSample>> ParsePrometheusText(absl::string_view text) {
  std::vector<PromSample> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line ", line_number, " ", why, ": '", line.substr(0, 120), "'"));
    };
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ' && line[i] != '\t') ++i;
    s.name = std::string(line.substr(0, i));
    if (s.name.empty()) return bad("has no metric name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        const size_t eq = line.find('=', i);
        if (eq == absl::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          return bad("has a malformed label");
        }
        std::string key(absl::StripAsciiWhitespace(line.substr(i, eq - i)));
        std::string value;
        size_t j = eq + 2;
        bool closed = false;
        for (; j < line.size(); ++j) {
          const char ch = line[j];
          if (ch == '\\' && j + 1 < line.size()) {
            const char n = line[++j];
            value.push_back(n == 'n' ? '\n' : n);
          } else if (ch == '"') {
            closed = true;
            break;
          } else {
            value.push_back(ch);
          }
        }
        if (!closed) return bad("has an unterminated label value");
        s.labels[key] = std::move(value);
        i = j + 1;
      }
    }
    absl::string_view rest = absl::StripAsciiWhitespace(line.substr(i));
    const size_t space = rest.find_first_of(" \t");
    absl::string_view value = space == absl::string_view::npos ? rest : rest.substr(0, space);
    if (!ParseDouble(value, &s.value)) return bad("has no numeric value");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace vamp::bench
