#include "controller/frontend/chat_output.h"

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kCallOpen = "<tool_call>";
constexpr absl::string_view kCallClose = "</tool_call>";

// A tool-call block's JSON -> the call, or nullopt when it is not {"name": str, "arguments": …}.
std::optional<ToolCall> ParseCall(absl::string_view body) {
  const Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() ||
      !j.contains("arguments")) {
    return std::nullopt;
  }
  ToolCall call;
  call.id = NewToolCallId();
  call.name = j["name"].get<std::string>();
  call.arguments = j["arguments"].dump(-1, ' ', false, Json::error_handler_t::replace);
  return call;
}

// How many trailing bytes of `s` could begin `tag` (held back until the next text decides).
size_t PartialTagSuffix(absl::string_view s, absl::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::string NewToolCallId() {
  static absl::Mutex* mu = new absl::Mutex();
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(mu);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back("0123456789abcdef"[absl::Uniform(*gen, 0, 16)]);
  return id;
}

ChatOutput ParseChatOutput(absl::string_view generated, const ResponseOptions& options) {
  const std::string full =
      absl::StrCat(options.parse_reasoning && options.reasoning_open ? kThinkOpen : "",
                   options.assistant_prefix, generated);
  absl::string_view text = full;
  ChatOutput out;
  if (options.parse_reasoning && text.find(kThinkOpen) != absl::string_view::npos &&
      text.find(kThinkClose) != absl::string_view::npos) {
    const size_t open = text.find(kThinkOpen);
    absl::string_view rest = text.substr(open + kThinkOpen.size());
    const size_t close = rest.find(kThinkClose);
    if (close != absl::string_view::npos) {
      out.reasoning_content = std::string(rest.substr(0, close));
      text = rest.substr(close + kThinkClose.size());
    } else {
      text = rest;
    }
  }
  if (options.parse_tool_calls && text.find(kCallOpen) != absl::string_view::npos) {
    std::vector<ToolCall> calls;
    bool ok = true;
    size_t pos = text.find(kCallOpen);
    const size_t first = pos;
    while (pos != absl::string_view::npos) {
      const size_t body = pos + kCallOpen.size();
      const size_t close = text.find(kCallClose, body);
      const absl::string_view json = text.substr(
          body, close == absl::string_view::npos ? absl::string_view::npos : close - body);
      std::optional<ToolCall> call = ParseCall(json);
      if (!call.has_value()) {
        ok = false;
        break;
      }
      calls.push_back(*std::move(call));
      if (close == absl::string_view::npos) break;
      pos = text.find(kCallOpen, close + kCallClose.size());
    }
    if (ok && !calls.empty()) {
      if (!options.parallel_tool_calls) calls.resize(1);
      out.tool_calls = std::move(calls);
      if (first > 0) out.content = std::string(text.substr(0, first));
      return out;
    }
  }
  if (!text.empty()) out.content = std::string(text);
  return out;
}

ChatStreamParser::ChatStreamParser(const ResponseOptions& options)
    : options_(options), mode_(options.parse_reasoning ? Mode::kStart : Mode::kContent) {
  ChatDelta ignored;
  buffer_ = absl::StrCat(options_.parse_reasoning && options_.reasoning_open ? kThinkOpen : "",
                         options_.assistant_prefix);
  Drain(false, &ignored);  // the prefix (an opened tool call) is not sent as text
}

ChatDelta ChatStreamParser::Next(absl::string_view text) {
  ChatDelta out;
  buffer_.append(text.data(), text.size());
  Drain(false, &out);
  return out;
}

ChatDelta ChatStreamParser::Finish() {
  ChatDelta out;
  Drain(true, &out);
  return out;
}

void ChatStreamParser::EmitCall(const std::string& body, bool terminated, ChatDelta* out) {
  std::optional<ToolCall> call = ParseCall(body);
  if (!call.has_value()) {
    // Not a call after all: the block goes out as the text it was.
    absl::StrAppend(&out->content, kCallOpen, body, terminated ? kCallClose : "");
    return;
  }
  if (!options_.parallel_tool_calls && calls_ > 0) return;
  out->tool_calls.push_back({calls_++, *std::move(call)});
}

void ChatStreamParser::Drain(bool final, ChatDelta* out) {
  while (true) {
    switch (mode_) {
      case Mode::kStart: {
        // Reasoning only when the output opens with <think>.
        if (buffer_.size() < kThinkOpen.size() &&
            absl::string_view(kThinkOpen).substr(0, buffer_.size()) == buffer_ && !final) {
          return;  // could still become <think>
        }
        if (absl::StartsWith(buffer_, kThinkOpen)) {
          buffer_.erase(0, kThinkOpen.size());
          mode_ = Mode::kReasoning;
        } else {
          mode_ = Mode::kContent;
        }
        continue;
      }
      case Mode::kReasoning: {
        const size_t close = buffer_.find(kThinkClose.data(), 0, kThinkClose.size());
        if (close != std::string::npos) {
          out->reasoning_content += buffer_.substr(0, close);
          buffer_.erase(0, close + kThinkClose.size());
          mode_ = Mode::kContent;
          continue;
        }
        const size_t hold = final ? 0 : PartialTagSuffix(buffer_, kThinkClose);
        out->reasoning_content += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case Mode::kContent: {
        if (!options_.parse_tool_calls) {
          out->content += buffer_;
          buffer_.clear();
          return;
        }
        const size_t open = buffer_.find(kCallOpen.data(), 0, kCallOpen.size());
        const size_t end = open == std::string::npos
                               ? buffer_.size() - (final ? 0 : PartialTagSuffix(buffer_, kCallOpen))
                               : open;
        std::string text = buffer_.substr(0, end);
        // Once a call was made, the whitespace between and after calls is not content.
        const bool blank = absl::StripAsciiWhitespace(text).empty();
        if (!(calls_ > 0 && blank)) out->content += text;
        buffer_.erase(0, end);
        if (open == std::string::npos) return;
        buffer_.erase(0, kCallOpen.size());
        mode_ = Mode::kToolCall;
        continue;
      }
      case Mode::kToolCall: {
        const size_t close = buffer_.find(kCallClose.data(), 0, kCallClose.size());
        if (close == std::string::npos) {
          if (final) {
            EmitCall(buffer_, /*terminated=*/false, out);
            buffer_.clear();
          }
          return;
        }
        EmitCall(buffer_.substr(0, close), /*terminated=*/true, out);
        buffer_.erase(0, close + kCallClose.size());
        mode_ = Mode::kContent;
        continue;
      }
    }
  }
}

}  // namespace vamp
