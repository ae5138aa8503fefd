// libFuzzer target for the Jinja engine (formats/jinja.h, Note [jinja subset]): parses the input
// as a chat template and renders it over a fixed conversation with tools (once with and once
// without the generation prompt). Caps its stack at 1 MiB (Note [fuzz stack limit] in
// fuzz_file.h: the parser's depth is bounded at 128 levels, the macro calls at 8). Pass: success or stratum::Error; {% generation %} spans ordered and inside the
// text. Fail: any other exception, a BugError, a bad span, or a sanitizer report. Run with
// tools/fuzz.sh.
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/jinja.h"
#include "fuzz_file.h"
#include "stratum/error.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) { stratum::fuzz::fuzz_abort("jinja", what); }

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "documents": null,
    "messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "h\u00e9llo \u2713"},
                 {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi!",
                  "tool_calls": [{"id": "call12345", "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
                 {"role": "tool", "content": "42"}, {"role": "user", "content": ""}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack(1 << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const stratum::JinjaTemplate t = stratum::JinjaTemplate::parse(source, "'fuzz.jinja'");
    for (const bool prompt : {false, true}) {
      nlohmann::ordered_json c = context();
      c["add_generation_prompt"] = prompt;
      try {
        const stratum::JinjaTemplate::Rendered r = t.render(c);
        std::size_t at = 0;
        for (const auto& [begin, end] : r.generation) {
          if (begin < at || end < begin || end > r.text.size()) fuzz_fail("a generation span out of order or range");
          at = end;
        }
        if (!t.has_generation() && !r.generation.empty()) fuzz_fail("generation spans without a generation block");
      } catch (const stratum::BugError&) {
        throw;
      } catch (const stratum::Error&) {
        // the template's own error; the other render still runs
      }
    }
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected template
  }
  return 0;
}
