// A Jinja template engine for the chat templates Hugging Face models ship (tokenizer_config.json's
// "chat_template", chat_template.jinja). Parses once, renders many times (render is const and
// safe from several threads). Note [jinja subset] says what it covers; anything else is refused
// with one line naming the template's line, never rendered differently.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratum {

// Note [jinja subset]: transformers renders a chat template with Jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) and the loopcontrols
// extension, tojson as json.dumps(ensure_ascii=False), and the globals raise_exception and
// strftime_now; this engine does the same over:
// - syntax: {{ }}, {% %}, {# #} with the - and + whitespace controls, trim_blocks, lstrip_blocks
//   and the dropped final newline (keep_trailing_newline=False);
// - statements: if/elif/else, for (tuple targets, an `if` filter, else, loop.index/index0/
//   revindex/revindex0/first/last/length/previtem/nextitem, break, continue), set (a name, a
//   tuple of names, ns.attr, the block form), macro (positional and keyword parameters with
//   defaults), and transformers' generation/endgeneration (Note [chat mask] in data/chat_template.h);
// - expressions: literals (strings with Python escapes, ints, floats, lists, tuples, dicts,
//   true/false/none in both cases), names, .attr and [item] (dict keys, negative list indices,
//   slices with steps on lists and strings, by code point), calls with keyword arguments, filters,
//   tests (is / is not), not, and, or, in, not in, comparisons, + - * / // % ** ~, unary -,
//   the conditional `a if b else c`;
// - filters: abs capitalize count d default dictsort first float indent int items join last
//   length list lower map max min reject rejectattr replace reverse round safe select selectattr
//   sort string sum title tojson trim unique upper; tests: boolean callable defined divisibleby eq equalto
//   even false float ge gt in integer iterable le lower lt mapping ne none number odd sameas
//   sequence string true undefined upper;
// - methods: str's capitalize count endswith find join lower lstrip replace rsplit rstrip split
//   splitlines startswith strip title upper (no format); dict's get items keys values;
// - globals: namespace, range, dict, raise_exception (its message becomes the error),
//   strftime_now (the local time, as transformers').
// Values follow Python: truthiness, == across int/float/bool, str() of None/True/floats/lists,
// len and slices by code point; an undefined name or key is Jinja's default Undefined (prints
// nothing, is false, iterates as empty; an attribute of it or arithmetic on it is an error).
class JinjaTemplate {
 public:
  struct Rendered {
    std::string text;
    // [begin, end) byte ranges of the text written inside {% generation %} blocks, in order.
    std::vector<std::pair<std::size_t, std::size_t>> generation;
  };

  // Throws Error "[template] <where> line N: ..." for a syntax error or an unsupported construct.
  static JinjaTemplate parse(std::string_view source, const std::string& where);
  // Renders with `context`'s keys as variables (JSON objects and arrays as Jinja dicts and lists,
  // in their key order). Throws Error "[template] <where> line N: ..." for an error the template
  // makes (calling raise_exception, adding a string to a number, ...).
  Rendered render(const nlohmann::ordered_json& context) const;
  // Whether the template has a {% generation %} block.
  bool has_generation() const;

  struct Impl;
  JinjaTemplate();
  ~JinjaTemplate();
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace stratum
