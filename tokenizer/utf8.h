// UTF-8 helpers shared by the tokenizer, the stream decoder and the chat-template engine.
#ifndef VAMP_TOKENIZER_UTF8_H_
#define VAMP_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace vamp {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// `s` with every maximal ill-formed subsequence replaced by U+FFFD (EF BF BD): the rule of the
// WHATWG TextDecoder and of Unicode's "best practice", so a decoder fed the same bytes in any
// number of pieces (holding back incomplete tails) produces the same text.
std::string SanitizeUtf8(absl::string_view s);

// The length (0-3) of a trailing sequence of `s` that is a valid but incomplete UTF-8 character:
// what a streaming decoder holds back until more bytes arrive.
size_t IncompleteUtf8Tail(absl::string_view s);

// The code points of well-formed UTF-8 `s` (ill-formed bytes come out as U+FFFD each).
std::vector<char32_t> DecodeUtf8(absl::string_view s);
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace vamp

#endif  // VAMP_TOKENIZER_UTF8_H_
