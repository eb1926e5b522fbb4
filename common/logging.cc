#include "common/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace vamp {
namespace {

LogLevel InitialLevel() {
  const char* env = std::getenv("VAMP_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  absl::StatusOr<LogLevel> level = ParseLogLevel(env);
  return level.ok() ? *level : LogLevel::kInfo;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level(static_cast<int>(InitialLevel()));
  return level;
}

}  // namespace

void SetMinLogLevel(LogLevel level) { MinLevelStorage().store(static_cast<int>(level)); }

LogLevel MinLogLevel() { return static_cast<LogLevel>(MinLevelStorage().load()); }

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", name, "' is not one of debug, info, warning, error"));
}

namespace logging_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = "DIWEF";
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm local;
  localtime_r(&tv.tv_sec, &local);
  const char* base = file;
  for (const char* p = file; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %ld ",
                kLetters[static_cast<int>(level)], local.tm_mon + 1, local.tm_mday, local.tm_hour,
                local.tm_min, local.tm_sec, static_cast<long>(tv.tv_usec),
                static_cast<long>(syscall(SYS_gettid)));
  stream_ << prefix << base << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  if (level_ == LogLevel::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace logging_internal
}  // namespace vamp
