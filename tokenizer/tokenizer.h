// Text <-> token ids of a model, and the rendering of a conversation into prompt text.
//
// Two implementations:
// - HfTokenizer (hf_tokenizer.h): a model folder's tokenizer.json (HF tokenizers format, byte-level
//   BPE) and its chat template (tokenizer_config.json), chosen by LoadModelTokenizer when the
//   folder has a tokenizer.json.
// - ByteTokenizer: the documented byte-level fallback for models without one: every UTF-8 byte b
//   of the text is token id `byte_offset + b`, and decoding maps ids in [byte_offset,
//   byte_offset + 256) back to bytes, dropping every other id. The tiny test model (vocab 256,
//   offset 0) reads and writes plain bytes this way.
// Token-id prompts bypass the tokenizer, so they work for any model.
#ifndef VAMP_TOKENIZER_TOKENIZER_H_
#define VAMP_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

// One function call an assistant made, as OpenAI's API carries it.
struct ToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  std::string arguments;  // the arguments as JSON text (OpenAI sends a string)
};

struct ChatMessage {
  std::string role;  // "system" | "developer" | "user" | "assistant" | "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant: earlier reasoning
  std::optional<std::string> name;
  std::optional<std::string> tool_call_id;  // role "tool": the call this answers
  std::vector<ToolCall> tool_calls;         // role "assistant"
};

// What a chat template renders: the conversation, the tools offered, and the template's
// keyword arguments (chat_template_kwargs, e.g. {"enable_thinking": false}).
struct ChatTemplateInput {
  std::vector<ChatMessage> messages;
  std::string tools_json;   // a JSON array of tool definitions; empty when none are offered
  std::string kwargs_json;  // a JSON object; empty for none
  bool add_generation_prompt = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`. Bytes that are not well-formed UTF-8 are read as U+FFFD, each maximal
  // ill-formed subsequence once (the WHATWG / Unicode "replacement" rule), as clients that decode
  // bytes into strings do. Special tokens written in the text are recognised.
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;
  // Appends the bytes token `id` stands for: nothing for ids outside the vocabulary, nor for
  // special tokens (e.g. <|im_end|>) when `skip_special_tokens`.
  virtual void AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const = 0;
  // Renders a conversation as the prompt text. InvalidArgument (naming the field) when the
  // conversation is one the template refuses (raise_exception) or cannot render.
  virtual absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplateInput& input) const = 0;
  virtual std::string name() const = 0;
  // Which of Qwen3's output conventions the model's vocabulary has, so the response writer can
  // separate them: <think>…</think> reasoning, <tool_call>{json}</tool_call> calls (Hermes).
  virtual bool has_think_tags() const { return false; }
  virtual bool has_tool_call_tags() const { return false; }

  // The text of `ids`, always well-formed UTF-8 (ill-formed bytes become U+FFFD, as in Encode).
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
};

// Detokenises a stream of generated ids chunk by chunk. Each Next() returns only whole UTF-8
// characters (a character split across tokens is held until it completes); Finish() returns what
// is left. The concatenation of every chunk equals tokenizer.Decode(all ids) exactly.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens = true)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}
  std::string Next(const std::vector<int32_t>& ids);
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // a trailing, so far valid, incomplete UTF-8 sequence
};

class ByteTokenizer final : public Tokenizer {
 public:
  // Fails unless byte_offset + 256 <= vocab_size.
  static absl::StatusOr<std::unique_ptr<ByteTokenizer>> Create(int32_t vocab_size,
                                                               int32_t byte_offset = 0);

  // Every byte as it is (no U+FFFD replacement: byte ids can express any byte string).
  std::vector<int32_t> Encode(absl::string_view text) const override;
  void AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const override;
  // "<|role|>\ncontent\n" per message, then "<|assistant|>\n" when add_generation_prompt. Tool
  // definitions and calls are not representable: InvalidArgument naming "tools" /
  // "messages[i].tool_calls".
  absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplateInput& input) const override;
  std::string name() const override { return "byte-fallback"; }

 private:
  explicit ByteTokenizer(int32_t byte_offset) : byte_offset_(byte_offset) {}
  int32_t byte_offset_;
};

// The tokenizer of the model folder `model_path`: its tokenizer.json (with tokenizer_config.json's
// chat template when present) when the folder has one, the byte fallback otherwise. A folder whose
// tokenizer.json or tokenizer_config.json is unusable fails with an error naming the file and
// field; so does a tokenizer whose ids do not fit `vocab_size`.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& model_path,
                                                              int32_t vocab_size);

}  // namespace vamp

#endif  // VAMP_TOKENIZER_TOKENIZER_H_
