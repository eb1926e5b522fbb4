#include "bench/workload/token_synth.h"

namespace vamp::workload {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
int32_t ToToken(uint64_t h, int32_t vocab_size) {
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size));
}
}  // namespace

std::vector<int32_t> TokensForHashBlock(int64_t hash_id, int32_t count, int32_t vocab_size) {
  std::vector<int32_t> tokens(count);
  const uint64_t base = Mix64(static_cast<uint64_t>(hash_id) ^ 0x6d6f6f6e63616b65ULL);
  for (int32_t i = 0; i < count; ++i) tokens[i] = ToToken(Mix64(base + i), vocab_size);
  return tokens;
}

std::vector<int32_t> SyntheticTokens(uint64_t seed, uint64_t stream, int64_t count,
                                     int32_t vocab_size) {
  std::vector<int32_t> tokens(count);
  const uint64_t base = Mix64(Mix64(seed) ^ stream);
  for (int64_t i = 0; i < count; ++i) {
    tokens[i] = ToToken(Mix64(base + static_cast<uint64_t>(i)), vocab_size);
  }
  return tokens;
}

std::vector<int32_t> TokenizeText(absl::string_view text, int32_t chars_per_token,
                                  int32_t vocab_size) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() / chars_per_token + 1);
  for (size_t pos = 0; pos < text.size(); pos += chars_per_token) {
    // FNV-1a over the chunk, then mixed: equal chunks give equal tokens.
    uint64_t h = 0xcbf29ce484222325ULL;
    const size_t end = std::min(text.size(), pos + static_cast<size_t>(chars_per_token));
    for (size_t i = pos; i < end; ++i) {
      h = (h ^ static_cast<unsigned char>(text[i])) * 0x100000001b3ULL;
    }
    tokens.push_back(ToToken(Mix64(h), vocab_size));
  }
  return tokens;
}

}  // namespace vamp::workload
