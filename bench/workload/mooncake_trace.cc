#include "bench/workload/mooncake_trace.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "bench/workload/token_synth.h"
#include "nlohmann/json.hpp"

namespace vamp::workload {
namespace {

absl::Status LineError(const std::string& path, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

}  // namespace

absl::StatusOr<Workload> ReadMooncakeTrace(const std::string& path,
                                           const MooncakeOptions& options) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read Mooncake trace '", path, "': ", std::strerror(errno)));
  }
  if (options.vocab_size <= 0 || options.trace_block_tokens <= 0 || !(options.time_scale > 0)) {
    return absl::InvalidArgumentError(
        "Mooncake options: vocab_size, trace_block_tokens and time_scale must be positive");
  }
  Workload workload;
  workload.name = "mooncake";
  workload.vocab_size = options.vocab_size;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) continue;
    if (options.max_requests > 0 &&
        static_cast<int64_t>(workload.sessions.size()) >= options.max_requests) {
      break;
    }
    nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      return LineError(path, line, "not a JSON object");
    }
    for (const char* field : {"timestamp", "input_length", "output_length"}) {
      if (!record.contains(field) || !record[field].is_number_integer() ||
          record[field].get<int64_t>() < 0) {
        return LineError(path, line,
                         absl::StrCat("field '", field, "' must be a non-negative integer"));
      }
    }
    if (!record.contains("hash_ids") || !record["hash_ids"].is_array()) {
      return LineError(path, line, "field 'hash_ids' must be an array of integers");
    }
    const int64_t input_length = record["input_length"].get<int64_t>();
    const auto& hash_ids = record["hash_ids"];
    const int64_t expected_blocks =
        (input_length + options.trace_block_tokens - 1) / options.trace_block_tokens;
    if (static_cast<int64_t>(hash_ids.size()) != expected_blocks) {
      return LineError(path, line,
                       absl::StrCat("field 'hash_ids' has ", hash_ids.size(), " ids but input_length ",
                                    input_length, " needs ", expected_blocks));
    }
    Turn turn;
    turn.arrival_offset_s =
        static_cast<double>(record["timestamp"].get<int64_t>()) * 1e-3 * options.time_scale;
    turn.output_tokens = static_cast<int32_t>(std::max<int64_t>(1, record["output_length"]));
    turn.new_tokens.reserve(input_length);
    int64_t remaining = input_length;
    for (const auto& id : hash_ids) {
      if (!id.is_number_integer()) {
        return LineError(path, line, "field 'hash_ids' must hold only integers");
      }
      const int32_t n =
          static_cast<int32_t>(std::min<int64_t>(remaining, options.trace_block_tokens));
      std::vector<int32_t> block = TokensForHashBlock(id.get<int64_t>(), n, options.vocab_size);
      turn.new_tokens.insert(turn.new_tokens.end(), block.begin(), block.end());
      remaining -= n;
    }
    Session session;
    session.id = absl::StrCat("mooncake-", line);
    session.turns.push_back(std::move(turn));
    workload.sessions.push_back(std::move(session));
  }
  if (workload.sessions.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Mooncake trace '", path, "' has no records"));
  }
  return workload;
}

}  // namespace vamp::workload
