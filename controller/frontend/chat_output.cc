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

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// How a tool-call block's text so far opens: {"name": "<string>", "arguments": then an object or
// array (kFound, with the name and the offset of the value's first character), something else
// (kNoMatch), or a prefix of that (kIncomplete).
struct ArgumentsStart {
  enum State { kIncomplete, kFound, kNoMatch };
  ArgumentsStart(State s = kNoMatch, std::string n = "", size_t start = 0)
      : state(s), name(std::move(n)), value_start(start) {}
  State state;
  std::string name;
  size_t value_start;
};

ArgumentsStart FindArgumentsStart(absl::string_view body) {
  using State = ArgumentsStart::State;
  size_t pos = 0;
  auto skip_space = [&] {
    while (pos < body.size() && IsJsonSpace(body[pos])) ++pos;
  };
  auto literal = [&](absl::string_view lit) {
    skip_space();
    const size_t n = std::min(lit.size(), body.size() - pos);
    if (body.substr(pos, n) != lit.substr(0, n)) return State::kNoMatch;
    if (n < lit.size()) return State::kIncomplete;
    pos += n;
    skip_space();
    return State::kFound;
  };
  for (absl::string_view lit : {"{", "\"name\"", ":"}) {
    if (State s = literal(lit); s != State::kFound) return {s};
  }
  if (pos == body.size()) return {State::kIncomplete};
  if (body[pos] != '"') return {State::kNoMatch};
  size_t end = pos + 1;
  for (bool escape = false; end < body.size(); ++end) {
    if (escape) {
      escape = false;
    } else if (body[end] == '\\') {
      escape = true;
    } else if (body[end] == '"') {
      break;
    }
  }
  if (end == body.size()) return {State::kIncomplete};
  const absl::string_view quoted = body.substr(pos, end + 1 - pos);
  const Json name = Json::parse(quoted.begin(), quoted.end(), nullptr, /*allow_exceptions=*/false);
  if (name.is_discarded() || !name.is_string()) return {State::kNoMatch};
  pos = end + 1;
  for (absl::string_view lit : {",", "\"arguments\"", ":"}) {
    if (State s = literal(lit); s != State::kFound) return {s};
  }
  if (pos == body.size()) return {State::kIncomplete};
  if (body[pos] != '{' && body[pos] != '[') return {State::kNoMatch};
  return {State::kFound, name.get<std::string>(), pos};
}

// Appends `text`, the next piece of a JSON object or array's text, to `out` without the
// whitespace between tokens, until the value ends (`scan` carries the position across pieces).
void MinifyJsonPiece(absl::string_view text, JsonValueScan* scan, std::string* out) {
  for (const char c : text) {
    if (scan->done) return;
    if (scan->in_string) {
      out->push_back(c);
      if (scan->escape) {
        scan->escape = false;
      } else if (c == '\\') {
        scan->escape = true;
      } else if (c == '"') {
        scan->in_string = false;
      }
      continue;
    }
    if (IsJsonSpace(c)) continue;
    out->push_back(c);
    if (c == '"') {
      scan->in_string = true;
    } else if (c == '{' || c == '[') {
      ++scan->depth;
    } else if ((c == '}' || c == ']') && --scan->depth == 0) {
      scan->done = true;
    }
  }
}

// A tool-call block's JSON -> the call, or nullopt when it is not {"name": str, "arguments": …}.
// The arguments are as chat_output.h says (the model's text when the block streams as a call).
std::optional<ToolCall> ParseCall(absl::string_view body) {
  const Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() ||
      !j.contains("arguments")) {
    return std::nullopt;
  }
  ToolCall call;
  call.id = NewToolCallId();
  call.name = j["name"].get<std::string>();
  const ArgumentsStart start = FindArgumentsStart(body);
  if (start.state == ArgumentsStart::kFound) {
    JsonValueScan scan;
    MinifyJsonPiece(body.substr(start.value_start), &scan, &call.arguments);
  } else {
    call.arguments = j["arguments"].dump(-1, ' ', false, Json::error_handler_t::replace);
  }
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
        if (!whole_block_) {
          // Whether the block streams as a call (a dropped call never does).
          ArgumentsStart start;
          if (options_.parallel_tool_calls || calls_ == 0) {
            start = FindArgumentsStart(absl::string_view(buffer_).substr(0, close));
          }
          if (start.state == ArgumentsStart::kIncomplete && close == std::string::npos && !final) {
            return;  // not decided yet
          }
          if (start.state == ArgumentsStart::kFound) {
            // The call's first piece: id and name, arguments "".
            ToolCall call;
            call.id = NewToolCallId();
            call.name = start.name;
            out->tool_calls.push_back({calls_++, std::move(call)});
            buffer_.erase(0, start.value_start);
            arguments_ = JsonValueScan();
            mode_ = Mode::kToolArguments;
            if (!final) return;  // the arguments start with the next piece, as OpenAI's do
            continue;
          }
          whole_block_ = true;
        }
        if (close == std::string::npos) {
          if (final) {
            EmitCall(buffer_, /*terminated=*/false, out);
            buffer_.clear();
            whole_block_ = false;
          }
          return;
        }
        EmitCall(buffer_.substr(0, close), /*terminated=*/true, out);
        buffer_.erase(0, close + kCallClose.size());
        whole_block_ = false;
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kToolArguments: {
        // The block ends at the first </tool_call>, as in the unary rule; a partial one is held.
        const size_t close = buffer_.find(kCallClose.data(), 0, kCallClose.size());
        const size_t end = close != std::string::npos ? close
                           : final                    ? buffer_.size()
                                   : buffer_.size() - PartialTagSuffix(buffer_, kCallClose);
        std::string piece;
        MinifyJsonPiece(absl::string_view(buffer_).substr(0, end), &arguments_, &piece);
        if (!piece.empty()) {
          const int index = calls_ - 1;
          if (!out->tool_calls.empty() && out->tool_calls.back().index == index) {
            out->tool_calls.back().call.arguments += piece;
          } else {
            ToolCall more;
            more.arguments = std::move(piece);
            out->tool_calls.push_back({index, std::move(more)});
          }
        }
        buffer_.erase(0, end);
        if (close == std::string::npos) return;
        buffer_.erase(0, kCallClose.size());
        mode_ = Mode::kContent;
        continue;
      }
    }
  }
}

}  // namespace vamp
