// Text <-> token ids for the HTTP frontend. Models ship a tokenizer (tokenizer.json) that a later
// change can load; until then, and for models without one, VAMP uses a documented byte-level
// fallback: every UTF-8 byte b of the text is token id `byte_offset + b`, and decoding maps ids
// in [byte_offset, byte_offset + 256) back to bytes, dropping every other id. The tiny test model
// (vocab 256, offset 0) reads and writes plain bytes this way.
#ifndef VAMP_CONTROLLER_FRONTEND_TOKENIZER_H_
#define VAMP_CONTROLLER_FRONTEND_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // Renders a conversation as the prompt text, ending where the assistant's reply begins.
  virtual std::string ApplyChatTemplate(const std::vector<ChatMessage>& messages) const = 0;
  virtual std::string name() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  // Fails unless byte_offset + 256 <= vocab_size.
  static absl::StatusOr<std::unique_ptr<ByteTokenizer>> Create(int32_t vocab_size,
                                                               int32_t byte_offset = 0);

  std::vector<int32_t> Encode(absl::string_view text) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  // "<|role|>\ncontent\n" per message, then "<|assistant|>\n".
  std::string ApplyChatTemplate(const std::vector<ChatMessage>& messages) const override;
  std::string name() const override { return "byte-fallback"; }

 private:
  explicit ByteTokenizer(int32_t byte_offset) : byte_offset_(byte_offset) {}
  int32_t byte_offset_;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_FRONTEND_TOKENIZER_H_
