#include "controller/frontend/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace vamp {

absl::StatusOr<std::unique_ptr<ByteTokenizer>> ByteTokenizer::Create(int32_t vocab_size,
                                                                    int32_t byte_offset) {
  if (byte_offset < 0 || static_cast<int64_t>(byte_offset) + 256 > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte-level tokenizer needs byte_offset + 256 <= vocab_size; got offset ",
                     byte_offset, ", vocab ", vocab_size));
  }
  return std::unique_ptr<ByteTokenizer>(new ByteTokenizer(byte_offset));
}

std::vector<int32_t> ByteTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(byte_offset_ + c);
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= byte_offset_ && id < byte_offset_ + 256) {
      text.push_back(static_cast<char>(id - byte_offset_));
    }
  }
  return text;
}

std::string ByteTokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages) const {
  std::string out;
  for (const ChatMessage& m : messages) absl::StrAppend(&out, "<|", m.role, "|>\n", m.content, "\n");
  absl::StrAppend(&out, "<|assistant|>\n");
  return out;
}

}  // namespace vamp
