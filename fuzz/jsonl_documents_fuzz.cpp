// libFuzzer target for the JSON Lines documents reader (jsonl_documents, Note [documents] in
// data/corpus.h): reads the input's "text" fields (and "prompt", for odd-sized inputs). Caps its stack at 128 KiB (Note [fuzz stack
// limit] in fuzz_file.h). Pass: success or stratum::Error; every document handed on comes from a
// later line than the one before. Fail: any other exception, a BugError, lines out of order, or a
// sanitizer report. Run with tools/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "data/corpus.h"
#include "fuzz_file.h"
#include "stratum/error.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) { stratum::fuzz::fuzz_abort("jsonl_documents", what); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::size_t last = 0;
  try {
    // Half the inputs with a prompt field too (Note [prompt mask]).
    const std::string prompt_field = size % 2 == 0 ? "" : "prompt";
    stratum::jsonl_documents(text, "text", prompt_field, "'fuzz.jsonl'",
                             [&](std::size_t line, const std::string& prompt, const std::string&) {
                               if (line <= last)
                                 fuzz_fail("line " + std::to_string(line) + " after line " + std::to_string(last));
                               if (prompt_field.empty() && !prompt.empty()) fuzz_fail("a prompt without a prompt field");
                               last = line;
                             });
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input
  }
  return 0;
}
