// Configuration as data: every value a process reads is declared once in a ConfigSchema with its
// type, default, allowed range and help text. Values come from, in increasing precedence: the
// defaults, an optional config file (`--config FILE`, a flat JSON object), and command-line flags
// (`--name=value`, `--name value`, `--flag`/`--no-flag` for booleans). Every rejected value gives
// an error that names the field and says what is allowed.
#ifndef VAMP_COMMON_CONFIG_H_
#define VAMP_COMMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

class ConfigSchema {
 public:
  enum class Type { kInt, kDouble, kString, kBool };
  using Value = std::variant<int64_t, double, std::string, bool>;

  struct Field {
    std::string name;
    Type type;
    Value default_value;
    // Inclusive range for kInt and kDouble.
    double min = 0;
    double max = 0;
    // Non-empty for enumerated strings: the allowed values.
    std::vector<std::string> choices;
    std::string help;
  };

  // Declarations return *this so a schema reads as one expression. Declaring a name twice or a
  // default outside its own range is a programming error and aborts.
  ConfigSchema& Int(std::string name, int64_t default_value, int64_t min, int64_t max,
                    std::string help);
  ConfigSchema& Double(std::string name, double default_value, double min, double max,
                       std::string help);
  ConfigSchema& String(std::string name, std::string default_value, std::string help);
  ConfigSchema& Enum(std::string name, std::string default_value, std::vector<std::string> choices,
                     std::string help);
  ConfigSchema& Bool(std::string name, bool default_value, std::string help);

  const Field* Find(absl::string_view name) const;
  const std::vector<Field>& fields() const { return fields_; }

  // Help text listing every field with its type, default, range and help.
  std::string HelpText(absl::string_view program, absl::string_view summary) const;

 private:
  ConfigSchema& Add(Field field);
  std::vector<Field> fields_;
};

// Values for every field of a schema. Getters abort on an undeclared name or a type mismatch
// (a programming error, not bad input).
class Config {
 public:
  explicit Config(const ConfigSchema& schema);

  // Parses `text` as the field's type and checks its range. Errors name the field.
  absl::Status SetFromString(absl::string_view name, absl::string_view text);
  // Same for an already typed value (config files); ints are accepted for double fields.
  absl::Status Set(absl::string_view name, const ConfigSchema::Value& value);

  int64_t GetInt(absl::string_view name) const;
  double GetDouble(absl::string_view name) const;
  const std::string& GetString(absl::string_view name) const;
  bool GetBool(absl::string_view name) const;

  // Whether the value was given by a file or flag rather than left at its default.
  bool IsSet(absl::string_view name) const;

  const ConfigSchema& schema() const { return *schema_; }
  // "name = value" lines in schema order, for start-up logs.
  std::string DebugString() const;

 private:
  const ConfigSchema::Value& Get(absl::string_view name, ConfigSchema::Type type) const;
  const ConfigSchema* schema_;
  std::map<std::string, ConfigSchema::Value, std::less<>> values_;
  std::map<std::string, bool, std::less<>> set_;
};

// Loads a flat JSON object of field values into `config`. Unknown keys are errors.
absl::Status LoadConfigFile(const std::string& path, Config* config);

struct CommandLine {
  Config config;
  std::vector<std::string> positional;
  bool help_requested = false;
  bool version_requested = false;  // --version: print the name and kVersion, then exit 0
};

// Parses argv[1..]: --help/-h, --version, --config FILE, --name=value, --name value, --flag, --no-flag, and
// `--` ending flags. On error nothing is applied partially that the caller could see.
absl::StatusOr<CommandLine> ParseCommandLine(const ConfigSchema& schema, int argc,
                                             const char* const* argv);

// What a binary's command line asks of it: run with `options`, or return `exit_code` now.
template <typename Options>
struct Invocation {
  std::optional<Options> options;  // empty: return exit_code from main at once
  int exit_code = 0;
};

namespace config_internal {

// ParseInvocation's parsing: nullopt (and *exit_code set) when main should return at once.
std::optional<CommandLine> ParseOrExit(const ConfigSchema& schema, absl::string_view program,
                                       absl::string_view summary, int argc, const char* const* argv,
                                       int* exit_code);
// "<program>: <message>" on stderr.
void PrintUsageError(absl::string_view program, const absl::Status& status);

template <typename T>
absl::StatusOr<T> AsStatusOr(T value) {
  return value;
}
template <typename T>
absl::StatusOr<T> AsStatusOr(absl::StatusOr<T> value) {
  return value;
}

}  // namespace config_internal

// The start of every VAMP binary's main, the same for all: parses argv against `schema` and binds
// the values with `bind` (const Config& -> Options, or absl::StatusOr<Options>: the binary's one
// reader of its flags by name). --help prints schema.HelpText(program, summary) and --version
// "<program> <kVersion>" to stdout (exit code 0); a bad flag, a positional argument or a value
// `bind` refuses prints "<program>: <error>" to stderr (exit code 2).
template <typename Bind>
auto ParseInvocation(const ConfigSchema& schema, absl::string_view program,
                     absl::string_view summary, int argc, const char* const* argv, Bind bind) {
  using Bound = decltype(config_internal::AsStatusOr(bind(std::declval<const Config&>())));
  Invocation<typename Bound::value_type> out;
  std::optional<CommandLine> cli =
      config_internal::ParseOrExit(schema, program, summary, argc, argv, &out.exit_code);
  if (!cli.has_value()) return out;
  Bound options = config_internal::AsStatusOr(bind(cli->config));
  if (!options.ok()) {
    config_internal::PrintUsageError(program, options.status());
    out.exit_code = 2;
    return out;
  }
  out.options = *std::move(options);
  return out;
}

}  // namespace vamp

#endif  // VAMP_COMMON_CONFIG_H_
