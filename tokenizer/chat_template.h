// A chat template engine: the subset of Jinja2 that Hugging Face chat templates use, written for
// VAMP (no C++ Jinja library is packaged).
//
// Statements: {% if/elif/else/endif %}, {% for x in xs %} / {% for k, v in d.items() %} with
// `loop` (index, index0, revindex, revindex0, first, last, length, previtem, nextitem), an inline
// `if` filter and {% else %}; {% set x = ... %}, {% set ns.attr = ... %}, {% set x %}...{% endset
// %};
// {% macro %} with defaults and {% call %}-free calls; {% break %}, {% continue %}; {# comments #};
// whitespace control ({%- -%}, {{- -}}) and Jinja's trim_blocks / lstrip_blocks as HF sets them.
// Expressions: literals (strings, numbers, true/false/none, lists, dicts), attribute and item
// access, slices incl. [::-1], calls, filters (tojson, length/count, trim, upper, lower, title,
// capitalize, string, int, float, list, join, first, last, reverse, default/d, items, replace,
// selectattr/rejectattr/map with attribute=, sort, unique, indent, safe, abs, round, dictsort,
// wordcount, center), tests (defined, undefined, none, string, number, integer, float, mapping,
// iterable, sequence, boolean, true, false, odd, even, divisibleby, eq/ne/lt/gt..., in), operators
// (or and not, in / not in, is / is not, == != < <= > >=, + - * / // % **, ~ concatenation,
// ternary `a if c else b`), string methods (startswith, endswith, split, rsplit, strip, lstrip,
// rstrip, upper, lower, title, capitalize, replace, find, count, format-free join, splitlines),
// dict methods (items, keys, values, get), list methods (append-free: index, count), namespace(),
// range(), raise_exception(msg), strftime_now(fmt).
// Anything outside the subset fails Compile with an error naming the origin and line, so a model
// whose template cannot be rendered faithfully fails at load, never renders wrongly.
#ifndef VAMP_TOKENIZER_CHAT_TEMPLATE_H_
#define VAMP_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace vamp {

namespace jinja {
struct Program;
}  // namespace jinja

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument "<origin>:<line>: ..." for syntax or features outside the
  // subset.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(absl::string_view source,
                                                               absl::string_view origin);
  ~ChatTemplate();

  // Renders with the top-level variables of the JSON object `variables`. InvalidArgument for
  // raise_exception (its message) and for run-time type errors (with the line); rendering is
  // bounded (output size, loop iterations, recursion) so no input can make it run away.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

 private:
  explicit ChatTemplate(std::unique_ptr<jinja::Program> program);
  std::unique_ptr<jinja::Program> program_;
};

}  // namespace vamp

#endif  // VAMP_TOKENIZER_CHAT_TEMPLATE_H_
