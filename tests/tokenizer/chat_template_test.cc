#include "tokenizer/chat_template.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using OJson = nlohmann::ordered_json;

std::string Render(const std::string& source, const OJson& vars = OJson::object()) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(source, "t");
  if (!t.ok()) return "COMPILE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = (*t)->Render(vars);
  if (!out.ok()) return "RENDER ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(ChatTemplateTest, ExpressionsAndOperators) {
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}"),
            "7|3|-4|1|1024");
  EXPECT_EQ(Render("{{ 7 / 2 }}|{{ 1.0 }}|{{ 'a' ~ 1 ~ none }}|{{ 'x' * 3 }}"),
            "3.5|1.0|a1None|xxx");
  EXPECT_EQ(Render("{{ true and not false }}|{{ none or 'd' }}|{{ 'a' if 1 > 2 else 'b' }}"),
            "True|d|b");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1] }}"),
            "True|True|True|True");
  EXPECT_EQ(Render("{{ [1, 'a', none, true] }}|{{ {'a': 1} }}"), "[1, 'a', None, True]|{'a': 1}");
}

TEST(ChatTemplateTest, SlicingIncludingReverse) {
  const OJson vars = {{"xs", {1, 2, 3, 4}}, {"s", "héllo"}};
  EXPECT_EQ(Render("{{ xs[::-1] }}|{{ xs[1:3] }}|{{ xs[-1] }}|{{ xs[:-1] }}|{{ xs[::2] }}", vars),
            "[4, 3, 2, 1]|[2, 3]|4|[1, 2, 3]|[1, 3]");
  EXPECT_EQ(Render("{{ s[::-1] }}|{{ s[1] }}|{{ s[1:3] }}|{{ s | length }}", vars), "olléh|é|él|5");
}

TEST(ChatTemplateTest, StringMethodsFollowPython) {
  const OJson vars = {{"s", "  a,b,,c  "}, {"t", "<think>x</think>\n\ny"}};
  EXPECT_EQ(Render("[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}]", vars),
            "[a,b,,c][a,b,,c  ][  a,b,,c]");
  EXPECT_EQ(Render("{{ s.strip().split(',') }}|{{ 'a b  c'.split() }}|{{ 'a-b-c'.rsplit('-', 1) }}",
                   vars),
            "['a', 'b', '', 'c']|['a', 'b', 'c']|['a-b', 'c']");
  EXPECT_EQ(Render("{{ t.split('</think>')[-1].lstrip('\\n') }}", vars), "y");
  // Python's lstrip('\n') keeps leading spaces (transformers.js strips them; HF's Jinja does not).
  EXPECT_EQ(Render("[{{ '  reply'.lstrip('\\n') }}]"), "[  reply]");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ "
                   "'aXa'.replace('a', 'b') }}"),
            "TrueTruebXb");
  EXPECT_EQ(Render("{{ 'Hello World'.upper() }}{{ 'ab'.title() }}{{ 'abc'.find('c') }}"),
            "HELLO WORLDAb2");
}

TEST(ChatTemplateTest, ForLoopsWithLoopVariablesFiltersAndElse) {
  const OJson vars = {{"xs", {"a", "b", "c"}}, {"d", {{"k1", 1}, {"k2", 2}}}};
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index0 }}{{ x }}{{ loop.revindex }}{% if loop.first "
                   "%}F{% endif %}"
                   "{% if loop.last %}L{% endif %},{% endfor %}",
                   vars),
            "0a3F,1b2,2c1L,");
  EXPECT_EQ(Render("{% for x in xs if x != 'b' %}{{ loop.index }}{{ x }}{% endfor %}", vars),
            "1a2c");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", vars), "k1=1;k2=2;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(
      Render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", vars),
      "a");
  EXPECT_EQ(Render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}",
                   vars),
            "ac");
}

// fuzz_chat_template found that a container stored inside itself leaked (shared storage makes a
// cycle): such assignments are render errors, as is anything nested too deep to check.
TEST(ChatTemplateTest, AContainerCannotHoldItself) {
  auto render = [](const std::string& source) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(source, "t");
    EXPECT_TRUE(t.ok()) << t.status();
    return (*t)->Render(OJson::object());
  };
  absl::StatusOr<std::string> ns =
      render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns.a }}");
  ASSERT_FALSE(ns.ok());
  EXPECT_THAT(ns.status().message(), ::testing::HasSubstr("cannot hold the namespace itself"));
  absl::StatusOr<std::string> list = render("{% set x = [] %}{{ x.append(x) }}");
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.status().message(), ::testing::HasSubstr("cannot add a list to itself"));
  absl::StatusOr<std::string> nested =
      render("{% set ns = namespace(l=[]) %}{% set y = [ns] %}{{ ns.l.append(y) }}done");
  ASSERT_FALSE(nested.ok());
  // Holding another container is fine.
  absl::StatusOr<std::string> ok = render(
      "{% set ns = namespace(a=1) %}{% set other = namespace(b=2) %}{% set ns.a = other %}"
      "{{ ns.a.b }}{% set x = [] %}{% set y = [1] %}{{ x.append(y) }}{{ x | length }}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "2None1");  // append() returns None, which renders as Python does
}

TEST(ChatTemplateTest, SetNamespaceScopingAndMacros) {
  // A plain set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(
      Render("{% set x = 1 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set x = i %}"
             "{% set ns.n = ns.n + i %}{% endfor %}{{ x }}/{{ ns.n }}"),
      "1/3");
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(Render("{% set block %}in{{ 1 }}{% endset %}[{{ block }}]"), "[in1]");
}

TEST(ChatTemplateTest, TestsAndFilters) {
  const OJson vars = {{"m", {{"a", nullptr}, {"b", "x"}}},
                      {"tools", {{{"name", "f"}, {"n", 2}}, {{"name", "g"}, {"n", 1}}}}};
  EXPECT_EQ(Render("{{ m.a is none }}{{ m.b is defined }}{{ m.c is defined }}{{ m.c is undefined }}"
                   "{{ m.b is string }}{{ 3 is odd }}{{ m is mapping }}{{ 4 is divisibleby 2 }}",
                   vars),
            "TrueTrueFalseTrueTrueTrueTrueTrue");
  EXPECT_EQ(Render("{{ tools | map(attribute='name') | join(', ') }}|{{ tools | selectattr('n', "
                   "'gt', 1) | list | length }}"
                   "|{{ (tools | sort(attribute='n') | first).name }}",
                   vars),
            "f, g|1|g");
  EXPECT_EQ(
      Render(
          "{{ m | tojson }}|{{ '  x ' | trim }}|{{ none | default('d') }}|{{ m.c | default('e') }}",
          vars),
      "{\"a\": null, \"b\": \"x\"}|x|None|e");
  EXPECT_EQ(Render("{{ {'k': 'ü\"\\n', 'l': [1, 2.5, true]} | tojson }}"),
            "{\"k\": \"ü\\\"\\n\", \"l\": [1, 2.5, true]}");
  EXPECT_EQ(Render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(
      Render("{{ 'ab' | upper }}{{ [3, 1] | max }}{{ [1, 2] | sum }}{{ 'x\ny' | indent(2) }}"),
      "AB33x\n  y");
}

TEST(ChatTemplateTest, WhitespaceControlAndHfBlockTrimming) {
  // trim_blocks + lstrip_blocks (as HF sets them) and explicit -.
  EXPECT_EQ(Render("a\n  {% if true %}\nb\n  {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(Render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(Render("x {#- comment -#} y"), "xy");
  EXPECT_EQ(Render("{% if true -%}\n\n  t{%- endif %}"), "t");
  // keep_trailing_newline=False: one final newline of the source is dropped (a .jinja file's).
  EXPECT_EQ(Render("{{ 'x' }}\n"), "x");
  EXPECT_EQ(Render("{{ 'x' }}\n\n"), "x\n");
}

TEST(ChatTemplateTest, RaiseExceptionIsAnErrorWithItsMessage) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::Compile("{{ raise_exception('Roles must alternate') }}", "t");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = (*t)->Render(OJson::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "Roles must alternate");
}

TEST(ChatTemplateTest, FeaturesOutsideTheSubsetFailToCompileNamingTheLine) {
  for (const char* source :
       {"{% filter upper %}x{% endfilter %}", "{{ x | frobnicate }}", "{{ x.format(1) }}",
        "{% include 'x' %}", "{{ x is prime }}", "{{ undefined_fn(1) }}", "{% for x in y %}",
        "{{ 'a' ", "{% if %}", "line\n{% call m() %}{% endcall %}"}) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Compile(source, "tpl.jinja");
    EXPECT_FALSE(t.ok()) << source;
    EXPECT_THAT(t.status().message(), HasSubstr("tpl.jinja:")) << source;
  }
}

TEST(ChatTemplateTest, RunawayTemplatesAreStopped) {
  EXPECT_THAT(
      Render("{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}"),
      HasSubstr("RENDER ERROR"));
  EXPECT_THAT(Render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
              HasSubstr("too deeply"));
  EXPECT_THAT(Render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"),
              HasSubstr("COMPILE ERROR"));
  EXPECT_THAT(Render("{{ " + std::string(500, '[') + std::string(500, ']') + " }}"),
              HasSubstr("COMPILE ERROR"));
}

}  // namespace
}  // namespace vamp
