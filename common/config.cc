#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/version.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

const char* TypeName(ConfigSchema::Type type) {
  switch (type) {
    case ConfigSchema::Type::kInt:
      return "int";
    case ConfigSchema::Type::kDouble:
      return "float";
    case ConfigSchema::Type::kString:
      return "string";
    case ConfigSchema::Type::kBool:
      return "bool";
  }
  return "?";
}

std::string FormatValue(const ConfigSchema::Value& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&value)) return absl::StrFormat("%g", *d);
  if (const auto* s = std::get_if<std::string>(&value)) return absl::StrCat("\"", *s, "\"");
  return std::get<bool>(value) ? "true" : "false";
}

// Checks `value` against `field`'s type and range; returns the value to store.
absl::StatusOr<ConfigSchema::Value> Validate(const ConfigSchema::Field& field,
                                             const ConfigSchema::Value& value) {
  switch (field.type) {
    case ConfigSchema::Type::kInt: {
      const auto* i = std::get_if<int64_t>(&value);
      if (i == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", field.name, "': expected an integer"));
      }
      if (*i < static_cast<int64_t>(field.min) || *i > static_cast<int64_t>(field.max)) {
        return absl::OutOfRangeError(absl::StrFormat(
            "config field '%s': %d is outside the allowed range [%d, %d]", field.name, *i,
            static_cast<int64_t>(field.min), static_cast<int64_t>(field.max)));
      }
      return value;
    }
    case ConfigSchema::Type::kDouble: {
      double d;
      if (const auto* i = std::get_if<int64_t>(&value)) {
        d = static_cast<double>(*i);
      } else if (const auto* p = std::get_if<double>(&value)) {
        d = *p;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", field.name, "': expected a number"));
      }
      if (!std::isfinite(d) || d < field.min || d > field.max) {
        return absl::OutOfRangeError(
            absl::StrFormat("config field '%s': %g is outside the allowed range [%g, %g]",
                            field.name, d, field.min, field.max));
      }
      return ConfigSchema::Value(d);
    }
    case ConfigSchema::Type::kString: {
      const auto* s = std::get_if<std::string>(&value);
      if (s == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", field.name, "': expected a string"));
      }
      if (!field.choices.empty() &&
          std::find(field.choices.begin(), field.choices.end(), *s) == field.choices.end()) {
        return absl::InvalidArgumentError(absl::StrCat("config field '", field.name, "': '", *s,
                                                       "' is not one of ",
                                                       absl::StrJoin(field.choices, ", ")));
      }
      return value;
    }
    case ConfigSchema::Type::kBool:
      if (!std::holds_alternative<bool>(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", field.name, "': expected true or false"));
      }
      return value;
  }
  return absl::InternalError("unreachable");
}

}  // namespace

ConfigSchema& ConfigSchema::Add(Field field) {
  VAMP_CHECK(Find(field.name) == nullptr) << "config field declared twice: " << field.name;
  absl::StatusOr<Value> checked = Validate(field, field.default_value);
  VAMP_CHECK(checked.ok()) << "default of " << field.name << " invalid: " << checked.status();
  fields_.push_back(std::move(field));
  return *this;
}

ConfigSchema& ConfigSchema::Int(std::string name, int64_t default_value, int64_t min, int64_t max,
                                std::string help) {
  return Add({std::move(name), Type::kInt, default_value, static_cast<double>(min),
              static_cast<double>(max), {}, std::move(help)});
}

ConfigSchema& ConfigSchema::Double(std::string name, double default_value, double min, double max,
                                   std::string help) {
  return Add({std::move(name), Type::kDouble, default_value, min, max, {}, std::move(help)});
}

ConfigSchema& ConfigSchema::String(std::string name, std::string default_value, std::string help) {
  return Add({std::move(name), Type::kString, std::move(default_value), 0, 0, {}, std::move(help)});
}

ConfigSchema& ConfigSchema::Enum(std::string name, std::string default_value,
                                 std::vector<std::string> choices, std::string help) {
  return Add({std::move(name), Type::kString, std::move(default_value), 0, 0, std::move(choices),
              std::move(help)});
}

ConfigSchema& ConfigSchema::Bool(std::string name, bool default_value, std::string help) {
  return Add({std::move(name), Type::kBool, default_value, 0, 0, {}, std::move(help)});
}

const ConfigSchema::Field* ConfigSchema::Find(absl::string_view name) const {
  for (const Field& f : fields_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string ConfigSchema::HelpText(absl::string_view program, absl::string_view summary) const {
  std::string out = absl::StrCat("Usage: ", program, " [--config FILE] [--name=value ...]\n\n",
                                 summary, "\n\nOptions (defaults in brackets):\n");
  absl::StrAppend(&out, "  --help                 print this help and exit\n",
                  "  --version              print the version and exit\n",
                  "  --config FILE          read values from a JSON object file; flags override it\n");
  for (const Field& f : fields_) {
    std::string range;
    if (f.type == Type::kInt) {
      range = absl::StrFormat(", %d..%d", static_cast<int64_t>(f.min), static_cast<int64_t>(f.max));
    } else if (f.type == Type::kDouble) {
      range = absl::StrFormat(", %g..%g", f.min, f.max);
    } else if (!f.choices.empty()) {
      range = absl::StrCat(", one of ", absl::StrJoin(f.choices, "|"));
    }
    absl::StrAppend(&out, absl::StrFormat("  --%-20s %s [%s%s]\n", f.name, f.help,
                                          FormatValue(f.default_value), range));
  }
  return out;
}

Config::Config(const ConfigSchema& schema) : schema_(&schema) {
  for (const auto& f : schema.fields()) {
    values_[f.name] = f.default_value;
    set_[f.name] = false;
  }
}

absl::Status Config::Set(absl::string_view name, const ConfigSchema::Value& value) {
  const ConfigSchema::Field* field = schema_->Find(name);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown config field '", name, "'"));
  }
  absl::StatusOr<ConfigSchema::Value> checked = Validate(*field, value);
  if (!checked.ok()) return checked.status();
  values_.find(name)->second = *std::move(checked);
  set_.find(name)->second = true;
  return absl::OkStatus();
}

absl::Status Config::SetFromString(absl::string_view name, absl::string_view text) {
  const ConfigSchema::Field* field = schema_->Find(name);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown config field '", name, "'"));
  }
  const std::string stripped(absl::StripAsciiWhitespace(text));
  switch (field->type) {
    case ConfigSchema::Type::kInt: {
      int64_t v;
      if (!absl::SimpleAtoi(stripped, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", name, "': '", text, "' is not an integer"));
      }
      return Set(name, v);
    }
    case ConfigSchema::Type::kDouble: {
      double v;
      if (!absl::SimpleAtod(stripped, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", name, "': '", text, "' is not a number"));
      }
      return Set(name, v);
    }
    case ConfigSchema::Type::kString:
      return Set(name, std::string(text));
    case ConfigSchema::Type::kBool: {
      bool v;
      if (!absl::SimpleAtob(stripped, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config field '", name, "': '", text, "' is not true or false"));
      }
      return Set(name, v);
    }
  }
  return absl::InternalError("unreachable");
}

const ConfigSchema::Value& Config::Get(absl::string_view name, ConfigSchema::Type type) const {
  const ConfigSchema::Field* field = schema_->Find(name);
  VAMP_CHECK(field != nullptr) << "undeclared config field " << name;
  VAMP_CHECK(field->type == type) << "config field " << name << " is a " << TypeName(field->type)
                                  << ", read as " << TypeName(type);
  return values_.find(name)->second;
}

int64_t Config::GetInt(absl::string_view name) const {
  return std::get<int64_t>(Get(name, ConfigSchema::Type::kInt));
}
double Config::GetDouble(absl::string_view name) const {
  return std::get<double>(Get(name, ConfigSchema::Type::kDouble));
}
const std::string& Config::GetString(absl::string_view name) const {
  return std::get<std::string>(Get(name, ConfigSchema::Type::kString));
}
bool Config::GetBool(absl::string_view name) const {
  return std::get<bool>(Get(name, ConfigSchema::Type::kBool));
}

bool Config::IsSet(absl::string_view name) const {
  auto it = set_.find(name);
  return it != set_.end() && it->second;
}

std::string Config::DebugString() const {
  std::string out;
  for (const auto& f : schema_->fields()) {
    absl::StrAppend(&out, f.name, " = ", FormatValue(values_.find(f.name)->second), "\n");
  }
  return out;
}

absl::Status LoadConfigFile(const std::string& path, Config* config) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("config file '", path, "' cannot be read: ", std::strerror(errno)));
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' is not valid JSON: ", e.what()));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' must hold one JSON object of field values"));
  }
  for (const auto& [key, value] : doc.items()) {
    ConfigSchema::Value v;
    if (value.is_boolean()) {
      v = value.get<bool>();
    } else if (value.is_number_integer()) {
      v = value.get<int64_t>();
    } else if (value.is_number()) {
      v = value.get<double>();
    } else if (value.is_string()) {
      v = value.get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config file '", path, "': field '", key,
                                                     "' must be a number, string or bool"));
    }
    absl::Status s = config->Set(key, v);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("config file '", path, "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CommandLine> ParseCommandLine(const ConfigSchema& schema, int argc,
                                             const char* const* argv) {
  CommandLine out{Config(schema), {}, false, false};
  // First pass: --config and --help, so the file is applied before flags override it.
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") out.help_requested = true;
    if (arg == "--version") out.version_requested = true;
    if (arg == "--config") {
      if (i + 1 >= argc) return absl::InvalidArgumentError("--config needs a file path");
      config_path = argv[++i];
    } else if (arg.substr(0, 9) == "--config=") {
      config_path = std::string(arg.substr(9));
    }
  }
  if (out.help_requested || out.version_requested) return out;
  if (!config_path.empty()) {
    absl::Status s = LoadConfigFile(config_path, &out.config);
    if (!s.ok()) return s;
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) out.positional.emplace_back(argv[i]);
      break;
    }
    if (arg == "--config") {
      ++i;
      continue;
    }
    if (arg.substr(0, 9) == "--config=") continue;
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      out.positional.emplace_back(arg);
      continue;
    }
    absl::string_view body = arg.substr(2);
    size_t eq = body.find('=');
    std::string name(body.substr(0, eq));
    // Accept dashes for underscores: --max-num-seqs == --max_num_seqs.
    std::replace(name.begin(), name.end(), '-', '_');
    const ConfigSchema::Field* field = schema.Find(name);
    if (eq != absl::string_view::npos) {
      if (field == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", name, "' (see --help)"));
      }
      absl::Status s = out.config.SetFromString(name, body.substr(eq + 1));
      if (!s.ok()) return s;
      continue;
    }
    if (field == nullptr && name.substr(0, 3) == "no_") {
      const ConfigSchema::Field* negated = schema.Find(name.substr(3));
      if (negated != nullptr && negated->type == ConfigSchema::Type::kBool) {
        absl::Status s = out.config.Set(negated->name, false);
        if (!s.ok()) return s;
        continue;
      }
    }
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", name, "' (see --help)"));
    }
    if (field->type == ConfigSchema::Type::kBool) {
      absl::Status s = out.config.Set(name, true);
      if (!s.ok()) return s;
      continue;
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat("flag '--", name, "' needs a value"));
    }
    absl::Status s = out.config.SetFromString(name, argv[++i]);
    if (!s.ok()) return s;
  }
  return out;
}

namespace config_internal {

std::optional<CommandLine> ParseOrExit(const ConfigSchema& schema, absl::string_view program,
                                       absl::string_view summary, int argc, const char* const* argv,
                                       int* exit_code) {
  *exit_code = 0;
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, argc, argv);
  if (!cli.ok()) {
    PrintUsageError(program, cli.status());
    *exit_code = 2;
    return std::nullopt;
  }
  if (cli->version_requested) {
    std::printf("%s %s\n", std::string(program).c_str(), kVersion);
    return std::nullopt;
  }
  if (cli->help_requested) {
    std::fputs(schema.HelpText(program, summary).c_str(), stdout);
    return std::nullopt;
  }
  if (!cli->positional.empty()) {
    PrintUsageError(program, absl::InvalidArgumentError(absl::StrCat(
                                 "unexpected argument '", cli->positional[0], "' (see --help)")));
    *exit_code = 2;
    return std::nullopt;
  }
  return *std::move(cli);
}

void PrintUsageError(absl::string_view program, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", std::string(program).c_str(),
               std::string(status.message()).c_str());
}

}  // namespace config_internal

}  // namespace vamp
