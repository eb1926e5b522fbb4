// Minimal leveled logging: `VAMP_LOG(INFO) << "loaded " << n << " experts";`
// Text lines look like `I1129 18:05:20.123456 1234 file.cc:42] message` (glog's layout, which
// operators' tooling already parses). With SetLogFormat(kJson) every line is one JSON object
// (JSON Lines) for log shippers: {"ts":"2026-11-29T18:05:20.123456Z","level":"INFO","file":
// "file.cc","line":42,"tid":1234,"msg":"message"}. Lines go to stderr, or to the file given to
// SetLogFile. The threshold comes from SetMinLogLevel or the VAMP_LOG_LEVEL environment variable
// (DEBUG, INFO, WARNING, ERROR). Thread-safe: each line is written with one write(2), so lines
// from threads (and from processes appending to the same file) never interleave.
//
// Never log secrets (tokens, API keys) or request contents (prompts, outputs): logs are shipped
// and kept where secrets must not be.
#ifndef VAMP_COMMON_LOGGING_H_
#define VAMP_COMMON_LOGGING_H_

#include <sys/time.h>

#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

class Config;
class ConfigSchema;

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };
enum class LogFormat { kText, kJson };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error" (any case).
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

void SetLogFormat(LogFormat format);
// Parses "text" or "json".
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

// Appends every later line to `path` (created 0640 when missing) instead of stderr; an empty path
// goes back to stderr. The file is opened with O_APPEND, so `logrotate copytruncate` works and
// several processes (a controller and the agents it spawns) can share one file.
absl::Status SetLogFile(const std::string& path);

// What a process's log_level, log_format and log_file say.
struct LogOptions {
  std::string level = "info";   // debug | info | warning | error
  std::string format = "text";  // text | json
  std::string file;             // append here; empty: stderr
};

// Declares log_level, log_format and log_file in a process's schema (defaults: LogOptions).
void AddLogConfigFields(ConfigSchema& schema);
// The three fields of a config whose schema AddLogConfigFields declared them in.
LogOptions LogOptionsFromConfig(const Config& config);
// Applies `options`; errors name the field.
absl::Status ConfigureLogging(const LogOptions& options);

// Formats one line (newline included). Exposed for tests.
std::string FormatLogLine(LogFormat format, LogLevel level, const timeval& time, long thread_id,
                          absl::string_view file, int line, absl::string_view message);
// `text` as the body of a JSON string (no quotes): ", \ and control characters escaped, bytes that
// are not valid UTF-8 replaced by U+FFFD so that every line stays valid JSON.
std::string JsonEscape(absl::string_view text);

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts the process for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  timeval time_;
  std::ostringstream stream_;
};

// Swallows the stream expression when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace vamp

#define VAMP_LOG_LEVEL_DEBUG ::vamp::LogLevel::kDebug
#define VAMP_LOG_LEVEL_INFO ::vamp::LogLevel::kInfo
#define VAMP_LOG_LEVEL_WARNING ::vamp::LogLevel::kWarning
#define VAMP_LOG_LEVEL_ERROR ::vamp::LogLevel::kError
#define VAMP_LOG_LEVEL_FATAL ::vamp::LogLevel::kFatal

#define VAMP_LOG(severity)                                                                      \
  (VAMP_LOG_LEVEL_##severity < ::vamp::MinLogLevel())                                           \
      ? (void)0                                                                                 \
      : ::vamp::logging_internal::LogVoidify() &                                                \
            ::vamp::logging_internal::LogMessage(VAMP_LOG_LEVEL_##severity, __FILE__, __LINE__) \
                .stream()

// Aborts with a message when an internal invariant is broken (never for bad input: that is a
// Status).
#define VAMP_CHECK(cond) (cond) ? (void)0 : VAMP_LOG(FATAL) << "Check failed: " #cond " "

#endif  // VAMP_COMMON_LOGGING_H_
