#include "tokenizer/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tokenizer/utf8.h"

namespace vamp {
namespace jinja {
namespace {

using OJson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python
struct MacroDef;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kMacro
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // also a namespace's attributes
  const MacroDef* macro = nullptr;

  static Value Of(Kind kind) {
    Value x;
    x.kind = kind;
    return x;
  }
  static Value None() { return Of(Kind::kNone); }
  static Value Bool(bool v) {
    Value x = Of(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value Int(int64_t v) {
    Value x = Of(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value Float(double v) {
    Value x = Of(Kind::kFloat);
    x.f = v;
    return x;
  }
  static Value Str(std::string v) {
    Value x = Of(Kind::kString);
    x.s = std::move(v);
    return x;
  }
  static Value MakeList(List v = {}) {
    Value x = Of(Kind::kList);
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value MakeDict(Dict v = {}) {
    Value x = Of(Kind::kDict);
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double number() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }
  const Value* Find(absl::string_view key) const {
    if (dict == nullptr) return nullptr;
    for (const auto& [k, v] : *dict) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "mapping";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kMacro:
      return "macro";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->empty();
    default:
      return true;
  }
}

Value FromJson(const OJson& j) {
  switch (j.type()) {
    case OJson::value_t::null:
      return Value::None();
    case OJson::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case OJson::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case OJson::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(std::min<uint64_t>(j.get<uint64_t>(), INT64_MAX)));
    case OJson::value_t::number_float:
      return Value::Float(j.get<double>());
    case OJson::value_t::string:
      return Value::Str(j.get<std::string>());
    case OJson::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const OJson& e : j) l.push_back(FromJson(e));
      return Value::MakeList(std::move(l));
    }
    case OJson::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), FromJson(it.value()));
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::None();
  }
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// Python's json.dumps(ensure_ascii=False) string escaping.
void JsonQuote(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Python's json.dumps with ensure_ascii=False: separators ", " / ": " (or ",", ": " with an
// indent), keys in insertion order unless sort_keys.
absl::Status ToJson(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  if (depth > 256) return absl::InvalidArgumentError("tojson: value nested too deeply");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += v.b ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      absl::StrAppend(out, v.i);
      return absl::OkStatus();
    case Kind::kFloat:
      if (std::isnan(v.f)) {
        *out += "NaN";
      } else if (std::isinf(v.f)) {
        *out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(v.f);
      }
      return absl::OkStatus();
    case Kind::kString:
      JsonQuote(v.s, out);
      return absl::OkStatus();
    case Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        absl::Status s = ToJson((*v.list)[k], indent, sort_keys, depth + 1, out);
        if (!s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.dict->empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        JsonQuote(items[k]->first, out);
        *out += ": ";
        absl::Status s = ToJson(items[k]->second, indent, sort_keys, depth + 1, out);
        if (!s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Kind::kMacro:
      return absl::InvalidArgumentError("tojson: a macro is not serializable");
  }
  return absl::OkStatus();
}

std::string Repr(const Value& v, int depth = 0);

// Python's str() of a value, as Jinja prints it.
std::string Str(const Value& v, int depth = 0) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(v.i);
    case Kind::kFloat:
      return FloatRepr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kMacro:
      return "<macro>";
    default:
      return Repr(v, depth);
  }
}

std::string Repr(const Value& v, int depth) {
  if (depth > 64) return "...";
  switch (v.kind) {
    case Kind::kString: {
      // Python prefers single quotes unless the string holds one and no double quote.
      const bool dq = absl::StrContains(v.s, '\'') && !absl::StrContains(v.s, '"');
      const char q = dq ? '"' : '\'';
      std::string out(1, q);
      for (char c : v.s) {
        if (c == q || c == '\\') {
          out.push_back('\\');
          out.push_back(c);
        } else if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else {
          out.push_back(c);
        }
      }
      out.push_back(q);
      return out;
    }
    case Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += Repr((*v.list)[k], depth + 1);
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        if (!first) out += ", ";
        first = false;
        out += Repr(Value::Str(k), depth + 1) + ": " + Repr(x, depth + 1);
      }
      return out + "}";
    }
    case Kind::kNamespace:
      return "<Namespace>";
    default:
      return Str(v, depth);
  }
}

bool Equal(const Value& a, const Value& b, int depth = 0) {
  if (depth > 128) return false;
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind == Kind::kBool && b.is_number()) return (a.b ? 1.0 : 0.0) == b.number();
  if (b.kind == Kind::kBool && a.is_number()) return (b.b ? 1.0 : 0.0) == a.number();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a.b == b.b;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      }
      return true;
    case Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.Find(k);
        if (o == nullptr || !Equal(v, *o, depth + 1)) return false;
      }
      return true;
    default:
      return a.dict == b.dict && a.macro == b.macro;
  }
}

bool IsAscii(absl::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// ---------------------------------------------------------------------------------------------
// Lexer: template text -> text / {{ }} / {% %} pieces; tag contents -> tokens.
// ---------------------------------------------------------------------------------------------

enum class TokType { kName, kInt, kFloat, kString, kOp, kEnd };
struct Tok {
  TokType type;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

struct Piece {
  enum Type { kText, kExpr, kStmt } type;
  std::string text;
  int line;
};

absl::Status SyntaxError(absl::string_view origin, int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ":", line, ": ", message));
}

absl::StatusOr<std::vector<Tok>> LexTag(absl::string_view s, absl::string_view origin, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (absl::ascii_isalpha(c) || c == '_') {
      size_t j = i;
      while (j < s.size() && (absl::ascii_isalnum(s[j]) || s[j] == '_')) ++j;
      out.push_back({TokType::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (absl::ascii_isdigit(c)) {
      size_t j = i;
      while (j < s.size() && (absl::ascii_isdigit(s[j]) || s[j] == '_')) ++j;
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' && absl::ascii_isdigit(s[j + 1])) {
        is_float = true;
        ++j;
        while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && absl::ascii_isdigit(s[k])) {
          is_float = true;
          j = k;
          while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
        }
      }
      std::string num;
      for (char d : s.substr(i, j - i)) {
        if (d != '_') num.push_back(d);
      }
      Tok t{is_float ? TokType::kFloat : TokType::kInt, num};
      if (is_float) {
        t.f = std::strtod(num.c_str(), nullptr);
      } else {
        auto r = std::from_chars(num.data(), num.data() + num.size(), t.i);
        if (r.ec != std::errc()) return SyntaxError(origin, line, "integer literal out of range");
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string str;
      size_t j = i + 1;
      bool closed = false;
      while (j < s.size()) {
        if (s[j] == c) {
          closed = true;
          ++j;
          break;
        }
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[j + 1];
          j += 2;
          switch (e) {
            case 'n':
              str.push_back('\n');
              break;
            case 't':
              str.push_back('\t');
              break;
            case 'r':
              str.push_back('\r');
              break;
            case '\\':
              str.push_back('\\');
              break;
            case '\'':
              str.push_back('\'');
              break;
            case '"':
              str.push_back('"');
              break;
            case '0':
              str.push_back('\0');
              break;
            case 'u': {
              if (j + 4 > s.size()) return SyntaxError(origin, line, "bad \\u escape");
              unsigned cp = 0;
              auto r = std::from_chars(s.data() + j, s.data() + j + 4, cp, 16);
              if (r.ptr != s.data() + j + 4) return SyntaxError(origin, line, "bad \\u escape");
              AppendUtf8(cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp, &str);
              j += 4;
              break;
            }
            default:  // Python keeps unknown escapes as they are
              str.push_back('\\');
              str.push_back(e);
          }
          continue;
        }
        str.push_back(s[j++]);
      }
      if (!closed) return SyntaxError(origin, line, "unterminated string literal");
      out.push_back({TokType::kString, std::move(str)});
      i = j;
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[",
                                   "]",  "{",  "}",  ".",  ",",  ":",  "|", "~", "+",
                                   "-",  "*",  "/",  "%",  "<",  ">",  "="};
      bool found = false;
      for (const char* op : kOps) {
        if (absl::StartsWith(s.substr(i), op)) {
          out.push_back({TokType::kOp, op});
          i += std::char_traits<char>::length(op);
          found = true;
          break;
        }
      }
      if (!found) {
        return SyntaxError(origin, line,
                           absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
    }
  }
  out.push_back({TokType::kEnd, ""});
  return out;
}

// Splits the source into pieces, applying whitespace control ({%- -%}) and the trim_blocks /
// lstrip_blocks behaviour Hugging Face enables.
absl::StatusOr<std::vector<Piece>> Split(absl::string_view src, absl::string_view origin) {
  std::vector<Piece> pieces;
  size_t i = 0;
  int line = 1;
  bool strip_next = false;    // a "-" closed the previous tag
  bool trim_newline = false;  // trim_blocks after a block/comment tag
  auto count_lines = [](absl::string_view s) {
    return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  };
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != absl::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != absl::string_view::npos && open + 1 >= src.size()) open = absl::string_view::npos;
    std::string text(src.substr(i, open == absl::string_view::npos ? src.size() - i : open - i));
    const int text_line = line;
    line += count_lines(text);
    if (trim_newline) {
      if (absl::StartsWith(text, "\n")) {
        text.erase(0, 1);
      } else if (absl::StartsWith(text, "\r\n")) {
        text.erase(0, 2);
      }
    }
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && absl::ascii_isspace(text[k])) ++k;
      text.erase(0, k);
    }
    strip_next = trim_newline = false;
    if (open == absl::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::kText, std::move(text), text_line});
      break;
    }
    const char kind = src[open + 1];
    size_t body = open + 2;
    bool strip_before = false, no_lstrip = false;
    if (body < src.size() && src[body] == '-') {
      strip_before = true;
      ++body;
    } else if (body < src.size() && src[body] == '+') {
      no_lstrip = true;
      ++body;
    }
    if (strip_before) {
      size_t k = text.size();
      while (k > 0 && absl::ascii_isspace(text[k - 1])) --k;
      text.resize(k);
    } else if (kind != '{' && !no_lstrip) {
      // lstrip_blocks: spaces and tabs between the line start and the tag go.
      size_t p = open;
      while (p > 0 && (src[p - 1] == ' ' || src[p - 1] == '\t')) --p;
      if (p == 0 || src[p - 1] == '\n') {
        size_t k = text.size();
        while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
        text.resize(k);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::kText, std::move(text), text_line});
    // Find the closing delimiter, skipping string literals.
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t j = body;
    size_t end = absl::string_view::npos;
    char quote = 0;
    while (j < src.size()) {
      const char c = src[j];
      if (kind != '#' && quote != 0) {
        if (c == '\\') {
          j += 2;
          continue;
        }
        if (c == quote) quote = 0;
      } else if (kind != '#' && (c == '\'' || c == '"')) {
        quote = c;
      } else if (src.substr(j, 2) == close) {
        end = j;
        break;
      }
      ++j;
    }
    if (end == absl::string_view::npos) {
      return SyntaxError(origin, line, absl::StrCat("unclosed '{", std::string(1, kind), "'"));
    }
    size_t content_end = end;
    if (content_end > body && src[content_end - 1] == '-') {
      strip_next = true;
      --content_end;
    } else if (content_end > body && src[content_end - 1] == '+') {
      --content_end;
    } else if (kind != '{') {
      trim_newline = true;
    }
    const std::string content(src.substr(body, content_end - body));
    if (kind == '{') pieces.push_back({Piece::kExpr, content, line});
    if (kind == '%') pieces.push_back({Piece::kStmt, content, line});
    line += count_lines(src.substr(open, end + 2 - open));
    i = end + 2;
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------------
// AST
// ---------------------------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum Type {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kCond,
    kList,
    kDict
  } type;
  int line = 0;
  Value literal;
  std::string name;  // kName, kAttr attribute, kFilter/kTest name, kBinary operator
  ExprPtr a, b, c;   // operands; kSlice: object a, start b, stop c, step d
  ExprPtr d;
  std::vector<Arg> args;  // kCall / kFilter / kTest arguments; kList / kDict elements
  bool negated = false;   // kTest "is not"
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct MacroDef {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null when none
  Body body;
};

struct Node {
  enum Type { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue } type;
  int line = 0;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kFor iterable, kSet value
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body, else_body;                            // kFor, kIf else, kSetBlock, kMacro (body)
  std::vector<std::string> targets;  // kFor loop variables, kSet target (1 or 2 parts)
  ExprPtr filter;                    // kFor "if" filter
  std::unique_ptr<MacroDef> macro;   // kMacro
};

const std::set<std::string>& KnownFilters() {
  static const auto* s = new std::set<std::string>{
      "tojson",     "length",   "count",     "trim",   "upper",  "lower",   "title",
      "capitalize", "string",   "int",       "float",  "list",   "join",    "first",
      "last",       "reverse",  "default",   "d",      "items",  "replace", "selectattr",
      "rejectattr", "map",      "sort",      "unique", "indent", "safe",    "abs",
      "round",      "dictsort", "wordcount", "center", "e",      "escape",  "batch",
      "sum",        "min",      "max",       "attr",   "select", "reject"};
  return *s;
}
const std::set<std::string>& KnownTests() {
  static const auto* s = new std::set<std::string>{
      "defined", "undefined",   "none",     "string",  "number",   "integer", "float",
      "mapping", "iterable",    "sequence", "boolean", "true",     "false",   "odd",
      "even",    "divisibleby", "eq",       "equalto", "==",       "ne",      "!=",
      "lt",      "<",           "gt",       ">",       "le",       "<=",      "ge",
      ">=",      "in",          "lower",    "upper",   "callable", "sameas"};
  return *s;
}
const std::set<std::string>& KnownMethods() {
  static const auto* s = new std::set<std::string>{
      "startswith", "endswith", "split",      "rsplit",  "strip", "lstrip", "rstrip", "upper",
      "lower",      "title",    "capitalize", "replace", "find",  "rfind",  "count",  "splitlines",
      "join",       "items",    "keys",       "values",  "get",   "index",  "append", "isdigit",
      "isalpha",    "isspace",  "isupper",    "islower", "zfill"};
  return *s;
}
const std::set<std::string>& KnownGlobals() {
  static const auto* s =
      new std::set<std::string>{"range", "namespace", "raise_exception", "strftime_now", "dict"};
  return *s;
}

class Parser {
 public:
  Parser(std::vector<Tok> toks, absl::string_view origin, int line)
      : toks_(std::move(toks)), origin_(origin), line_(line) {}

  absl::StatusOr<ExprPtr> Expression() { return Ternary(); }
  // An expression without a top-level ternary (a for loop's iterable, before its "if" filter).
  absl::StatusOr<ExprPtr> OrExpression() { return Or(); }
  bool AtEnd() const { return toks_[pos_].type == TokType::kEnd; }
  const Tok& Peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == TokType::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view n, size_t ahead = 0) const {
    return Peek(ahead).type == TokType::kName && Peek(ahead).text == n;
  }
  void Advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  absl::Status Expect(absl::string_view op) {
    if (!IsOp(op)) return Error(absl::StrCat("expected '", op, "', got '", Peek().text, "'"));
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Name() {
    if (Peek().type != TokType::kName)
      return Error(absl::StrCat("expected a name, got '", Peek().text, "'"));
    std::string n = Peek().text;
    Advance();
    return n;
  }
  absl::Status Error(absl::string_view message) const {
    return SyntaxError(origin_, line_, message);
  }
  absl::Status ExpectEnd() {
    if (!AtEnd()) return Error(absl::StrCat("unexpected '", Peek().text, "'"));
    return absl::OkStatus();
  }

 private:
  ExprPtr Make(Expr::Type t) {
    auto e = std::make_unique<Expr>();
    e->type = t;
    e->line = line_;
    return e;
  }
  absl::Status Deeper() {
    if (++depth_ > 100) return Error("expression nested too deeply");
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> Ternary() {
    absl::Status d = Deeper();
    if (!d.ok()) return d;
    absl::StatusOr<ExprPtr> value = Or();
    if (!value.ok()) return value;
    while (IsName("if")) {
      Advance();
      absl::StatusOr<ExprPtr> cond = Or();
      if (!cond.ok()) return cond;
      ExprPtr e = Make(Expr::kCond);
      e->a = std::move(*cond);
      e->b = std::move(*value);
      if (IsName("else")) {
        Advance();
        absl::StatusOr<ExprPtr> other = Ternary();
        if (!other.ok()) return other;
        e->c = std::move(*other);
      }
      *value = std::move(e);
    }
    --depth_;
    return value;
  }
  absl::StatusOr<ExprPtr> Or() { return LeftAssociative(&Parser::And, Expr::kOr, {}, "or"); }
  absl::StatusOr<ExprPtr> And() { return LeftAssociative(&Parser::Not, Expr::kAnd, {}, "and"); }
  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      Advance();
      absl::Status d = Deeper();
      if (!d.ok()) return d;
      absl::StatusOr<ExprPtr> inner = Not();
      --depth_;
      if (!inner.ok()) return inner;
      ExprPtr e = Make(Expr::kNot);
      e->a = std::move(*inner);
      return e;
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
    absl::StatusOr<ExprPtr> left = Add();
    if (!left.ok()) return left;
    while (true) {
      std::string op;
      if (Peek().type == TokType::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Peek().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      absl::StatusOr<ExprPtr> right = Add();
      if (!right.ok()) return right;
      *left = Join(Expr::kBinary, op, std::move(*left), std::move(*right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> Add() {
    return LeftAssociative(&Parser::Concat, Expr::kBinary, {"+", "-"});
  }
  absl::StatusOr<ExprPtr> Concat() { return LeftAssociative(&Parser::Mul, Expr::kBinary, {"~"}); }
  absl::StatusOr<ExprPtr> Mul() {
    return LeftAssociative(&Parser::Pow, Expr::kBinary, {"*", "/", "//", "%"});
  }
  // Left-associative, as in Jinja (not right-associative as in Python).
  absl::StatusOr<ExprPtr> Pow() { return LeftAssociative(&Parser::Unary, Expr::kBinary, {"**"}); }

  // `type` node (its name the operator) joining `a` and `b`.
  ExprPtr Join(Expr::Type type, std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(type);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  // One left-associative level of binary operators: operands parsed by `next`, joined by any of
  // the operator tokens `ops` or, when `keyword` is set, by that keyword ("and", "or").
  absl::StatusOr<ExprPtr> LeftAssociative(absl::StatusOr<ExprPtr> (Parser::*next)(),
                                          Expr::Type type,
                                          std::initializer_list<absl::string_view> ops,
                                          absl::string_view keyword = {}) {
    absl::StatusOr<ExprPtr> left = (this->*next)();
    if (!left.ok()) return left;
    while (true) {
      std::string op;
      if (!keyword.empty() && IsName(keyword)) {
        op = std::string(keyword);
      } else {
        for (absl::string_view o : ops) {
          if (IsOp(o)) {
            op = Peek().text;
            break;
          }
        }
      }
      if (op.empty()) return left;
      Advance();
      absl::StatusOr<ExprPtr> right = (this->*next)();
      if (!right.ok()) return right;
      *left = Join(type, std::move(op), std::move(*left), std::move(*right));
    }
  }

  absl::StatusOr<ExprPtr> Unary() {
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Advance();
      absl::Status d = Deeper();
      if (!d.ok()) return d;
      absl::StatusOr<ExprPtr> inner = Unary();
      --depth_;
      if (!inner.ok()) return inner;
      if (!neg) return inner;
      ExprPtr e = Make(Expr::kNeg);
      e->a = std::move(*inner);
      return e;
    }
    absl::StatusOr<ExprPtr> primary = Primary();
    if (!primary.ok()) return primary;
    absl::StatusOr<ExprPtr> postfix = Postfix(std::move(*primary));
    if (!postfix.ok()) return postfix;
    return FiltersAndTests(std::move(*postfix));
  }
  absl::StatusOr<std::vector<Arg>> CallArgs() {  // after "("
    std::vector<Arg> args;
    while (!IsOp(")")) {
      Arg arg;
      if (Peek().type == TokType::kName && IsOp("=", 1)) {
        arg.name = Peek().text;
        Advance();
        Advance();
      }
      absl::StatusOr<ExprPtr> v = Ternary();
      if (!v.ok()) return v.status();
      arg.value = std::move(*v);
      args.push_back(std::move(arg));
      if (IsOp(",")) {
        Advance();
      } else if (!IsOp(")")) {
        return Error(absl::StrCat("expected ',' or ')', got '", Peek().text, "'"));
      }
    }
    Advance();
    return args;
  }
  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        Advance();
        absl::StatusOr<std::string> attr = Name();
        if (!attr.ok()) {
          if (Peek().type == TokType::kInt) {  // x.0
            ExprPtr item = Make(Expr::kItem);
            item->a = std::move(e);
            item->b = Make(Expr::kLiteral);
            item->b->literal = Value::Int(Peek().i);
            Advance();
            e = std::move(item);
            continue;
          }
          return attr.status();
        }
        ExprPtr a = Make(Expr::kAttr);
        a->a = std::move(e);
        a->name = *attr;
        e = std::move(a);
      } else if (IsOp("[")) {
        Advance();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            absl::StatusOr<ExprPtr> v = Ternary();
            if (!v.ok()) return v;
            parts[k] = std::move(*v);
          }
          if (IsOp(":") && k < 2) {
            slice = true;
            Advance();
          } else {
            break;
          }
        }
        absl::Status s = Expect("]");
        if (!s.ok()) return s;
        if (slice) {
          ExprPtr sl = Make(Expr::kSlice);
          sl->a = std::move(e);
          sl->b = std::move(parts[0]);
          sl->c = std::move(parts[1]);
          sl->d = std::move(parts[2]);
          e = std::move(sl);
        } else {
          if (parts[0] == nullptr) return Error("empty subscript");
          ExprPtr item = Make(Expr::kItem);
          item->a = std::move(e);
          item->b = std::move(parts[0]);
          e = std::move(item);
        }
      } else if (IsOp("(")) {
        Advance();
        if (e->type == Expr::kAttr && !KnownMethods().count(e->name)) {
          return Error(absl::StrCat("method '", e->name, "' is not supported"));
        }
        if (e->type == Expr::kName && !KnownGlobals().count(e->name)) {
          // A macro defined in the template; checked when called.
          macro_calls_.push_back(e->name);
        }
        absl::StatusOr<std::vector<Arg>> args = CallArgs();
        if (!args.ok()) return args.status();
        ExprPtr call = Make(Expr::kCall);
        call->a = std::move(e);
        call->args = std::move(*args);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }
  absl::StatusOr<ExprPtr> FiltersAndTests(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Advance();
        absl::StatusOr<std::string> name = Name();
        if (!name.ok()) return name.status();
        if (!KnownFilters().count(*name)) {
          return Error(absl::StrCat("filter '", *name, "' is not supported"));
        }
        ExprPtr f = Make(Expr::kFilter);
        f->name = *name;
        f->a = std::move(e);
        if (IsOp("(")) {
          Advance();
          absl::StatusOr<std::vector<Arg>> args = CallArgs();
          if (!args.ok()) return args.status();
          f->args = std::move(*args);
        }
        e = std::move(f);
      } else if (IsName("is")) {
        Advance();
        ExprPtr t = Make(Expr::kTest);
        if (IsName("not")) {
          t->negated = true;
          Advance();
        }
        std::string name;
        if (Peek().type == TokType::kName) {
          name = Peek().text;
        } else if (Peek().type == TokType::kOp) {
          name = Peek().text;
        } else {
          return Error("expected a test name after 'is'");
        }
        Advance();
        if (!KnownTests().count(name))
          return Error(absl::StrCat("test '", name, "' is not supported"));
        t->name = name;
        t->a = std::move(e);
        if (IsOp("(")) {
          Advance();
          absl::StatusOr<std::vector<Arg>> args = CallArgs();
          if (!args.ok()) return args.status();
          t->args = std::move(*args);
        } else if (Peek().type != TokType::kEnd && !IsOp(")") && !IsOp("]") && !IsOp(",") &&
                   !IsOp("}") && !IsOp(":") && !IsName("and") && !IsName("or") && !IsName("if") &&
                   !IsName("else") && !IsOp("|") &&
                   (Peek().type == TokType::kString || Peek().type == TokType::kInt ||
                    Peek().type == TokType::kFloat || Peek().type == TokType::kName)) {
          // One argument without parentheses: "x is divisibleby 3", "x is sameas none".
          absl::StatusOr<ExprPtr> arg = Primary();
          if (!arg.ok()) return arg;
          t->args.push_back({"", std::move(*arg)});
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  absl::StatusOr<ExprPtr> Primary() {
    const Tok t = Peek();
    if (t.type == TokType::kString) {
      Advance();
      std::string s = t.text;
      while (Peek().type == TokType::kString) {  // adjacent literals concatenate
        s += Peek().text;
        Advance();
      }
      ExprPtr e = Make(Expr::kLiteral);
      e->literal = Value::Str(std::move(s));
      return e;
    }
    if (t.type == TokType::kInt || t.type == TokType::kFloat) {
      Advance();
      ExprPtr e = Make(Expr::kLiteral);
      e->literal = t.type == TokType::kInt ? Value::Int(t.i) : Value::Float(t.f);
      return e;
    }
    if (t.type == TokType::kName) {
      Advance();
      ExprPtr e = Make(Expr::kLiteral);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        e->type = Expr::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == TokType::kOp && (t.text == "(" || t.text == "[")) {
      const bool paren = t.text == "(";
      Advance();
      absl::Status d = Deeper();
      if (!d.ok()) return d;
      ExprPtr list = Make(Expr::kList);
      bool tuple = !paren;
      const char* close = paren ? ")" : "]";
      while (!IsOp(close)) {
        absl::StatusOr<ExprPtr> v = Ternary();
        if (!v.ok()) return v;
        list->args.push_back({"", std::move(*v)});
        if (IsOp(",")) {
          tuple = true;
          Advance();
        } else if (!IsOp(close)) {
          return Error(absl::StrCat("expected ',' or '", close, "'"));
        }
      }
      Advance();
      --depth_;
      if (paren && !tuple) {
        if (list->args.size() != 1) return Error("empty parentheses");
        return std::move(list->args[0].value);
      }
      return list;
    }
    if (t.type == TokType::kOp && t.text == "{") {
      Advance();
      absl::Status d = Deeper();
      if (!d.ok()) return d;
      ExprPtr dict = Make(Expr::kDict);
      while (!IsOp("}")) {
        absl::StatusOr<ExprPtr> k = Ternary();
        if (!k.ok()) return k;
        absl::Status s = Expect(":");
        if (!s.ok()) return s;
        absl::StatusOr<ExprPtr> v = Ternary();
        if (!v.ok()) return v;
        dict->args.push_back({"", std::move(*k)});
        dict->args.push_back({"", std::move(*v)});
        if (IsOp(",")) {
          Advance();
        } else if (!IsOp("}")) {
          return Error("expected ',' or '}'");
        }
      }
      Advance();
      --depth_;
      return dict;
    }
    return Error(absl::StrCat("unexpected '", t.text.empty() ? "end of tag" : t.text, "'"));
  }

  std::vector<Tok> toks_;
  size_t pos_ = 0;
  std::string origin_;
  int line_;
  int depth_ = 0;

 public:
  std::vector<std::string> macro_calls_;
};

}  // namespace

struct Program {
  Body body;
  std::string origin;
};

namespace {

// Builds the statement tree from the pieces.
class TreeBuilder {
 public:
  TreeBuilder(std::vector<Piece> pieces, absl::string_view origin)
      : pieces_(std::move(pieces)), origin_(origin) {}

  absl::Status Build(Body* body) {
    std::string end;
    absl::Status s = Block(body, {}, &end);
    if (!s.ok()) return s;
    for (const std::string& m : macro_calls_) {
      if (!macros_.count(m)) {
        return SyntaxError(origin_, 0, absl::StrCat("function '", m, "' is not supported"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<Parser> TagParser(const Piece& p) {
    absl::StatusOr<std::vector<Tok>> toks = LexTag(p.text, origin_, p.line);
    if (!toks.ok()) return toks.status();
    return Parser(*std::move(toks), origin_, p.line);
  }

  // Parses nodes until one of `ends` (a statement keyword) and stores it in *end.
  absl::Status Block(Body* body, const std::set<std::string>& ends, std::string* end,
                     std::unique_ptr<Parser>* end_parser = nullptr) {
    if (++depth_ > 64) return SyntaxError(origin_, 0, "blocks nested too deeply");
    while (pos_ < pieces_.size()) {
      const Piece& p = pieces_[pos_++];
      auto node = std::make_unique<Node>();
      node->line = p.line;
      if (p.type == Piece::kText) {
        node->type = Node::kText;
        node->text = p.text;
        body->push_back(std::move(node));
        continue;
      }
      absl::StatusOr<Parser> parser = TagParser(p);
      if (!parser.ok()) return parser.status();
      if (p.type == Piece::kExpr) {
        absl::StatusOr<ExprPtr> e = parser->Expression();
        if (!e.ok()) return e.status();
        absl::Status s = parser->ExpectEnd();
        if (!s.ok()) return s;
        Collect(*parser);
        node->type = Node::kOutput;
        node->expr = std::move(*e);
        body->push_back(std::move(node));
        continue;
      }
      absl::StatusOr<std::string> keyword = parser->Name();
      if (!keyword.ok()) return keyword.status();
      if (ends.count(*keyword)) {
        *end = *keyword;
        if (end_parser != nullptr) *end_parser = std::make_unique<Parser>(std::move(*parser));
        --depth_;
        return absl::OkStatus();
      }
      absl::Status s = Statement(*keyword, *parser, node.get());
      if (!s.ok()) return s;
      body->push_back(std::move(node));
    }
    if (!ends.empty()) {
      return SyntaxError(origin_, pieces_.empty() ? 0 : pieces_.back().line,
                         absl::StrCat("missing {% ", *ends.begin(), " %}"));
    }
    --depth_;
    return absl::OkStatus();
  }

  void Collect(const Parser& p) {
    macro_calls_.insert(macro_calls_.end(), p.macro_calls_.begin(), p.macro_calls_.end());
  }

  absl::Status Statement(const std::string& keyword, Parser& parser, Node* node) {
    if (keyword == "if") {
      node->type = Node::kIf;
      absl::StatusOr<ExprPtr> cond = parser.Expression();
      if (!cond.ok()) return cond.status();
      absl::Status s = parser.ExpectEnd();
      if (!s.ok()) return s;
      Collect(parser);
      while (true) {
        Body branch;
        std::string end;
        std::unique_ptr<Parser> end_parser;
        s = Block(&branch, {"elif", "else", "endif"}, &end, &end_parser);
        if (!s.ok()) return s;
        node->branches.emplace_back(std::move(*cond), std::move(branch));
        if (end == "endif") return end_parser->ExpectEnd();
        if (end == "else") {
          s = end_parser->ExpectEnd();
          if (!s.ok()) return s;
          s = Block(&node->else_body, {"endif"}, &end, &end_parser);
          if (!s.ok()) return s;
          return end_parser->ExpectEnd();
        }
        cond = end_parser->Expression();  // elif
        if (!cond.ok()) return cond.status();
        s = end_parser->ExpectEnd();
        if (!s.ok()) return s;
        Collect(*end_parser);
      }
    }
    if (keyword == "for") {
      node->type = Node::kFor;
      while (true) {
        absl::StatusOr<std::string> target = parser.Name();
        if (!target.ok()) return target.status();
        node->targets.push_back(*target);
        if (!parser.IsOp(",")) break;
        parser.Advance();
      }
      if (!parser.IsName("in")) return parser.Error("expected 'in' in for");
      parser.Advance();
      // The iterable stops before an inline "if" filter (not a ternary here).
      absl::StatusOr<ExprPtr> iter = IterableExpr(parser);
      if (!iter.ok()) return iter.status();
      node->expr = std::move(*iter);
      if (parser.IsName("if")) {
        parser.Advance();
        absl::StatusOr<ExprPtr> f = parser.Expression();
        if (!f.ok()) return f.status();
        node->filter = std::move(*f);
      }
      if (parser.IsName("recursive")) return parser.Error("recursive loops are not supported");
      absl::Status s = parser.ExpectEnd();
      if (!s.ok()) return s;
      Collect(parser);
      std::string end;
      std::unique_ptr<Parser> end_parser;
      s = Block(&node->body, {"else", "endfor"}, &end, &end_parser);
      if (!s.ok()) return s;
      if (end == "else") {
        s = Block(&node->else_body, {"endfor"}, &end, &end_parser);
        if (!s.ok()) return s;
      }
      return end_parser->ExpectEnd();
    }
    if (keyword == "set") {
      absl::StatusOr<std::string> target = parser.Name();
      if (!target.ok()) return target.status();
      node->targets.push_back(*target);
      if (parser.IsOp(".")) {
        parser.Advance();
        absl::StatusOr<std::string> attr = parser.Name();
        if (!attr.ok()) return attr.status();
        node->targets.push_back(*attr);
      }
      if (parser.IsOp(",")) return parser.Error("tuple assignment is not supported");
      if (parser.AtEnd()) {
        node->type = Node::kSetBlock;
        std::string end;
        std::unique_ptr<Parser> end_parser;
        absl::Status s = Block(&node->body, {"endset"}, &end, &end_parser);
        if (!s.ok()) return s;
        return end_parser->ExpectEnd();
      }
      node->type = Node::kSet;
      absl::Status s = parser.Expect("=");
      if (!s.ok()) return s;
      absl::StatusOr<ExprPtr> value = parser.Expression();
      if (!value.ok()) return value.status();
      node->expr = std::move(*value);
      Collect(parser);
      return parser.ExpectEnd();
    }
    if (keyword == "macro") {
      node->type = Node::kMacro;
      node->macro = std::make_unique<MacroDef>();
      absl::StatusOr<std::string> name = parser.Name();
      if (!name.ok()) return name.status();
      node->macro->name = *name;
      absl::Status s = parser.Expect("(");
      if (!s.ok()) return s;
      while (!parser.IsOp(")")) {
        absl::StatusOr<std::string> param = parser.Name();
        if (!param.ok()) return param.status();
        ExprPtr def;
        if (parser.IsOp("=")) {
          parser.Advance();
          absl::StatusOr<ExprPtr> v = parser.Expression();
          if (!v.ok()) return v.status();
          def = std::move(*v);
        }
        node->macro->params.emplace_back(*param, std::move(def));
        if (parser.IsOp(",")) {
          parser.Advance();
        } else if (!parser.IsOp(")")) {
          return parser.Error("expected ',' or ')' in macro parameters");
        }
      }
      parser.Advance();
      s = parser.ExpectEnd();
      if (!s.ok()) return s;
      Collect(parser);
      macros_.insert(*name);
      std::string end;
      std::unique_ptr<Parser> end_parser;
      s = Block(&node->macro->body, {"endmacro"}, &end, &end_parser);
      if (!s.ok()) return s;
      return absl::OkStatus();
    }
    if (keyword == "break" || keyword == "continue") {
      node->type = keyword == "break" ? Node::kBreak : Node::kContinue;
      return parser.ExpectEnd();
    }
    return parser.Error(absl::StrCat("statement '", keyword, "' is not supported"));
  }

  // An expression without a top-level ternary "if" (for-loop iterables).
  absl::StatusOr<ExprPtr> IterableExpr(Parser& parser) { return parser.OrExpression(); }

  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  std::string origin_;
  int depth_ = 0;
  std::set<std::string> macros_;
  std::vector<std::string> macro_calls_;
};

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

constexpr int64_t kMaxSteps = 2'000'000;
constexpr size_t kMaxOutput = 64 << 20;
constexpr int kMaxMacroDepth = 32;

bool IsPySpace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string Encode(const std::vector<char32_t>& cps, size_t from, size_t to) {
  std::string out;
  for (size_t k = from; k < to; ++k) AppendUtf8(cps[k], &out);
  return out;
}

// Python's str.strip / lstrip / rstrip; `chars` null: whitespace.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<char32_t> set;
  if (chars != nullptr) set = DecodeUtf8(*chars);
  auto strip = [&](char32_t c) {
    return chars == nullptr ? IsPySpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t a = 0, b = cps.size();
  if (left) {
    while (a < b && strip(cps[a])) ++a;
  }
  if (right) {
    while (b > a && strip(cps[b - 1])) --b;
  }
  if (IsAscii(s)) return s.substr(a, b - a);
  return Encode(cps, a, b);
}

std::vector<std::string> SplitWhitespace(const std::string& s, int64_t maxsplit) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<std::string> out;
  size_t k = 0;
  while (k < cps.size()) {
    while (k < cps.size() && IsPySpace(cps[k])) ++k;
    if (k >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > k && IsPySpace(cps[end - 1])) --end;
      out.push_back(Encode(cps, k, end));
      break;
    }
    size_t j = k;
    while (j < cps.size() && !IsPySpace(cps[j])) ++j;
    out.push_back(Encode(cps, k, j));
    k = j;
  }
  return out;
}

std::string CaseMap(const std::string& s, int mode) {  // 0 lower, 1 upper (ASCII letters only)
  std::string out = s;
  for (char& c : out) c = mode == 0 ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
  return out;
}

class Renderer {
 public:
  Renderer(const Program& program, std::string* out) : program_(program), out_(out) {}

  absl::Status Run(const OJson& variables) {
    scopes_.emplace_back();
    if (variables.is_object()) {
      for (auto it = variables.begin(); it != variables.end(); ++it) {
        scopes_[0].emplace_back(it.key(), FromJson(it.value()));
      }
    }
    Flow flow = Flow::kNormal;
    return Exec(program_.body, &flow);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::vector<std::pair<std::string, Value>>;

  absl::Status Error(int line, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(program_.origin, ":", line, ": ", message));
  }
  absl::Status Step(int line) {
    if (++steps_ > kMaxSteps) return Error(line, "template took too many steps");
    if (out_->size() > kMaxOutput) return Error(line, "template output is too large");
    return absl::OkStatus();
  }

  Value* Lookup(const std::string& name) {
    for (size_t k = scopes_.size(); k > 0; --k) {
      for (auto& [n, v] : scopes_[k - 1]) {
        if (n == name) return &v;
      }
    }
    return nullptr;
  }
  void Assign(const std::string& name, Value v) {
    Frame& f = scopes_.back();
    for (auto& [n, x] : f) {
      if (n == name) {
        x = std::move(v);
        return;
      }
    }
    f.emplace_back(name, std::move(v));
  }

  absl::Status Exec(const Body& body, Flow* flow) {
    for (const auto& node : body) {
      absl::Status s = Step(node->line);
      if (!s.ok()) return s;
      switch (node->type) {
        case Node::kText:
          out_->append(node->text);
          break;
        case Node::kOutput: {
          absl::StatusOr<Value> v = Eval(*node->expr);
          if (!v.ok()) return v.status();
          out_->append(Str(*v));
          break;
        }
        case Node::kIf: {
          bool taken = false;
          for (const auto& [cond, branch] : node->branches) {
            absl::StatusOr<Value> c = Eval(*cond);
            if (!c.ok()) return c.status();
            if (Truthy(*c)) {
              s = Exec(branch, flow);
              if (!s.ok()) return s;
              taken = true;
              break;
            }
          }
          if (!taken) {
            s = Exec(node->else_body, flow);
            if (!s.ok()) return s;
          }
          if (*flow != Flow::kNormal) return absl::OkStatus();
          break;
        }
        case Node::kFor:
          s = ExecFor(*node);
          if (!s.ok()) return s;
          break;
        case Node::kSet: {
          absl::StatusOr<Value> v = Eval(*node->expr);
          if (!v.ok()) return v.status();
          s = SetTarget(*node, *std::move(v));
          if (!s.ok()) return s;
          break;
        }
        case Node::kSetBlock: {
          std::string captured;
          std::string* saved = out_;
          out_ = &captured;
          Flow inner = Flow::kNormal;
          s = Exec(node->body, &inner);
          out_ = saved;
          if (!s.ok()) return s;
          s = SetTarget(*node, Value::Str(std::move(captured)));
          if (!s.ok()) return s;
          break;
        }
        case Node::kMacro: {
          Value m = Value::Of(Kind::kMacro);
          m.macro = node->macro.get();
          Assign(node->macro->name, std::move(m));
          break;
        }
        case Node::kBreak:
          *flow = Flow::kBreak;
          return absl::OkStatus();
        case Node::kContinue:
          *flow = Flow::kContinue;
          return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  // Whether `v` is, or holds at any depth, the container whose storage is `target`. Containers
  // share storage (shared_ptr), so storing such a value inside that container would make a cycle
  // that is never freed (found by fuzz_chat_template: {% set ns.a = ns %}).
  // Values nested deeper than kMaxHoldsDepth count as holding it (refused rather than walked).
  static bool Holds(const Value& v, const void* target, int depth = 0) {
    constexpr int kMaxHoldsDepth = 256;
    if (depth > kMaxHoldsDepth) return true;
    if (v.list != nullptr) {
      if (v.list.get() == target) return true;
      for (const Value& x : *v.list) {
        if (Holds(x, target, depth + 1)) return true;
      }
    }
    if (v.dict != nullptr) {
      if (v.dict.get() == target) return true;
      for (const auto& [k, x] : *v.dict) {
        if (Holds(x, target, depth + 1)) return true;
      }
    }
    return false;
  }

  absl::Status SetTarget(const Node& node, Value v) {
    if (node.targets.size() == 1) {
      Assign(node.targets[0], std::move(v));
      return absl::OkStatus();
    }
    Value* ns = Lookup(node.targets[0]);
    if (ns == nullptr || ns->kind != Kind::kNamespace) {
      return Error(node.line, absl::StrCat("'", node.targets[0], "' is not a namespace"));
    }
    if (Holds(v, ns->dict.get())) {
      return Error(node.line, absl::StrCat("'", node.targets[0], ".", node.targets[1],
                                           "' cannot hold the namespace itself"));
    }
    for (auto& [k, x] : *ns->dict) {
      if (k == node.targets[1]) {
        x = std::move(v);
        return absl::OkStatus();
      }
    }
    ns->dict->emplace_back(node.targets[1], std::move(v));
    return absl::OkStatus();
  }

  absl::StatusOr<List> Iterate(const Value& v, int line) {
    switch (v.kind) {
      case Kind::kList:
        return *v.list;
      case Kind::kDict: {
        List keys;
        for (const auto& [k, x] : *v.dict) keys.push_back(Value::Str(k));
        return keys;
      }
      case Kind::kString: {
        List chars;
        for (char32_t c : DecodeUtf8(v.s)) {
          std::string one;
          AppendUtf8(c, &one);
          chars.push_back(Value::Str(std::move(one)));
        }
        return chars;
      }
      case Kind::kUndefined:
      case Kind::kNone:
        if (v.kind == Kind::kUndefined) return List{};
        [[fallthrough]];
      default:
        return Error(line, absl::StrCat("cannot iterate over a ", KindName(v.kind)));
    }
  }

  absl::Status ExecFor(const Node& node) {
    absl::StatusOr<Value> iterable = Eval(*node.expr);
    if (!iterable.ok()) return iterable.status();
    absl::StatusOr<List> items = Iterate(*iterable, node.line);
    if (!items.ok()) return items.status();
    scopes_.emplace_back();
    auto bind = [&](const Value& item) -> absl::Status {
      if (node.targets.size() == 1) {
        Assign(node.targets[0], item);
        return absl::OkStatus();
      }
      if (item.kind != Kind::kList || item.list->size() != node.targets.size()) {
        return Error(node.line, "cannot unpack a loop item into the loop variables");
      }
      for (size_t k = 0; k < node.targets.size(); ++k) Assign(node.targets[k], (*item.list)[k]);
      return absl::OkStatus();
    };
    List selected;
    if (node.filter != nullptr) {
      for (const Value& item : *items) {
        absl::Status s = bind(item);
        if (!s.ok()) return s;
        absl::StatusOr<Value> keep = Eval(*node.filter);
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) selected.push_back(item);
      }
    } else {
      selected = *std::move(items);
    }
    const int64_t n = static_cast<int64_t>(selected.size());
    for (int64_t k = 0; k < n; ++k) {
      absl::Status s = Step(node.line);
      if (!s.ok()) return s;
      s = bind(selected[k]);
      if (!s.ok()) return s;
      Dict loop = {{"index", Value::Int(k + 1)},
                   {"index0", Value::Int(k)},
                   {"revindex", Value::Int(n - k)},
                   {"revindex0", Value::Int(n - k - 1)},
                   {"first", Value::Bool(k == 0)},
                   {"last", Value::Bool(k == n - 1)},
                   {"length", Value::Int(n)},
                   {"previtem", k > 0 ? selected[k - 1] : Value()},
                   {"nextitem", k + 1 < n ? selected[k + 1] : Value()}};
      Assign("loop", Value::MakeDict(std::move(loop)));
      Flow flow = Flow::kNormal;
      s = Exec(node.body, &flow);
      if (!s.ok()) return s;
      if (flow == Flow::kBreak) break;
    }
    if (n == 0) {
      Flow flow = Flow::kNormal;
      absl::Status s = Exec(node.else_body, &flow);
      if (!s.ok()) return s;
    }
    scopes_.pop_back();
    return absl::OkStatus();
  }

  // ---- expressions ----

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.type) {
      case Expr::kLiteral:
        return e.literal;
      case Expr::kName: {
        const Value* v = Lookup(e.name);
        return v == nullptr ? Value() : *v;
      }
      case Expr::kAttr: {
        absl::StatusOr<Value> obj = Eval(*e.a);
        if (!obj.ok()) return obj;
        if (obj->kind == Kind::kUndefined) {
          return Error(e.line, absl::StrCat("attribute '", e.name, "' of an undefined value"));
        }
        if (obj->dict != nullptr) {
          const Value* v = obj->Find(e.name);
          return v == nullptr ? Value() : *v;
        }
        return Value();
      }
      case Expr::kItem: {
        absl::StatusOr<Value> obj = Eval(*e.a);
        if (!obj.ok()) return obj;
        absl::StatusOr<Value> key = Eval(*e.b);
        if (!key.ok()) return key;
        return Item(*obj, *key, e.line);
      }
      case Expr::kSlice:
        return EvalSlice(e);
      case Expr::kCall:
        return EvalCall(e);
      case Expr::kFilter:
        return EvalFilter(e);
      case Expr::kTest: {
        absl::StatusOr<bool> r = EvalTest(e);
        if (!r.ok()) return r.status();
        return Value::Bool(*r != e.negated);
      }
      case Expr::kNot: {
        absl::StatusOr<Value> v = Eval(*e.a);
        if (!v.ok()) return v;
        return Value::Bool(!Truthy(*v));
      }
      case Expr::kNeg: {
        absl::StatusOr<Value> v = Eval(*e.a);
        if (!v.ok()) return v;
        if (v->kind == Kind::kInt) return Value::Int(-v->i);
        if (v->kind == Kind::kFloat) return Value::Float(-v->f);
        return Error(e.line, absl::StrCat("cannot negate a ", KindName(v->kind)));
      }
      case Expr::kAnd: {
        absl::StatusOr<Value> a = Eval(*e.a);
        if (!a.ok() || !Truthy(*a)) return a;
        return Eval(*e.b);
      }
      case Expr::kOr: {
        absl::StatusOr<Value> a = Eval(*e.a);
        if (!a.ok() || Truthy(*a)) return a;
        return Eval(*e.b);
      }
      case Expr::kCond: {
        absl::StatusOr<Value> c = Eval(*e.a);
        if (!c.ok()) return c;
        if (Truthy(*c)) return Eval(*e.b);
        if (e.c == nullptr) return Value();
        return Eval(*e.c);
      }
      case Expr::kList: {
        List l;
        for (const Arg& a : e.args) {
          absl::StatusOr<Value> v = Eval(*a.value);
          if (!v.ok()) return v;
          l.push_back(*std::move(v));
        }
        return Value::MakeList(std::move(l));
      }
      case Expr::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          absl::StatusOr<Value> key = Eval(*e.args[k].value);
          if (!key.ok()) return key;
          if (key->kind != Kind::kString) return Error(e.line, "dict keys must be strings");
          absl::StatusOr<Value> v = Eval(*e.args[k + 1].value);
          if (!v.ok()) return v;
          bool replaced = false;
          for (auto& [n, x] : d) {
            if (n == key->s) {
              x = *v;
              replaced = true;
            }
          }
          if (!replaced) d.emplace_back(key->s, *std::move(v));
        }
        return Value::MakeDict(std::move(d));
      }
      case Expr::kBinary:
        return EvalBinary(e);
    }
    return Error(e.line, "unknown expression");
  }

  absl::StatusOr<Value> Item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Kind::kUndefined) return Error(line, "subscript of an undefined value");
    if (obj.kind == Kind::kList || obj.kind == Kind::kString) {
      if (key.kind != Kind::kInt) return Value();
      if (obj.kind == Kind::kList) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value();
        return (*obj.list)[k];
      }
      const std::vector<char32_t> cps = DecodeUtf8(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      std::string one;
      AppendUtf8(cps[k], &one);
      return Value::Str(std::move(one));
    }
    if (obj.dict != nullptr && key.kind == Kind::kString) {
      const Value* v = obj.Find(key.s);
      return v == nullptr ? Value() : *v;
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    absl::StatusOr<Value> obj = Eval(*e.a);
    if (!obj.ok()) return obj;
    int64_t bound[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    const Expr* parts[3] = {e.b.get(), e.c.get(), e.d.get()};
    for (int k = 0; k < 3; ++k) {
      if (parts[k] == nullptr) continue;
      absl::StatusOr<Value> v = Eval(*parts[k]);
      if (!v.ok()) return v;
      if (v->kind == Kind::kNone) continue;
      if (v->kind != Kind::kInt) return Error(e.line, "slice indices must be integers");
      bound[k] = v->i;
      given[k] = true;
    }
    const int64_t step = bound[2];
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    std::vector<char32_t> cps;
    int64_t n;
    if (obj->kind == Kind::kList) {
      n = static_cast<int64_t>(obj->list->size());
    } else if (obj->kind == Kind::kString) {
      cps = DecodeUtf8(obj->s);
      n = static_cast<int64_t>(cps.size());
    } else {
      return Error(e.line, absl::StrCat("cannot slice a ", KindName(obj->kind)));
    }
    // Python's slice.indices().
    auto adjust = [&](int64_t v, bool is_given, int64_t def) {
      if (!is_given) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = adjust(bound[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = adjust(bound[1], given[1], step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) idx.push_back(k);
    if (obj->kind == Kind::kList) {
      List out;
      for (int64_t k : idx) out.push_back((*obj->list)[k]);
      return Value::MakeList(std::move(out));
    }
    std::string out;
    for (int64_t k : idx) AppendUtf8(cps[k], &out);
    return Value::Str(std::move(out));
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    absl::StatusOr<Value> av = Eval(*e.a);
    if (!av.ok()) return av;
    absl::StatusOr<Value> bv = Eval(*e.b);
    if (!bv.ok()) return bv;
    const Value& a = *av;
    const Value& b = *bv;
    const std::string& op = e.name;
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "~") return Value::Str(Str(a) + Str(b));
    if (op == "in" || op == "not in") {
      absl::StatusOr<bool> in = Contains(b, a, e.line);
      if (!in.ok()) return in.status();
      return Value::Bool(*in == (op == "in"));
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int cmp;
      if (a.is_number() && b.is_number()) {
        cmp = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
      } else if (a.kind == Kind::kString && b.kind == Kind::kString) {
        cmp = a.s.compare(b.s);
      } else {
        return Error(e.line, absl::StrCat("cannot compare a ", KindName(a.kind), " with a ",
                                          KindName(b.kind)));
      }
      if (op == "<") return Value::Bool(cmp < 0);
      if (op == "<=") return Value::Bool(cmp <= 0);
      if (op == ">") return Value::Bool(cmp > 0);
      return Value::Bool(cmp >= 0);
    }
    if (op == "+") {
      if (a.kind == Kind::kInt && b.kind == Kind::kInt) return Value::Int(a.i + b.i);
      if (a.is_number() && b.is_number()) return Value::Float(a.number() + b.number());
      if (a.kind == Kind::kString && b.kind == Kind::kString) return Value::Str(a.s + b.s);
      if (a.kind == Kind::kList && b.kind == Kind::kList) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::MakeList(std::move(l));
      }
      return Error(e.line,
                   absl::StrCat("cannot add a ", KindName(a.kind), " and a ", KindName(b.kind)));
    }
    if (op == "*" && a.kind == Kind::kString && b.kind == Kind::kInt) {
      if (b.i > 100000 || a.s.size() * std::max<int64_t>(b.i, 0) > kMaxOutput) {
        return Error(e.line, "string repetition too large");
      }
      std::string out;
      for (int64_t k = 0; k < b.i; ++k) out += a.s;
      return Value::Str(std::move(out));
    }
    if (!a.is_number() || !b.is_number()) {
      return Error(e.line, absl::StrCat("operator '", op, "' needs numbers, got a ",
                                        KindName(a.kind), " and a ", KindName(b.kind)));
    }
    const bool ints = a.kind == Kind::kInt && b.kind == Kind::kInt;
    if (op == "-") return ints ? Value::Int(a.i - b.i) : Value::Float(a.number() - b.number());
    if (op == "*") return ints ? Value::Int(a.i * b.i) : Value::Float(a.number() * b.number());
    if (op == "/") {
      if (b.number() == 0) return Error(e.line, "division by zero");
      return Value::Float(a.number() / b.number());
    }
    if (op == "//" || op == "%") {
      if (b.number() == 0) return Error(e.line, "division by zero");
      if (ints) {
        int64_t q = a.i / b.i;
        if ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))) --q;
        return op == "//" ? Value::Int(q) : Value::Int(a.i - q * b.i);
      }
      const double q = std::floor(a.number() / b.number());
      return op == "//" ? Value::Float(q) : Value::Float(a.number() - q * b.number());
    }
    if (op == "**") {
      if (ints && b.i >= 0 && b.i < 64) {
        int64_t r = 1;
        for (int64_t k = 0; k < b.i; ++k) r *= a.i;
        return Value::Int(r);
      }
      return Value::Float(std::pow(a.number(), b.number()));
    }
    return Error(e.line, absl::StrCat("unknown operator '", op, "'"));
  }

  absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
    if (container.kind == Kind::kString) {
      if (item.kind != Kind::kString) return Error(line, "'in <string>' needs a string");
      return absl::StrContains(container.s, item.s);
    }
    if (container.kind == Kind::kList) {
      for (const Value& v : *container.list) {
        if (Equal(v, item)) return true;
      }
      return false;
    }
    if (container.dict != nullptr) {
      return item.kind == Kind::kString && container.Find(item.s) != nullptr;
    }
    if (container.kind == Kind::kUndefined) return Error(line, "'in' an undefined value");
    return Error(line, absl::StrCat("'in' a ", KindName(container.kind)));
  }

  struct Args {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> named;
    const Value* Get(size_t pos, absl::string_view name) const {
      if (pos < positional.size()) return &positional[pos];
      for (const auto& [n, v] : named) {
        if (n == name) return &v;
      }
      return nullptr;
    }
  };
  absl::StatusOr<Args> EvalArgs(const std::vector<Arg>& args) {
    Args out;
    for (const Arg& a : args) {
      absl::StatusOr<Value> v = Eval(*a.value);
      if (!v.ok()) return v.status();
      if (a.name.empty()) {
        out.positional.push_back(*std::move(v));
      } else {
        out.named.emplace_back(a.name, *std::move(v));
      }
    }
    return out;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    absl::StatusOr<Args> args = EvalArgs(e.args);
    if (!args.ok()) return args.status();
    if (e.a->type == Expr::kAttr) {
      absl::StatusOr<Value> obj = Eval(*e.a->a);
      if (!obj.ok()) return obj;
      return Method(*obj, e.a->name, *args, e.line);
    }
    if (e.a->type != Expr::kName) return Error(e.line, "only functions and methods can be called");
    const std::string& fn = e.a->name;
    const Value* callee = Lookup(fn);
    if (callee != nullptr && callee->kind == Kind::kMacro)
      return CallMacro(*callee->macro, *args, e.line);
    if (fn == "raise_exception") {
      const Value* m = args->Get(0, "message");
      return absl::InvalidArgumentError(m == nullptr ? "the chat template raised an error"
                                                     : Str(*m));
    }
    if (fn == "namespace" || fn == "dict") {
      Value ns = Value::Of(fn == "namespace" ? Kind::kNamespace : Kind::kDict);
      ns.dict = std::make_shared<Dict>();
      for (const auto& [n, v] : args->named) ns.dict->emplace_back(n, v);
      return ns;
    }
    if (fn == "range") {
      int64_t r[3] = {0, 0, 1};
      if (args->positional.empty() || args->positional.size() > 3) {
        return Error(e.line, "range() takes 1 to 3 integers");
      }
      for (const Value& v : args->positional) {
        if (v.kind != Kind::kInt) return Error(e.line, "range() takes integers");
      }
      if (args->positional.size() == 1) {
        r[1] = args->positional[0].i;
      } else {
        r[0] = args->positional[0].i;
        r[1] = args->positional[1].i;
        if (args->positional.size() == 3) r[2] = args->positional[2].i;
      }
      if (r[2] == 0) return Error(e.line, "range() step cannot be zero");
      List l;
      for (int64_t k = r[0]; r[2] > 0 ? k < r[1] : k > r[1]; k += r[2]) {
        if (l.size() > 1000000) return Error(e.line, "range() too long");
        l.push_back(Value::Int(k));
      }
      return Value::MakeList(std::move(l));
    }
    if (fn == "strftime_now") {
      const Value* f = args->Get(0, "format");
      if (f == nullptr || f->kind != Kind::kString) return Error(e.line, "strftime_now(format)");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), f->s.c_str(), &tm);
      return Value::Str(std::string(buf, n));
    }
    return Error(e.line, absl::StrCat("'", fn, "' is not a function"));
  }

  absl::StatusOr<Value> CallMacro(const MacroDef& m, const Args& args, int line) {
    if (macro_depth_ >= kMaxMacroDepth) return Error(line, "macros nested too deeply");
    if (args.positional.size() > m.params.size()) {
      return Error(line,
                   absl::StrCat("macro '", m.name, "' takes ", m.params.size(), " arguments"));
    }
    Frame frame;
    for (size_t k = 0; k < m.params.size(); ++k) {
      const Value* v = args.Get(k, m.params[k].first);
      if (v != nullptr) {
        frame.emplace_back(m.params[k].first, *v);
      } else if (m.params[k].second != nullptr) {
        absl::StatusOr<Value> def = Eval(*m.params[k].second);
        if (!def.ok()) return def;
        frame.emplace_back(m.params[k].first, *std::move(def));
      } else {
        frame.emplace_back(m.params[k].first, Value());
      }
    }
    std::vector<Frame> saved = std::move(scopes_);
    scopes_ = {saved[0], std::move(frame)};
    std::string captured;
    std::string* saved_out = out_;
    out_ = &captured;
    ++macro_depth_;
    Flow flow = Flow::kNormal;
    absl::Status s = Exec(m.body, &flow);
    --macro_depth_;
    out_ = saved_out;
    saved[0] = std::move(scopes_[0]);
    scopes_ = std::move(saved);
    if (!s.ok()) return s;
    return Value::Str(std::move(captured));
  }

  absl::StatusOr<Value> Method(const Value& obj, const std::string& name, const Args& args,
                               int line) {
    auto str_arg = [&](size_t pos, absl::string_view n) -> const std::string* {
      const Value* v = args.Get(pos, n);
      return v != nullptr && v->kind == Kind::kString ? &v->s : nullptr;
    };
    if (obj.kind == Kind::kString) {
      const std::string& s = obj.s;
      if (name == "startswith" || name == "endswith") {
        const Value* p = args.Get(0, "prefix");
        if (p == nullptr) return Error(line, absl::StrCat(name, "() needs an argument"));
        std::vector<std::string> options;
        if (p->kind == Kind::kString) {
          options.push_back(p->s);
        } else if (p->kind == Kind::kList) {
          for (const Value& v : *p->list) {
            if (v.kind == Kind::kString) options.push_back(v.s);
          }
        } else {
          return Error(line, absl::StrCat(name, "() needs a string"));
        }
        for (const std::string& o : options) {
          if (name == "startswith" ? absl::StartsWith(s, o) : absl::EndsWith(s, o)) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* c = args.Get(0, "chars");
        const std::string* chars = c != nullptr && c->kind == Kind::kString ? &c->s : nullptr;
        return Value::Str(Strip(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = args.Get(0, "sep");
        const Value* maxv = args.Get(1, "maxsplit");
        const int64_t maxsplit = maxv != nullptr && maxv->kind == Kind::kInt ? maxv->i : -1;
        List out;
        if (sep == nullptr || sep->kind == Kind::kNone) {
          if (name == "rsplit" && maxsplit >= 0)
            return Error(line, "rsplit(None, n) is not supported");
          for (std::string& part : SplitWhitespace(s, maxsplit))
            out.push_back(Value::Str(std::move(part)));
          return Value::MakeList(std::move(out));
        }
        if (sep->kind != Kind::kString || sep->s.empty()) return Error(line, "empty separator");
        std::vector<std::string> parts;
        if (name == "split") {
          size_t start = 0;
          while (true) {
            const size_t at = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)
                                  ? std::string::npos
                                  : s.find(sep->s, start);
            if (at == std::string::npos) {
              parts.push_back(s.substr(start));
              break;
            }
            parts.push_back(s.substr(start, at - start));
            start = at + sep->s.size();
          }
        } else {
          size_t end = s.size();
          while (true) {
            const size_t at = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ||
                                      end < sep->s.size()
                                  ? std::string::npos
                                  : s.rfind(sep->s, end - sep->s.size());
            if (at == std::string::npos) {
              parts.push_back(s.substr(0, end));
              break;
            }
            parts.push_back(s.substr(at + sep->s.size(), end - at - sep->s.size()));
            end = at;
          }
          std::reverse(parts.begin(), parts.end());
        }
        for (std::string& p : parts) out.push_back(Value::Str(std::move(p)));
        return Value::MakeList(std::move(out));
      }
      if (name == "upper" || name == "lower") return Value::Str(CaseMap(s, name == "upper"));
      if (name == "title" || name == "capitalize") return ApplyCase(s, name);
      if (name == "replace") {
        const std::string* from = str_arg(0, "old");
        const std::string* to = str_arg(1, "new");
        if (from == nullptr || to == nullptr) return Error(line, "replace(old, new) needs strings");
        const Value* count = args.Get(2, "count");
        return Value::Str(
            Replace(s, *from, *to, count != nullptr && count->kind == Kind::kInt ? count->i : -1));
      }
      if (name == "find" || name == "rfind" || name == "count") {
        const std::string* sub = str_arg(0, "sub");
        if (sub == nullptr) return Error(line, absl::StrCat(name, "() needs a string"));
        if (name == "count") {
          if (sub->empty()) return Value::Int(static_cast<int64_t>(DecodeUtf8(s).size()) + 1);
          int64_t n = 0;
          for (size_t at = s.find(*sub); at != std::string::npos;
               at = s.find(*sub, at + sub->size()))
            ++n;
          return Value::Int(n);
        }
        const size_t at = name == "find" ? s.find(*sub) : s.rfind(*sub);
        if (at == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<int64_t>(DecodeUtf8(s.substr(0, at)).size()));
      }
      if (name == "splitlines") {
        List out;
        size_t start = 0;
        for (size_t k = 0; k < s.size(); ++k) {
          if (s[k] == '\n' || s[k] == '\r') {
            out.push_back(Value::Str(s.substr(start, k - start)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            start = k + 1;
          }
        }
        if (start < s.size()) out.push_back(Value::Str(s.substr(start)));
        return Value::MakeList(std::move(out));
      }
      if (name == "join") {
        const Value* items = args.Get(0, "iterable");
        if (items == nullptr) return Error(line, "join() needs a list");
        absl::StatusOr<List> l = Iterate(*items, line);
        if (!l.ok()) return l.status();
        std::string out;
        for (size_t k = 0; k < l->size(); ++k) {
          if (k > 0) out += s;
          out += Str((*l)[k]);
        }
        return Value::Str(std::move(out));
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isupper" ||
          name == "islower") {
        if (s.empty()) return Value::Bool(false);
        bool all = true;
        for (char c : s) {
          if (name == "isdigit") all &= absl::ascii_isdigit(c);
          if (name == "isalpha") all &= absl::ascii_isalpha(c);
          if (name == "isspace") all &= absl::ascii_isspace(c);
          if (name == "isupper") all &= !absl::ascii_islower(c);
          if (name == "islower") all &= !absl::ascii_isupper(c);
        }
        return Value::Bool(all);
      }
      if (name == "zfill") {
        const Value* w = args.Get(0, "width");
        if (w == nullptr || w->kind != Kind::kInt) return Error(line, "zfill(width)");
        std::string out = s;
        if (static_cast<int64_t>(out.size()) < w->i && w->i < 100000) {
          out.insert(0, static_cast<size_t>(w->i) - out.size(), '0');
        }
        return Value::Str(std::move(out));
      }
    }
    if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : *obj.dict) {
          if (name == "items") out.push_back(Value::MakeList({Value::Str(k), v}));
          if (name == "keys") out.push_back(Value::Str(k));
          if (name == "values") out.push_back(v);
        }
        return Value::MakeList(std::move(out));
      }
      if (name == "get") {
        const Value* key = args.Get(0, "key");
        const Value* def = args.Get(1, "default");
        if (key == nullptr || key->kind != Kind::kString) return Error(line, "get() needs a key");
        const Value* v = obj.Find(key->s);
        if (v != nullptr) return *v;
        return def != nullptr ? *def : Value::None();
      }
    }
    if (obj.kind == Kind::kList) {
      if (name == "append") {
        const Value* v = args.Get(0, "item");
        if (v == nullptr) return Error(line, "append() needs an item");
        if (obj.list->size() > 1000000) return Error(line, "list too long");
        if (Holds(*v, obj.list.get())) return Error(line, "append() cannot add a list to itself");
        obj.list->push_back(*v);
        return Value::None();
      }
      if (name == "index" || name == "count") {
        const Value* v = args.Get(0, "value");
        if (v == nullptr) return Error(line, absl::StrCat(name, "() needs a value"));
        int64_t n = 0;
        for (size_t k = 0; k < obj.list->size(); ++k) {
          if (Equal((*obj.list)[k], *v)) {
            if (name == "index") return Value::Int(static_cast<int64_t>(k));
            ++n;
          }
        }
        if (name == "index") return Error(line, "index(): value is not in the list");
        return Value::Int(n);
      }
    }
    if (obj.kind == Kind::kUndefined)
      return Error(line, absl::StrCat("'", name, "' of an undefined value"));
    return Error(line, absl::StrCat("a ", KindName(obj.kind), " has no method '", name, "'"));
  }

  static Value ApplyCase(const std::string& s, const std::string& mode) {
    std::string out = s;
    bool start = true;
    for (size_t k = 0; k < out.size(); ++k) {
      char& c = out[k];
      if (mode == "capitalize") {
        c = k == 0 ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
      } else {
        c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
        start = !absl::ascii_isalpha(c);
      }
    }
    return Value::Str(std::move(out));
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t start = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
      const size_t at = s.find(from, start);
      if (at == std::string::npos) break;
      out.append(s, start, at - start);
      out += to;
      start = at + from.size();
      ++n;
    }
    out.append(s, start, std::string::npos);
    return out;
  }

  absl::StatusOr<bool> EvalTest(const Expr& e) {
    absl::StatusOr<Value> vv = Eval(*e.a);
    if (!vv.ok()) return vv.status();
    absl::StatusOr<Args> args = EvalArgs(e.args);
    if (!args.ok()) return args.status();
    const Value& v = *vv;
    const std::string& t = e.name;
    const Value* arg = args->Get(0, "value");
    if (t == "defined") return v.kind != Kind::kUndefined;
    if (t == "undefined") return v.kind == Kind::kUndefined;
    if (t == "none") return v.kind == Kind::kNone;
    if (t == "string") return v.kind == Kind::kString;
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind == Kind::kInt;
    if (t == "float") return v.kind == Kind::kFloat;
    if (t == "boolean") return v.kind == Kind::kBool;
    if (t == "true") return v.kind == Kind::kBool && v.b;
    if (t == "false") return v.kind == Kind::kBool && !v.b;
    if (t == "mapping") return v.kind == Kind::kDict;
    if (t == "iterable")
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString;
    if (t == "sequence")
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString;
    if (t == "callable") return v.kind == Kind::kMacro;
    if (t == "lower") return v.kind == Kind::kString && CaseMap(v.s, 0) == v.s;
    if (t == "upper") return v.kind == Kind::kString && CaseMap(v.s, 1) == v.s;
    if (t == "odd" || t == "even") {
      if (v.kind != Kind::kInt) return Error(e.line, absl::StrCat("'", t, "' needs an integer"));
      return (v.i % 2 != 0) == (t == "odd");
    }
    if (arg == nullptr) return Error(e.line, absl::StrCat("test '", t, "' needs an argument"));
    if (t == "divisibleby") {
      if (v.kind != Kind::kInt || arg->kind != Kind::kInt || arg->i == 0) {
        return Error(e.line, "divisibleby needs non-zero integers");
      }
      return v.i % arg->i == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==" || t == "sameas") return Equal(v, *arg);
    if (t == "ne" || t == "!=") return !Equal(v, *arg);
    if (t == "in") return Contains(*arg, v, e.line);
    if (!v.is_number() || !arg->is_number()) return Error(e.line, "comparison tests need numbers");
    if (t == "lt" || t == "<") return v.number() < arg->number();
    if (t == "gt" || t == ">") return v.number() > arg->number();
    if (t == "le" || t == "<=") return v.number() <= arg->number();
    return v.number() >= arg->number();
  }

  absl::StatusOr<Value> AttrOf(const Value& item, const std::string& path) {
    Value cur = item;
    size_t start = 0;
    while (start <= path.size()) {
      const size_t dot = path.find('.', start);
      const std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const Value* next = cur.Find(part);
      cur = next == nullptr ? Value() : *next;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return cur;
  }

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    absl::StatusOr<Value> vv = Eval(*e.a);
    if (!vv.ok()) return vv;
    absl::StatusOr<Args> args = EvalArgs(e.args);
    if (!args.ok()) return args.status();
    const Value& v = *vv;
    const std::string& f = e.name;
    if (f == "safe" || f == "e" || f == "escape") {
      if (f != "safe")
        return Error(e.line, "filter 'escape' is not supported (HF disables autoescape)");
      return v;
    }
    if (f == "tojson") {
      const Value* indent = args->Get(0, "indent");
      const Value* sort = args->Get(99, "sort_keys");
      const Value* ascii = args->Get(99, "ensure_ascii");
      if (ascii != nullptr && Truthy(*ascii))
        return Error(e.line, "tojson(ensure_ascii=true) is not supported");
      for (const auto& [n, x] : args->named) {
        if (n != "indent" && n != "sort_keys" && n != "ensure_ascii") {
          return Error(e.line, absl::StrCat("tojson(", n, "=...) is not supported"));
        }
      }
      std::string out;
      absl::Status s = ToJson(v,
                              indent != nullptr && indent->kind == Kind::kInt
                                  ? static_cast<int>(std::clamp<int64_t>(indent->i, 0, 16))
                                  : -1,
                              sort != nullptr && Truthy(*sort), 0, &out);
      if (!s.ok()) return Error(e.line, s.message());
      return Value::Str(std::move(out));
    }
    if (f == "length" || f == "count") {
      switch (v.kind) {
        case Kind::kString:
          return Value::Int(static_cast<int64_t>(DecodeUtf8(v.s).size()));
        case Kind::kList:
          return Value::Int(static_cast<int64_t>(v.list->size()));
        case Kind::kDict:
        case Kind::kNamespace:
          return Value::Int(static_cast<int64_t>(v.dict->size()));
        case Kind::kUndefined:
          return Value::Int(0);
        default:
          return Error(e.line, absl::StrCat("a ", KindName(v.kind), " has no length"));
      }
    }
    if (f == "trim") {
      const Value* c = args->Get(0, "chars");
      return Value::Str(
          Strip(Str(v), c != nullptr && c->kind == Kind::kString ? &c->s : nullptr, true, true));
    }
    if (f == "upper" || f == "lower") return Value::Str(CaseMap(Str(v), f == "upper"));
    if (f == "title" || f == "capitalize") return ApplyCase(Str(v), f);
    if (f == "string") return Value::Str(Str(v));
    if (f == "int") {
      if (v.kind == Kind::kInt) return v;
      if (v.kind == Kind::kFloat) return Value::Int(static_cast<int64_t>(v.f));
      if (v.kind == Kind::kBool) return Value::Int(v.b);
      if (v.kind == Kind::kString) {
        int64_t n = 0;
        const std::string t = Strip(v.s, nullptr, true, true);
        auto r = std::from_chars(t.data(), t.data() + t.size(), n);
        if (r.ec == std::errc() && r.ptr == t.data() + t.size()) return Value::Int(n);
      }
      const Value* def = args->Get(0, "default");
      return def != nullptr ? *def : Value::Int(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::Float(v.number());
      if (v.kind == Kind::kString) {
        char* end = nullptr;
        const double d = std::strtod(v.s.c_str(), &end);
        if (end != v.s.c_str() && *end == '\0') return Value::Float(d);
      }
      return Value::Float(0);
    }
    if (f == "abs") {
      if (v.kind == Kind::kInt) return Value::Int(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
      return Error(e.line, "abs needs a number");
    }
    if (f == "round") {
      if (!v.is_number()) return Error(e.line, "round needs a number");
      const Value* p = args->Get(0, "precision");
      const double scale = std::pow(
          10.0, p != nullptr && p->kind == Kind::kInt ? std::clamp<int64_t>(p->i, 0, 15) : 0);
      return Value::Float(std::round(v.number() * scale) / scale);
    }
    if (f == "default" || f == "d") {
      const Value* def = args->Get(0, "default_value");
      const Value* boolean = args->Get(1, "boolean");
      const bool use =
          v.kind == Kind::kUndefined || (boolean != nullptr && Truthy(*boolean) && !Truthy(v));
      if (use) return def != nullptr ? *def : Value::Str("");
      return v;
    }
    if (f == "items" || f == "dictsort") {
      if (v.kind == Kind::kUndefined) return Value::MakeList();
      if (v.dict == nullptr) return Error(e.line, absl::StrCat("'", f, "' needs a mapping"));
      List out;
      for (const auto& [k, x] : *v.dict) out.push_back(Value::MakeList({Value::Str(k), x}));
      if (f == "dictsort") {
        std::stable_sort(out.begin(), out.end(), [](const Value& a, const Value& b) {
          return (*a.list)[0].s < (*b.list)[0].s;
        });
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "wordcount")
      return Value::Int(static_cast<int64_t>(SplitWhitespace(Str(v), -1).size()));
    if (f == "replace") {
      if (args->positional.size() < 2) return Error(e.line, "replace(old, new)");
      const Value* count = args->Get(2, "count");
      return Value::Str(Replace(Str(v), Str(args->positional[0]), Str(args->positional[1]),
                                count != nullptr && count->kind == Kind::kInt ? count->i : -1));
    }
    if (f == "indent") {
      const Value* w = args->Get(0, "width");
      const Value* first = args->Get(1, "first");
      const Value* blank = args->Get(2, "blank");
      std::string pad =
          w == nullptr ? "    "
          : w->kind == Kind::kString
              ? w->s
              : std::string(static_cast<size_t>(std::clamp<int64_t>(w->i, 0, 256)), ' ');
      const std::string s = Str(v);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      while (start <= s.size()) {
        size_t nl = s.find('\n', start);
        const std::string line =
            s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool indent = first_line ? (first != nullptr && Truthy(*first))
                                       : (!line.empty() || (blank != nullptr && Truthy(*blank)));
        if (indent) out += pad;
        out += line;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      return Value::Str(std::move(out));
    }
    if (f == "center") {
      const Value* w = args->Get(0, "width");
      std::string s = Str(v);
      const int64_t width =
          w != nullptr && w->kind == Kind::kInt ? std::min<int64_t>(w->i, 10000) : 80;
      const int64_t len = static_cast<int64_t>(DecodeUtf8(s).size());
      if (len >= width) return Value::Str(s);
      const int64_t total = width - len, left = total / 2 + (total & width & 1);
      return Value::Str(std::string(left, ' ') + s + std::string(total - left, ' '));
    }
    // Sequence filters.
    absl::StatusOr<List> items = Iterate(v, e.line);
    if (!items.ok()) return items.status();
    if (f == "list") return Value::MakeList(*std::move(items));
    if (f == "first") return items->empty() ? Value() : items->front();
    if (f == "last") return items->empty() ? Value() : items->back();
    if (f == "reverse") {
      if (v.kind == Kind::kString) {
        std::string out;
        for (auto it = items->rbegin(); it != items->rend(); ++it) out += it->s;
        return Value::Str(std::move(out));
      }
      std::reverse(items->begin(), items->end());
      return Value::MakeList(*std::move(items));
    }
    if (f == "join") {
      const Value* sep = args->Get(0, "d");
      const Value* attr = args->Get(1, "attribute");
      std::string out;
      for (size_t k = 0; k < items->size(); ++k) {
        if (k > 0 && sep != nullptr) out += Str(*sep);
        if (attr != nullptr) {
          absl::StatusOr<Value> a = AttrOf((*items)[k], Str(*attr));
          if (!a.ok()) return a;
          out += Str(*a);
        } else {
          out += Str((*items)[k]);
        }
      }
      return Value::Str(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (const Value& x : *items) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return Equal(x, y); }))
          out.push_back(x);
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "sum" || f == "min" || f == "max") {
      const Value* attr = args->Get(99, "attribute");
      Value acc = f == "sum" ? Value::Int(0) : Value();
      for (const Value& raw : *items) {
        Value x = raw;
        if (attr != nullptr) {
          absl::StatusOr<Value> a = AttrOf(raw, Str(*attr));
          if (!a.ok()) return a;
          x = *a;
        }
        if (!x.is_number() && !(f != "sum" && x.kind == Kind::kString)) {
          return Error(e.line, absl::StrCat("'", f, "' needs numbers"));
        }
        if (f == "sum") {
          acc = acc.kind == Kind::kInt && x.kind == Kind::kInt
                    ? Value::Int(acc.i + x.i)
                    : Value::Float(acc.number() + x.number());
        } else if (acc.kind == Kind::kUndefined) {
          acc = x;
        } else {
          const bool less = x.is_number() && acc.is_number() ? x.number() < acc.number()
                            : x.kind == Kind::kString && acc.kind == Kind::kString ? x.s < acc.s
                                                                                   : false;
          const bool greater = x.is_number() && acc.is_number() ? x.number() > acc.number()
                               : x.kind == Kind::kString && acc.kind == Kind::kString ? x.s > acc.s
                                                                                      : false;
          if ((f == "min" && less) || (f == "max" && greater)) acc = x;
        }
      }
      return acc;
    }
    if (f == "sort") {
      const Value* reverse = args->Get(0, "reverse");
      const Value* attr = args->Get(2, "attribute");
      List out = *std::move(items);
      std::vector<std::pair<Value, Value>> keyed;
      for (Value& x : out) {
        Value key = x;
        if (attr != nullptr) {
          absl::StatusOr<Value> a = AttrOf(x, Str(*attr));
          if (!a.ok()) return a;
          key = *a;
        }
        keyed.emplace_back(std::move(key), std::move(x));
      }
      bool bad = false;
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        if (a.first.is_number() && b.first.is_number()) return a.first.number() < b.first.number();
        if (a.first.kind == Kind::kString && b.first.kind == Kind::kString)
          return a.first.s < b.first.s;
        bad = true;
        return false;
      });
      if (bad) return Error(e.line, "sort needs numbers or strings");
      out.clear();
      for (auto& [k, x] : keyed) out.push_back(std::move(x));
      if (reverse != nullptr && Truthy(*reverse)) std::reverse(out.begin(), out.end());
      return Value::MakeList(std::move(out));
    }
    if (f == "batch") {
      const Value* n = args->Get(0, "linecount");
      if (n == nullptr || n->kind != Kind::kInt || n->i <= 0)
        return Error(e.line, "batch(n) needs n > 0");
      List out;
      for (size_t k = 0; k < items->size(); k += static_cast<size_t>(n->i)) {
        List chunk(items->begin() + k,
                   items->begin() + std::min(items->size(), k + static_cast<size_t>(n->i)));
        out.push_back(Value::MakeList(std::move(chunk)));
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "map" || f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject" ||
        f == "attr") {
      List out;
      if (f == "attr") {
        if (args->positional.empty()) return Error(e.line, "attr(name)");
        return AttrOf(v, Str(args->positional[0]));
      }
      if (f == "map") {
        const Value* attr = args->Get(99, "attribute");
        const Value* def = args->Get(99, "default");
        if (attr == nullptr) {
          if (args->positional.empty())
            return Error(e.line, "map needs attribute= or a filter name");
          return Error(e.line, "map(<filter>) is not supported; use map(attribute=...)");
        }
        for (const Value& x : *items) {
          absl::StatusOr<Value> a = AttrOf(x, Str(*attr));
          if (!a.ok()) return a;
          out.push_back(a->kind == Kind::kUndefined && def != nullptr ? *def : *a);
        }
        return Value::MakeList(std::move(out));
      }
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "selectattr" || f == "select";
      size_t next = 0;
      std::string attr;
      if (by_attr) {
        if (args->positional.empty()) return Error(e.line, absl::StrCat(f, "(attribute, ...)"));
        attr = Str(args->positional[0]);
        next = 1;
      }
      std::string test;
      if (args->positional.size() > next) test = Str(args->positional[next]);
      if (!test.empty() && !KnownTests().count(test))
        return Error(e.line, absl::StrCat("test '", test, "' is not supported"));
      for (const Value& x : *items) {
        Value subject = x;
        if (by_attr) {
          absl::StatusOr<Value> a = AttrOf(x, attr);
          if (!a.ok()) return a;
          subject = *a;
        }
        bool pass;
        if (test.empty()) {
          pass = Truthy(subject);
        } else {
          Expr probe;
          probe.type = Expr::kTest;
          probe.name = test;
          probe.line = e.line;
          probe.a = std::make_unique<Expr>();
          probe.a->type = Expr::kLiteral;
          probe.a->literal = subject;
          if (args->positional.size() > next + 1) {
            Arg a;
            a.value = std::make_unique<Expr>();
            a.value->type = Expr::kLiteral;
            a.value->literal = args->positional[next + 1];
            probe.args.push_back(std::move(a));
          }
          absl::StatusOr<bool> r = EvalTest(probe);
          if (!r.ok()) return r.status();
          pass = *r;
        }
        if (pass == keep_if) out.push_back(x);
      }
      return Value::MakeList(std::move(out));
    }
    return Error(e.line, absl::StrCat("filter '", f, "' is not supported"));
  }

  const Program& program_;
  std::string* out_;
  std::vector<Frame> scopes_;
  int64_t steps_ = 0;
  int macro_depth_ = 0;
};

}  // namespace
}  // namespace jinja

ChatTemplate::ChatTemplate(std::unique_ptr<jinja::Program> program)
    : program_(std::move(program)) {}
ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Compile(absl::string_view source,
                                                                    absl::string_view origin) {
  // Jinja's keep_trailing_newline=False (HF's setting): one trailing newline of the source goes.
  if (absl::EndsWith(source, "\r\n")) {
    source.remove_suffix(2);
  } else if (absl::EndsWith(source, "\n")) {
    source.remove_suffix(1);
  }
  absl::StatusOr<std::vector<jinja::Piece>> pieces = jinja::Split(source, origin);
  if (!pieces.ok()) return pieces.status();
  auto program = std::make_unique<jinja::Program>();
  program->origin = std::string(origin);
  jinja::TreeBuilder builder(*std::move(pieces), origin);
  absl::Status s = builder.Build(&program->body);
  if (!s.ok()) return s;
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(program)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& variables) const {
  std::string out;
  jinja::Renderer renderer(*program_, &out);
  absl::Status s = renderer.Run(variables);
  if (!s.ok()) return s;
  return out;
}

}  // namespace vamp
