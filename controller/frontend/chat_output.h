// Splits a chat model's generated text into what OpenAI's API returns: reasoning_content
// (Qwen3's <think>…</think>), content, and tool_calls (Qwen3 / Hermes <tool_call>{"name": ...,
// "arguments": {...}}</tool_call> blocks).
//
// Unary (ParseChatOutput) follows vLLM's qwen3 reasoning parser and hermes tool parser:
// - reasoning only when both <think> and </think> occur: what precedes </think> (after an
//   optional <think>) is the reasoning, what follows is the content (null when empty);
// - tool calls only when <tool_call> occurs and every block parses as JSON with a string "name"
//   and an "arguments" value (an unterminated last block counts); the content is the text before
//   the first <tool_call> (null when empty); otherwise the whole text stays content.
// When the prompt opened <think> itself (options.reasoning_open), the output is read as if it
// began with <think>.
// A call's arguments are the JSON text of its "arguments" value: when the block opens with
// {"name": "<string>", "arguments": followed by an object or array (Qwen3's and Hermes' order;
// JSON whitespace allowed between tokens), the model's own text of that value without the
// whitespace between its tokens (its numbers and escapes as generated); otherwise the value
// re-serialised compactly.
// Streaming (ChatStreamParser) decides as the text arrives and never sends a partial tag: text
// that may be the start of a tag is held back. A call in the order above streams as OpenAI does:
// once the arguments value begins, a first piece with the call's id and name (arguments ""),
// then the arguments piece by piece, adding up to the unary arguments; other blocks go out whole
// at their end. Streaming differs from the unary rule only for output cut off inside <think>
// (streamed as reasoning), for a block that streams as a call but turns out malformed (its
// arguments are what was generated), and for a malformed block that does not (streamed as
// content, then further blocks are still parsed).
#ifndef VAMP_CONTROLLER_FRONTEND_CHAT_OUTPUT_H_
#define VAMP_CONTROLLER_FRONTEND_CHAT_OUTPUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "controller/frontend/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace vamp {

struct ChatOutput {
  std::optional<std::string> reasoning_content;
  std::optional<std::string> content;
  std::vector<ToolCall> tool_calls;  // arguments: compact JSON text
};

// `text` is the generated text; options.assistant_prefix is read before it. Tool call ids are
// "call_" + 24 random hex digits.
ChatOutput ParseChatOutput(absl::string_view text, const ResponseOptions& options);

// One streamed piece: any of the three parts may be set.
struct ChatDelta {
  std::string reasoning_content;
  std::string content;
  // A piece of tool call `index` (0, 1, ... in order). A call's first piece carries call.id and
  // call.name; later ones have both empty and continue call.arguments. A call's pieces arrive in
  // order and at most one per call in a delta.
  struct Call {
    int index = 0;
    ToolCall call;
  };
  std::vector<Call> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

// How far the text of a JSON object or array has been read, piece by piece (ChatStreamParser's
// arguments).
struct JsonValueScan {
  int depth = 0;
  bool in_string = false;
  bool escape = false;
  bool done = false;  // the value ended: what follows is not part of it
};

class ChatStreamParser {
 public:
  explicit ChatStreamParser(const ResponseOptions& options);
  // The parts `text` completes (whole characters in, whole characters out).
  ChatDelta Next(absl::string_view text);
  // Everything still held back, at the end of the output.
  ChatDelta Finish();
  // Whether a tool call has been sent (finish_reason "tool_calls").
  bool called_tools() const { return calls_ > 0; }

 private:
  // kToolCall: inside a block, before its arguments stream (or for all of it when it does not);
  // kToolArguments: streaming the arguments of call calls_ - 1.
  enum class Mode { kStart, kReasoning, kContent, kToolCall, kToolArguments };
  void Drain(bool final, ChatDelta* out);
  void EmitCall(const std::string& body, bool terminated, ChatDelta* out);

  ResponseOptions options_;
  Mode mode_;
  std::string buffer_;  // not yet sent
  int calls_ = 0;
  // The current block cannot stream (not in the order above, or a call that is dropped): it goes
  // out whole at its end.
  bool whole_block_ = false;
  // How far the streamed arguments value has been read.
  JsonValueScan arguments_;
};

// A fresh tool call id.
std::string NewToolCallId();

}  // namespace vamp

#endif  // VAMP_CONTROLLER_FRONTEND_CHAT_OUTPUT_H_
