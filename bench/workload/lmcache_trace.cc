#include "bench/workload/lmcache_trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "bench/workload/token_synth.h"
#include "nlohmann/json.hpp"

namespace vamp::workload {
namespace {

struct Call {
  int64_t timestamp_us;
  std::vector<int32_t> prompt;
  int32_t output_tokens;
};

absl::StatusOr<std::vector<Call>> ReadSession(const std::string& path,
                                              const LmcacheOptions& options) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::vector<Call> calls;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
    };
    if (record.is_discarded() || !record.is_object()) return error("not a JSON object");
    if (!record.contains("timestamp") || !record["timestamp"].is_number_integer()) {
      return error("field 'timestamp' must be an integer (microseconds)");
    }
    if (!record.contains("input") || !record["input"].is_string()) {
      return error("field 'input' must be a string");
    }
    if (!record.contains("output") || !record["output"].is_string()) {
      return error("field 'output' must be a string");
    }
    const std::string& input = record["input"].get_ref<const std::string&>();
    const std::string& output = record["output"].get_ref<const std::string&>();
    Call call{record["timestamp"].get<int64_t>(), {}, 1};
    if (options.tokenizer != nullptr) {
      call.prompt = options.tokenizer->Encode(input);
      for (int32_t id : call.prompt) {
        if (id < 0 || id >= options.vocab_size) {
          return error(absl::StrCat(
              "the tokenizer '", options.tokenizer->name(), "' gave token id ", id,
              " for 'input', outside the model's vocabulary [0, ", options.vocab_size, ")"));
        }
      }
      call.output_tokens =
          static_cast<int32_t>(std::max<size_t>(1, options.tokenizer->Encode(output).size()));
    } else {
      call.prompt = TokenizeText(input, options.chars_per_token, options.vocab_size);
      call.output_tokens = static_cast<int32_t>(std::max<size_t>(
          1, (output.size() + options.chars_per_token - 1) / options.chars_per_token));
    }
    calls.push_back(std::move(call));
  }
  std::stable_sort(calls.begin(), calls.end(),
                   [](const Call& a, const Call& b) { return a.timestamp_us < b.timestamp_us; });
  return calls;
}

}  // namespace

absl::StatusOr<Workload> ReadLmcacheTraces(const std::string& directory,
                                           const LmcacheOptions& options) {
  if (options.vocab_size <= 0 || options.chars_per_token <= 0 || options.num_sessions < 0 ||
      options.stagger_s < 0 || !(options.time_scale > 0)) {
    return absl::InvalidArgumentError(
        "LMCache options: vocab_size and chars_per_token must be positive, num_sessions and "
        "stagger_s non-negative, time_scale positive");
  }
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".jsonl") {
      files.push_back(entry.path().string());
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot list LMCache trace folder '", directory, "': ", ec.message()));
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LMCache trace folder '", directory, "' has no .jsonl files"));
  }
  std::sort(files.begin(), files.end());
  std::vector<std::vector<Call>> sessions;
  for (const std::string& file : files) {
    absl::StatusOr<std::vector<Call>> calls = ReadSession(file, options);
    if (!calls.ok()) return calls.status();
    sessions.push_back(*std::move(calls));
  }
  const int32_t n =
      options.num_sessions == 0 ? static_cast<int32_t>(files.size()) : options.num_sessions;
  Workload workload;
  workload.name = absl::StrCat("lmcache:", std::filesystem::path(directory).filename().string());
  workload.vocab_size = options.vocab_size;
  for (int32_t k = 0; k < n; ++k) {
    const size_t file = k % files.size();
    const std::vector<Call>& calls = sessions[file];
    Session session;
    session.id = absl::StrCat(std::filesystem::path(files[file]).stem().string(), "#", k);
    session.start_s = k * options.stagger_s;
    for (const Call& call : calls) {
      const double offset =
          static_cast<double>(call.timestamp_us - calls.front().timestamp_us) * 1e-6 *
          options.time_scale;
      if (options.max_session_duration_s > 0 && offset > options.max_session_duration_s) break;
      Turn turn;
      turn.arrival_offset_s = offset;
      turn.after_previous = !session.turns.empty();
      turn.new_tokens = call.prompt;  // the full logged prompt; it carries its own history
      turn.output_tokens = call.output_tokens;
      session.turns.push_back(std::move(turn));
    }
    if (!session.turns.empty()) workload.sessions.push_back(std::move(session));
  }
  return workload;
}

}  // namespace vamp::workload
