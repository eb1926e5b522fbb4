// Minimal leveled logging to stderr: `VAMP_LOG(INFO) << "loaded " << n << " experts";`
// Lines look like `I1129 18:05:20.123456 1234 file.cc:42] message` (glog's layout, which
// operators' tooling already parses). The threshold comes from SetMinLogLevel or the
// VAMP_LOG_LEVEL environment variable (DEBUG, INFO, WARNING, ERROR). Thread-safe: each line is
// written with one call.
#ifndef VAMP_COMMON_LOGGING_H_
#define VAMP_COMMON_LOGGING_H_

#include <sstream>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace vamp {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error" (any case).
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts the process for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
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

#define VAMP_LOG(severity)                                                          \
  (VAMP_LOG_LEVEL_##severity < ::vamp::MinLogLevel())                               \
      ? (void)0                                                                     \
      : ::vamp::logging_internal::LogVoidify() &                                    \
            ::vamp::logging_internal::LogMessage(VAMP_LOG_LEVEL_##severity, __FILE__, \
                                                 __LINE__)                          \
                .stream()

// Aborts with a message when an internal invariant is broken (never for bad input: that is a
// Status).
#define VAMP_CHECK(cond) \
  (cond) ? (void)0 : VAMP_LOG(FATAL) << "Check failed: " #cond " "

#endif  // VAMP_COMMON_LOGGING_H_
