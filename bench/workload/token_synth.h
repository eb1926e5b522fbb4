// Deterministic token ids for workloads that carry no token ids of their own. Equal inputs give
// equal tokens, so shared prefixes in a trace become shared token prefixes.
#ifndef VAMP_BENCH_WORKLOAD_TOKEN_SYNTH_H_
#define VAMP_BENCH_WORKLOAD_TOKEN_SYNTH_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace vamp::workload {

// A 64-bit mix (splitmix64's finaliser); stable across platforms and runs.
uint64_t Mix64(uint64_t x);

// `count` tokens standing for the block of a trace whose hash id is `hash_id` (Mooncake's 512-
// token blocks): token i is a function of (hash_id, i) only.
std::vector<int32_t> TokensForHashBlock(int64_t hash_id, int32_t count, int32_t vocab_size);

// `count` tokens of stream `stream` under `seed` (synthetic prompts, simulated outputs).
std::vector<int32_t> SyntheticTokens(uint64_t seed, uint64_t stream, int64_t count,
                                     int32_t vocab_size);

// Turns text into tokens at a fixed `chars_per_token` (one token per chunk of that many bytes
// from the start of the text). Texts sharing a prefix share the tokens of its whole chunks,
// which is how a real tokenizer behaves on a shared prefix, up to the chunk boundary.
std::vector<int32_t> TokenizeText(absl::string_view text, int32_t chars_per_token,
                                  int32_t vocab_size);

}  // namespace vamp::workload

#endif  // VAMP_BENCH_WORKLOAD_TOKEN_SYNTH_H_
