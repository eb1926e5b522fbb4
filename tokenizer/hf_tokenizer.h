// A Hugging Face tokenizer (tokenizer.json, the `tokenizers` library's format) for byte-level BPE
// models (GPT-2 lineage: Qwen, Llama 3, ...), with the model's chat template.
//
// Supported (anything else fails loading with an error naming the file and field):
// - normalizer: null, NFC, or a Sequence of NFC;
// - pre_tokenizer: Split (a Regex or String pattern, behavior Isolated, invert false), ByteLevel
//   (use_regex: the GPT-2 pattern; add_prefix_space false), or a Sequence of those;
// - model: BPE over the byte-level alphabet (merges as "a b" strings or [a, b] pairs, no dropout,
//   no continuing_subword_prefix / end_of_word_suffix, ignore_merges honoured);
// - decoder: ByteLevel (or null); post_processor: ByteLevel / null (no template processing);
// - added_tokens: matched in the raw text before normalization and BPE (leftmost, longest);
//   lstrip / rstrip / single_word are not supported.
// Patterns are compiled with PCRE2 (UTF + Unicode properties, JIT); NFC uses utf8proc.
// Encode is thread-safe; each pre-token's BPE result is cached (bounded).
#ifndef VAMP_TOKENIZER_HF_TOKENIZER_H_
#define VAMP_TOKENIZER_HF_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace vamp {

class HfTokenizer final : public Tokenizer {
 public:
  // `tokenizer_json` is the file's text; `origin` names it in errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(absl::string_view tokenizer_json,
                                                               absl::string_view origin);
  // tokenizer.json of `folder`, plus the chat template of its tokenizer_config.json (its
  // "chat_template": a string, or a list of {name, template} of which "default" is used, and
  // "tool_use" when tools are offered) or of chat_template.jinja, and the bos/eos token strings.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromModelFolder(const std::string& folder);
  ~HfTokenizer() override;

  std::vector<int32_t> Encode(absl::string_view text) const override;
  void AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const override;
  // Renders the model's template with messages, tools (when given), add_generation_prompt,
  // bos_token / eos_token and every chat_template_kwargs entry as variables; a "developer"
  // message reaches the template as "system". A model without a template: InvalidArgument naming
  // "messages".
  absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplateInput& input) const override;
  std::string name() const override { return "hf-bpe"; }
  bool has_think_tags() const override { return has_think_tags_; }
  bool has_tool_call_tags() const override { return has_tool_call_tags_; }

  int32_t max_token_id() const { return static_cast<int32_t>(id_to_bytes_.size()) - 1; }
  // The id of an added or vocabulary token written as `text`, or -1.
  int32_t TokenId(absl::string_view text) const;
  // Installs a chat template (tests; FromModelFolder does it from the folder's files).
  absl::Status SetChatTemplate(absl::string_view source, absl::string_view origin);

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
  };
  struct Regex;  // a compiled PCRE2 pattern

  HfTokenizer();
  void EncodeSegment(absl::string_view text, std::vector<int32_t>* ids) const;
  void EncodeWord(absl::string_view word, std::vector<int32_t>* ids) const;
  void Bpe(absl::string_view word, std::vector<int32_t>* ids) const;

  bool nfc_ = false;
  bool ignore_merges_ = false;
  std::vector<std::unique_ptr<Regex>> splits_;       // applied in order, each isolating its matches
  absl::flat_hash_map<std::string, int32_t> vocab_;  // raw bytes -> id
  // (left id << 32 | right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::array<int32_t, 256> byte_ids_{};
  std::vector<AddedToken> added_;  // longest first
  std::array<bool, 256> added_first_byte_{};
  std::vector<std::string> id_to_bytes_;
  std::vector<bool> special_;
  bool has_think_tags_ = false;
  bool has_tool_call_tags_ = false;
  std::unique_ptr<ChatTemplate> template_;
  std::unique_ptr<ChatTemplate> tool_template_;  // "tool_use", when the config names one
  std::string bos_token_;
  std::string eos_token_;

  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> map ABSL_GUARDED_BY(mu);
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace vamp

#endif  // VAMP_TOKENIZER_HF_TOKENIZER_H_
