// The wire formats vamp-bench reads: Server-Sent Events (the /v1/completions stream), the
// OpenAI-compatible completion chunks inside them, and the Prometheus text exposition of
// /metrics. Transport-free, so tests feed canned bytes.
#ifndef VAMP_BENCH_VAMP_BENCH_PROTOCOL_H_
#define VAMP_BENCH_VAMP_BENCH_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp::bench {

// Incremental text/event-stream parser. Bytes may arrive split anywhere (inside a line, between
// "\r" and "\n"). Each event's data lines ("data:" with one optional space stripped), joined by
// "\n", go to the callback when the blank line ending the event arrives; comment lines (":")
// and other fields are ignored. Not thread-safe.
class SseParser {
 public:
  using EventCallback = std::function<void(absl::string_view data)>;
  void Feed(absl::string_view bytes, const EventCallback& on_event);
  // Bytes held that do not yet form a complete line.
  size_t buffered() const { return buffer_.size(); }

 private:
  std::string buffer_;
  std::string data_;
  bool has_data_ = false;
};

// One "data:" payload of a streaming completion.
struct CompletionChunk {
  bool done = false;  // the "[DONE]" marker
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // empty while the request runs
  std::string error;          // choice-level "error" or an {"error": {...}} body's message
  bool has_usage = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1 = absent
};

// InvalidArgument (quoting the start of the payload) when `data` is neither "[DONE]" nor a JSON
// object of the completions API.
absl::StatusOr<CompletionChunk> ParseCompletionChunk(absl::string_view data);

// The request body vamp-bench sends: token-id prompt, streaming with usage, exact length
// (ignore_eos), greedy. `model` is left out when empty (the server's only model).
std::string CompletionRequestBody(const std::vector<int32_t>& prompt, int32_t max_tokens,
                                  const std::string& model);

// One sample of a Prometheus text exposition: metric name, its labels, value.
struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Parses the text format (version 0.0.4): comments and blank lines skipped, label values
// unescaped, NaN/+Inf/-Inf accepted, an optional timestamp ignored. InvalidArgument naming the
// line number for a malformed line.
absl::StatusOr<std::vector<PromSample>> ParsePrometheusText(absl::string_view text);

}  // namespace vamp::bench

#endif  // VAMP_BENCH_VAMP_BENCH_PROTOCOL_H_
