// Encode throughput of a model folder's tokenizer.json on one thread.
// Usage: vamp_tokenizer_bench MODEL_DIR TEXT_FILE [SECONDS]
// The text is split into documents at blank lines (about prompt-sized pieces, as requests come),
// and every document is encoded; "cold" is the first pass over the corpus with a freshly loaded
// tokenizer (empty word cache), "warm" the steady state of repeated passes. Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_split.h"
#include "tokenizer/hf_tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: vamp_tokenizer_bench MODEL_DIR TEXT_FILE [SECONDS]\n";
    return 2;
  }
  const double seconds = argc > 3 ? std::atof(argv[3]) : 3.0;
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::cerr << argv[2] << ": cannot be read\n";
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> docs = absl::StrSplit(text, "\n\n", absl::SkipEmpty());
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  absl::StatusOr<std::unique_ptr<vamp::HfTokenizer>> t =
      vamp::HfTokenizer::FromModelFolder(argv[1]);
  if (!t.ok()) {
    std::cerr << t.status() << "\n";
    return 1;
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t bytes = 0, tokens = 0;
  for (const std::string& d : docs) bytes += d.size();
  auto pass = [&] {
    size_t n = 0;
    for (const std::string& d : docs) n += (*t)->Encode(d).size();
    return n;
  };
  const auto c0 = Clock::now();
  tokens = pass();
  const double cold_s = std::chrono::duration<double>(Clock::now() - c0).count();
  int passes = 0;
  const auto w0 = Clock::now();
  double warm_s = 0;
  do {
    pass();
    ++passes;
    warm_s = std::chrono::duration<double>(Clock::now() - w0).count();
  } while (warm_s < seconds);
  std::printf(
      "{\"impl\": \"vamp\", \"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.3f, "
      "\"cold_mb_per_s\": %.2f, \"warm_mb_per_s\": %.2f, \"warm_tokens_per_s\": %.0f}\n",
      docs.size(), bytes, tokens, load_s, bytes / cold_s / 1e6, bytes * passes / warm_s / 1e6,
      tokens * passes / warm_s);
  return 0;
}
