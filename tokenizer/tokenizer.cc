#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace vamp {

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) AppendTokenBytes(id, skip_special_tokens, &bytes);
  return SanitizeUtf8(bytes);
}

std::string StreamDecoder::Next(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) tokenizer_->AppendTokenBytes(id, skip_special_tokens_, &pending_);
  const size_t hold = IncompleteUtf8Tail(pending_);
  std::string out = SanitizeUtf8(absl::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::Finish() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

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

void ByteTokenizer::AppendTokenBytes(int32_t id, bool, std::string* out) const {
  if (id >= byte_offset_ && id < byte_offset_ + 256) {
    out->push_back(static_cast<char>(id - byte_offset_));
  }
}

absl::StatusOr<std::string> ByteTokenizer::ApplyChatTemplate(const ChatTemplateInput& input) const {
  if (!input.tools_json.empty() && input.tools_json != "[]") {
    return absl::InvalidArgumentError(
        "tools: this model has no chat template (no tokenizer.json / tokenizer_config.json in its "
        "folder), so tool definitions cannot be put into the prompt");
  }
  std::string out;
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const ChatMessage& m = input.messages[i];
    if (!m.tool_calls.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].tool_calls: this model has no chat template to render tool calls"));
    }
    absl::StrAppend(&out, "<|", m.role, "|>\n", m.content, "\n");
  }
  if (input.add_generation_prompt) absl::StrAppend(&out, "<|assistant|>\n");
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& model_path,
                                                              int32_t vocab_size) {
  const std::filesystem::path dir(model_path);
  std::error_code ec;
  if (!model_path.empty() && std::filesystem::exists(dir / "tokenizer.json", ec)) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> hf = HfTokenizer::FromModelFolder(model_path);
    if (!hf.ok()) return hf.status();
    if ((*hf)->max_token_id() >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat((dir / "tokenizer.json").string(), ": token id ", (*hf)->max_token_id(),
                       " does not fit the model's vocab_size ", vocab_size));
    }
    return std::unique_ptr<Tokenizer>(*std::move(hf));
  }
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> bytes = ByteTokenizer::Create(vocab_size);
  if (!bytes.ok()) return bytes.status();
  return std::unique_ptr<Tokenizer>(*std::move(bytes));
}

}  // namespace vamp
