// libFuzzer target for the JSON Lines documents reader (jsonl_documents, Note [documents] in
// data/corpus.h): reads the input's "text" fields (and a "prompt" field, or a --prompt-template from
// the first line, by the input's size). Caps its stack at 128 KiB (Note [fuzz stack
// limit] in fuzz_file.h). Pass: success or stratum::Error; every document handed on comes from a
// later line than the one before. Fail: any other exception, a BugError, lines out of order, or a
// sanitizer report. Run with tools/fuzz.sh.
#include <algorithm>
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
    // Inputs of a size 1 mod 3 with a prompt field too (Note [prompt mask]); of 2 mod 3 with the
    // first line as a prompt template (Note [prompt template]), the rest the records.
    std::string_view records = text;
    stratum::PromptTemplate prompt;
    if (size % 3 == 1) prompt = stratum::PromptTemplate::field("prompt");
    if (size % 3 == 2) {
      const std::size_t nl = std::min(text.find('\n'), text.size());
      prompt = stratum::PromptTemplate::parse(text.substr(0, nl));
      if (prompt.empty()) fuzz_fail("a template of no pieces was accepted");
      for (const stratum::PromptTemplate::Piece& p : prompt.pieces())
        if (p.text.empty()) fuzz_fail("a template piece of no text");
      records = text.substr(std::min(nl + 1, text.size()));
    }
    stratum::jsonl_documents(records, "text", prompt, "'fuzz.jsonl'",
                             [&](std::size_t line, const std::string& made, const std::string&) {
                               if (line <= last)
                                 fuzz_fail("line " + std::to_string(line) + " after line " + std::to_string(last));
                               if (prompt.empty() && !made.empty()) fuzz_fail("a prompt without a prompt template");
                               last = line;
                             });
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input
  }
  return 0;
}
