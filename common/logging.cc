#include "common/logging.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"

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

std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
// Where lines go. A replaced file descriptor is never closed: a thread may be writing to it, and
// a process sets its log file once at start-up.
std::atomic<int> g_fd{STDERR_FILENO};

constexpr char kLetters[] = "DIWEF";
constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};

absl::string_view BaseName(absl::string_view file) {
  const size_t slash = file.rfind('/');
  return slash == absl::string_view::npos ? file : file.substr(slash + 1);
}

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
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

void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat("log format '", name, "' is not text or json"));
}

absl::Status SetLogFile(const std::string& path) {
  if (path.empty()) {
    g_fd.store(STDERR_FILENO);
    return absl::OkStatus();
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open log file '", path, "' for appending: ", std::strerror(errno)));
  }
  g_fd.store(fd);
  return absl::OkStatus();
}

void AddLogConfigFields(ConfigSchema& schema) {
  const LogOptions d;
  schema.String("log_level", d.level, "debug | info | warning | error")
      .Enum("log_format", d.format, {"text", "json"},
            "text: glog-style lines; json: one JSON object per line (ts, level, file, line, "
            "tid, msg) for log shippers")
      .String("log_file", d.file,
              "append log lines to this file instead of stderr (created when missing; "
              "O_APPEND, so logrotate's copytruncate works); empty: stderr");
}

LogOptions LogOptionsFromConfig(const Config& config) {
  LogOptions o;
  o.level = config.GetString("log_level");
  o.format = config.GetString("log_format");
  o.file = config.GetString("log_file");
  return o;
}

absl::Status ConfigureLogging(const LogOptions& options) {
  absl::StatusOr<LogLevel> level = ParseLogLevel(options.level);
  if (!level.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'log_level': ", level.status().message()));
  }
  absl::StatusOr<LogFormat> format = ParseLogFormat(options.format);
  if (!format.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'log_format': ", format.status().message()));
  }
  if (absl::Status s = SetLogFile(options.file); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'log_file': ", s.message()));
  }
  SetMinLogLevel(*level);
  SetLogFormat(*format);
  return absl::OkStatus();
}

std::string JsonEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string FormatLogLine(LogFormat format, LogLevel level, const timeval& time, long thread_id,
                          absl::string_view file, int line, absl::string_view message) {
  const int l = static_cast<int>(level);
  const absl::string_view base = BaseName(file);
  if (format == LogFormat::kJson) {
    tm utc;
    gmtime_r(&time.tv_sec, &utc);
    char ts[64];
    std::snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", utc.tm_year + 1900,
                  utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                  static_cast<long>(time.tv_usec));
    return absl::StrCat("{\"ts\":\"", ts, "\",\"level\":\"", kLevelNames[l], "\",\"file\":\"",
                        JsonEscape(base), "\",\"line\":", line, ",\"tid\":", thread_id,
                        ",\"msg\":\"", JsonEscape(message), "\"}\n");
  }
  tm local;
  localtime_r(&time.tv_sec, &local);
  char prefix[96];
  std::snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %ld ", kLetters[l],
                local.tm_mon + 1, local.tm_mday, local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<long>(time.tv_usec), thread_id);
  return absl::StrCat(prefix, base, ":", line, "] ", message, "\n");
}

namespace logging_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {
  gettimeofday(&time_, nullptr);
}

LogMessage::~LogMessage() {
  const std::string text =
      FormatLogLine(static_cast<LogFormat>(g_format.load()), level_, time_,
                    static_cast<long>(syscall(SYS_gettid)), file_, line_, stream_.str());
  const int fd = g_fd.load();
  // One write per line; a short write (full disk) loses the rest of the line, never blocks.
  ssize_t written = ::write(fd, text.data(), text.size());
  (void)written;
  if (level_ == LogLevel::kFatal) {
    if (fd != STDERR_FILENO) {
      written = ::write(STDERR_FILENO, text.data(), text.size());
      (void)written;
    }
    std::abort();
  }
}

}  // namespace logging_internal
}  // namespace vamp
