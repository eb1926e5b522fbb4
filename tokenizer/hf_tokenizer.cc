#include "tokenizer/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/utf8.h"

namespace vamp {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

// GPT-2's byte-level pre-tokenization pattern (ByteLevel with use_regex = true).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The byte-level alphabet: byte b is written as code point kByteToCp[b] in vocabulary entries.
struct ByteAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  absl::flat_hash_map<char32_t, uint8_t> cp_to_byte;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* a = new ByteAlphabet();
  return *a;
}

// j[key] when j is an object holding a string there, else `fallback` (never throws).
std::string StringAt(const Json& j, const char* key, const std::string& fallback = "") {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

absl::Status FileError(absl::string_view origin, absl::string_view field,
                       absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": ", field, ": ", message));
}

// A vocabulary entry in the byte-level alphabet -> the bytes it stands for.
bool FromByteLevel(absl::string_view token, std::string* bytes) {
  if (!IsValidUtf8(token)) return false;
  for (char32_t cp : DecodeUtf8(token)) {
    auto it = Alphabet().cp_to_byte.find(cp);
    if (it == Alphabet().cp_to_byte.end()) return false;
    bytes->push_back(static_cast<char>(it->second));
  }
  return true;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tokenizer_config.json special-token entry: a string, or {"content": ...}; else "".
std::string TokenString(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

}  // namespace

struct HfTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(absl::string_view text,
                                                                   absl::string_view origin) {
  const Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return FileError(origin, "(file)", "is not a JSON object");
  }
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());

  // ---- normalizer ----
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    const Json& n = doc["normalizer"];
    std::vector<const Json*> parts;
    if (StringAt(n, "type") == "Sequence" && n.contains("normalizers") &&
        n["normalizers"].is_array()) {
      for (const Json& p : n["normalizers"]) parts.push_back(&p);
    } else {
      parts.push_back(&n);
    }
    for (const Json* p : parts) {
      const std::string type = p->is_object() && (*p).contains("type") && (*p)["type"].is_string()
                                   ? (*p)["type"].get<std::string>()
                                   : "";
      if (type != "NFC") {
        return FileError(origin, "normalizer",
                         absl::StrCat("type '", type, "' is not supported (only NFC)"));
      }
      t->nfc_ = true;
    }
  }

  // ---- pre_tokenizer ----
  if (doc.contains("pre_tokenizer") && !doc["pre_tokenizer"].is_null()) {
    const Json& pt = doc["pre_tokenizer"];
    std::vector<const Json*> parts;
    if (StringAt(pt, "type") == "Sequence" && pt.contains("pretokenizers") &&
        pt["pretokenizers"].is_array()) {
      for (const Json& p : pt["pretokenizers"]) parts.push_back(&p);
    } else {
      parts.push_back(&pt);
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const Json& p = *parts[i];
      const std::string field = absl::StrCat("pre_tokenizer[", i, "]");
      if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
        return FileError(origin, field, "has no type");
      }
      const std::string type = p["type"].get<std::string>();
      std::string pattern;
      uint32_t options = PCRE2_UTF | PCRE2_UCP;
      if (type == "ByteLevel") {
        if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean() &&
            p["add_prefix_space"].get<bool>()) {
          return FileError(origin, field + ".add_prefix_space", "true is not supported");
        }
        const bool use_regex =
            !p.contains("use_regex") || !p["use_regex"].is_boolean() || p["use_regex"].get<bool>();
        if (!use_regex) continue;
        pattern = kGpt2Pattern;
      } else if (type == "Split") {
        const std::string behavior = p.contains("behavior") && p["behavior"].is_string()
                                         ? p["behavior"].get<std::string>()
                                         : "";
        if (behavior != "Isolated") {
          return FileError(origin, field + ".behavior",
                           absl::StrCat("'", behavior, "' is not supported (only Isolated)"));
        }
        if (p.contains("invert") && p["invert"].is_boolean() && p["invert"].get<bool>()) {
          return FileError(origin, field + ".invert", "true is not supported");
        }
        const Json& pat = p.contains("pattern") ? p["pattern"] : Json();
        if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
          pattern = pat["Regex"].get<std::string>();
        } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
          pattern = pat["String"].get<std::string>();
          options |= PCRE2_LITERAL;
        } else {
          return FileError(origin, field + ".pattern",
                           "must be {\"Regex\": ...} or {\"String\": ...}");
        }
        if (pattern.empty()) return FileError(origin, field + ".pattern", "is empty");
      } else {
        return FileError(origin, field + ".type",
                         absl::StrCat("'", type, "' is not supported (Split, ByteLevel)"));
      }
      int error = 0;
      PCRE2_SIZE offset = 0;
      auto regex = std::make_unique<Regex>();
      regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  options, &error, &offset, nullptr);
      if (regex->code == nullptr) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error, message, sizeof(message));
        return FileError(origin, field + ".pattern",
                         absl::StrCat("does not compile at offset ", offset, ": ",
                                      reinterpret_cast<const char*>(message)));
      }
      pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
      t->splits_.push_back(std::move(regex));
    }
  }

  // ---- decoder / post_processor: byte-level or none ----
  for (const char* field : {"decoder", "post_processor"}) {
    if (!doc.contains(field) || doc[field].is_null()) continue;
    const Json& d = doc[field];
    const std::string type = d.is_object() && d.contains("type") && d["type"].is_string()
                                 ? d["type"].get<std::string>()
                                 : "";
    if (type != "ByteLevel") {
      return FileError(origin, field,
                       absl::StrCat("type '", type, "' is not supported (only ByteLevel)"));
    }
  }

  // ---- model ----
  if (!doc.contains("model") || !doc["model"].is_object()) {
    return FileError(origin, "model", "is missing");
  }
  const Json& model = doc["model"];
  if ((model.contains("type") && !model["type"].is_string()) ||
      StringAt(model, "type", "BPE") != "BPE") {
    return FileError(origin, "model.type", "only BPE is supported");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return FileError(origin, "model.dropout", "is not supported");
  }
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(f) && !model[f].is_null() &&
        !(model[f].is_string() && model[f].get<std::string>().empty())) {
      return FileError(origin, absl::StrCat("model.", f), "is not supported");
    }
  }
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() &&
      model["byte_fallback"].get<bool>()) {
    return FileError(origin, "model.byte_fallback", "true is not supported (byte-level BPE only)");
  }
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean()) {
    t->ignore_merges_ = model["ignore_merges"].get<bool>();
  }
  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty()) {
    return FileError(origin, "model.vocab", "must be a non-empty object {token: id}");
  }
  constexpr int64_t kMaxId = 1 << 21;  // real vocabularies stay far below (Gemma: 262k)
  int64_t max_id = -1;
  t->vocab_.reserve(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxId) {
      return FileError(origin, absl::StrCat("model.vocab[\"", it.key(), "\"]"),
                       absl::StrCat("id must be an integer in [0, ", kMaxId, ")"));
    }
    std::string bytes;
    if (!FromByteLevel(it.key(), &bytes) || bytes.empty()) {
      return FileError(origin, absl::StrCat("model.vocab[\"", it.key(), "\"]"),
                       "is not written in the byte-level alphabet");
    }
    const int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
    t->vocab_[bytes] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t->vocab_.find(std::string(1, static_cast<char>(b)));
    if (it == t->vocab_.end()) {
      return FileError(origin, "model.vocab",
                       absl::StrCat("has no token for byte 0x", absl::Hex(b, absl::kZeroPad2),
                                    " (byte-level BPE needs all 256)"));
    }
    t->byte_ids_[b] = it->second;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return FileError(origin, "model.merges", "must be an array");
  }
  const Json& merges = model["merges"];
  t->merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return FileError(origin, absl::StrCat("model.merges[", i, "]"), "must be \"a b\"");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return FileError(origin, absl::StrCat("model.merges[", i, "]"),
                       "must be \"a b\" or [\"a\", \"b\"]");
    }
    std::string ab, bb;
    if (!FromByteLevel(a, &ab) || !FromByteLevel(b, &bb)) {
      return FileError(origin, absl::StrCat("model.merges[", i, "]"),
                       "is not written in the byte-level alphabet");
    }
    auto ia = t->vocab_.find(ab), ib = t->vocab_.find(bb), iab = t->vocab_.find(ab + bb);
    if (ia == t->vocab_.end() || ib == t->vocab_.end() || iab == t->vocab_.end()) {
      return FileError(origin, absl::StrCat("model.merges[", i, "]"),
                       "names a token missing from model.vocab");
    }
    const uint64_t key =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    t->merges_.try_emplace(key, static_cast<int32_t>(i), iab->second);  // the first rank wins
  }

  // ---- added tokens ----
  if (doc.contains("added_tokens") && !doc["added_tokens"].is_null()) {
    const Json& added = doc["added_tokens"];
    if (!added.is_array()) return FileError(origin, "added_tokens", "must be an array");
    for (size_t i = 0; i < added.size(); ++i) {
      const Json& a = added[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
          !a.contains("id") || !a["id"].is_number_integer()) {
        return FileError(origin, field, "must have a string content and an integer id");
      }
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      if (id < 0 || id >= kMaxId) return FileError(origin, field + ".id", "is out of range");
      if (content.empty() || !IsValidUtf8(content)) {
        return FileError(origin, field + ".content", "must be non-empty UTF-8");
      }
      for (const char* f : {"lstrip", "rstrip", "single_word"}) {
        if (a.contains(f) && a[f].is_boolean() && a[f].get<bool>()) {
          return FileError(origin, absl::StrCat(field, ".", f), "true is not supported");
        }
      }
      const bool special =
          a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
      t->added_.push_back({content, static_cast<int32_t>(id), special});
      max_id = std::max<int64_t>(max_id, id);
    }
  }
  std::stable_sort(
      t->added_.begin(), t->added_.end(),
      [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  for (const AddedToken& a : t->added_) {
    t->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  }
  t->id_to_bytes_.resize(max_id + 1);
  t->special_.assign(max_id + 1, false);
  for (const auto& [bytes, id] : t->vocab_) t->id_to_bytes_[id] = bytes;
  for (const AddedToken& a : t->added_) {
    t->id_to_bytes_[a.id] = a.content;
    t->special_[a.id] = a.special;
  }
  auto is_added = [&t](absl::string_view s) {
    return std::any_of(t->added_.begin(), t->added_.end(),
                       [s](const AddedToken& a) { return a.content == s; });
  };
  t->has_think_tags_ = is_added("<think>") && is_added("</think>");
  t->has_tool_call_tags_ = is_added("<tool_call>") && is_added("</tool_call>");
  return t;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromModelFolder(
    const std::string& folder) {
  const std::filesystem::path dir(folder);
  const std::filesystem::path json_path = dir / "tokenizer.json";
  absl::StatusOr<std::string> text = ReadFile(json_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = FromJson(*text, json_path.string());
  if (!t.ok()) return t.status();
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  std::string template_source, tool_template_source, template_origin;
  if (std::filesystem::exists(config_path, ec)) {
    absl::StatusOr<std::string> config_text = ReadFile(config_path);
    if (!config_text.ok()) return config_text.status();
    const Json config =
        Json::parse(config_text->begin(), config_text->end(), nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return FileError(config_path.string(), "(file)", "is not a JSON object");
    }
    if (config.contains("bos_token")) (*t)->bos_token_ = TokenString(config["bos_token"]);
    if (config.contains("eos_token")) (*t)->eos_token_ = TokenString(config["eos_token"]);
    template_origin = config_path.string() + " chat_template";
    if (config.contains("chat_template") && !config["chat_template"].is_null()) {
      const Json& ct = config["chat_template"];
      if (ct.is_string()) {
        template_source = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const Json& e : ct) {
          if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
              !e.contains("template") || !e["template"].is_string()) {
            return FileError(config_path.string(), "chat_template",
                             "entries must be {\"name\": ..., \"template\": ...}");
          }
          if (e["name"] == "default") template_source = e["template"].get<std::string>();
          if (e["name"] == "tool_use") tool_template_source = e["template"].get<std::string>();
        }
        if (template_source.empty()) {
          return FileError(config_path.string(), "chat_template", "has no \"default\" entry");
        }
      } else {
        return FileError(config_path.string(), "chat_template", "must be a string or a list");
      }
    }
  }
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (template_source.empty() && std::filesystem::exists(jinja_path, ec)) {
    absl::StatusOr<std::string> source = ReadFile(jinja_path);
    if (!source.ok()) return source.status();
    template_source = *source;
    template_origin = jinja_path.string();
  }
  if (!template_source.empty()) {
    absl::Status s = (*t)->SetChatTemplate(template_source, template_origin);
    if (!s.ok()) return s;
  }
  if (!tool_template_source.empty()) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> tool =
        ChatTemplate::Compile(tool_template_source, template_origin + "[tool_use]");
    if (!tool.ok()) return tool.status();
    (*t)->tool_template_ = *std::move(tool);
  }
  return t;
}

absl::Status HfTokenizer::SetChatTemplate(absl::string_view source, absl::string_view origin) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> compiled = ChatTemplate::Compile(source, origin);
  if (!compiled.ok()) return compiled.status();
  template_ = *std::move(compiled);
  return absl::OkStatus();
}

int32_t HfTokenizer::TokenId(absl::string_view text) const {
  for (const AddedToken& a : added_) {
    if (a.content == text) return a.id;
  }
  auto it = vocab_.find(text);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<int32_t> HfTokenizer::Encode(absl::string_view raw) const {
  std::string sanitized;
  absl::string_view text = raw;
  if (!IsValidUtf8(raw)) {
    sanitized = SanitizeUtf8(raw);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  size_t segment = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (added_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken* match = nullptr;
      for (const AddedToken& a : added_) {  // longest first
        if (text.compare(i, a.content.size(), a.content) == 0) {
          match = &a;
          break;
        }
      }
      if (match != nullptr) {
        if (i > segment) EncodeSegment(text.substr(segment, i - segment), &ids);
        ids.push_back(match->id);
        i += match->content.size();
        segment = i;
        continue;
      }
    }
    ++i;
  }
  if (segment < text.size()) EncodeSegment(text.substr(segment), &ids);
  return ids;
}

void HfTokenizer::EncodeSegment(absl::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized;
  if (nfc_) {
    const bool ascii = std::all_of(text.begin(), text.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    if (!ascii) {
      utf8proc_uint8_t* out = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                       static_cast<utf8proc_ssize_t>(text.size()), &out,
                       static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n >= 0 && out != nullptr) {
        normalized.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
        text = normalized;
      }
      std::free(out);
    }
  }
  if (splits_.empty()) {
    EncodeWord(text, ids);
    return;
  }
  // Each split isolates its matches within every piece the previous split produced.
  std::vector<absl::string_view> pieces = {text}, next;
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  for (const auto& regex : splits_) {
    next.clear();
    for (absl::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t start = 0, pos = 0;
      while (pos < piece.size()) {
        const int rc =
            pcre2_match(regex->code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t s = ov[0], e = ov[1];
        if (e <= s) {  // an empty match: move on by one character
          pos = s + 1;
          while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) {
            ++pos;
          }
          continue;
        }
        if (s > start) next.push_back(piece.substr(start, s - start));
        next.push_back(piece.substr(s, e - s));
        start = pos = e;
      }
      if (start < piece.size()) next.push_back(piece.substr(start));
    }
    pieces.swap(next);
  }
  pcre2_match_data_free(md);
  for (absl::string_view piece : pieces) EncodeWord(piece, ids);
}

void HfTokenizer::EncodeWord(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  constexpr size_t kMaxCachedWord = 128;
  CacheShard* shard = nullptr;
  if (word.size() <= kMaxCachedWord) {
    shard = &cache_[absl::HashOf(word) % kCacheShards];
    absl::MutexLock lock(&shard->mu);
    auto it = shard->map.find(word);
    if (it != shard->map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = ids->size();
  Bpe(word, ids);
  if (shard != nullptr) {
    absl::MutexLock lock(&shard->mu);
    if (shard->map.size() < kCacheEntriesPerShard) {
      shard->map.emplace(std::string(word),
                         std::vector<int32_t>(ids->begin() + before, ids->end()));
    }
  }
}

void HfTokenizer::Bpe(absl::string_view word, std::vector<int32_t>* ids) const {
  // Symbols start as single bytes in a linked list; the lowest-ranked adjacent pair (leftmost on
  // ties) merges first, as the reference implementation orders its merge heap.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    const int32_t r = sym[pos].next;
    auto it =
        merges_.find((static_cast<uint64_t>(sym[pos].id) << 32) | static_cast<uint32_t>(sym[r].id));
    if (it != merges_.end()) heap.push({it->second.first, pos, sym[pos].id, sym[r].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (left.id != c.left || left.next < 0) continue;  // stale: merged away or changed
    Symbol& right = sym[left.next];
    if (right.id != c.right) continue;
    left.id = merges_.find((static_cast<uint64_t>(c.left) << 32) | static_cast<uint32_t>(c.right))
                  ->second.second;
    right.id = -1;  // dead
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids->push_back(sym[i].id);
}

void HfTokenizer::AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size()) return;
  if (skip_special_tokens && special_[id]) return;
  out->append(id_to_bytes_[id]);
}

absl::StatusOr<std::string> HfTokenizer::ApplyChatTemplate(const ChatTemplateInput& input) const {
  const bool has_tools = !input.tools_json.empty() && input.tools_json != "[]";
  const ChatTemplate* tpl =
      has_tools && tool_template_ != nullptr ? tool_template_.get() : template_.get();
  if (tpl == nullptr) {
    return absl::InvalidArgumentError(
        "messages: this model's tokenizer has no chat template (tokenizer_config.json "
        "chat_template); send a completion request with a prompt instead");
  }
  OJson vars = OJson::object();
  if (!input.kwargs_json.empty()) {
    vars = OJson::parse(input.kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (vars.is_discarded() || !vars.is_object()) {
      return absl::InvalidArgumentError("chat_template_kwargs: must be a JSON object");
    }
  }
  for (const char* reserved : {"messages", "tools", "add_generation_prompt"}) {
    if (vars.contains(reserved)) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat_template_kwargs.", reserved, ": is set by the request itself"));
    }
  }
  if (!vars.contains("bos_token")) vars["bos_token"] = bos_token_;
  if (!vars.contains("eos_token")) vars["eos_token"] = eos_token_;
  vars["add_generation_prompt"] = input.add_generation_prompt;
  if (has_tools) {
    OJson tools = OJson::parse(input.tools_json, nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded() || !tools.is_array()) {
      return absl::InvalidArgumentError("tools: must be a JSON array");
    }
    vars["tools"] = std::move(tools);
  } else {
    vars["tools"] = nullptr;
  }
  OJson messages = OJson::array();
  for (const ChatMessage& m : input.messages) {
    // OpenAI's "developer" role is the system prompt for newer models; templates only know
    // "system" (Qwen3's would drop the message silently).
    OJson j = {{"role", m.role == "developer" ? "system" : m.role}, {"content", m.content}};
    if (m.reasoning_content.has_value()) j["reasoning_content"] = *m.reasoning_content;
    if (m.name.has_value()) j["name"] = *m.name;
    if (m.tool_call_id.has_value()) j["tool_call_id"] = *m.tool_call_id;
    if (!m.tool_calls.empty()) {
      OJson calls = OJson::array();
      for (const ToolCall& c : m.tool_calls) {
        // Templates expect the arguments as an object (they apply tojson), as vLLM passes them.
        OJson args = OJson::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded()) args = c.arguments;
        calls.push_back({{"id", c.id},
                         {"type", c.type},
                         {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(j));
  }
  vars["messages"] = std::move(messages);
  return tpl->Render(vars);
}

}  // namespace vamp
