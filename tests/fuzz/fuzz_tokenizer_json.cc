// libFuzzer target: tokenizer.json loading. Whatever the bytes, HfTokenizer::FromJson returns a
// tokenizer or an error naming the field; a tokenizer that loads encodes and decodes text (the
// input itself) without crashing, and its decode is well-formed UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<vamp::HfTokenizer>> t =
      vamp::HfTokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!t.ok()) return 0;
  const std::vector<int32_t> ids = (*t)->Encode(text.substr(0, 4096));
  for (int32_t id : ids) {
    if (id < 0 || id > (*t)->max_token_id()) std::abort();
  }
  if (!vamp::IsValidUtf8((*t)->Decode(ids, false))) std::abort();
  vamp::StreamDecoder stream(t->get());
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Next({id});
  streamed += stream.Finish();
  if (streamed != (*t)->Decode(ids)) std::abort();
  return 0;
}
