// GPT-2's byte-to-unicode table, written out independently of src/data/bpe_tokenizer so the
// tokenizer.json test and fuzz target that build vocabularies with it do not reuse the code they
// check. Header-only; shared by tests/bpe_tokenizer_json_test.cpp and
// fuzz/bpe_tokenizer_json_fuzz.cpp.
#pragma once

#include <string>

namespace stratum::testing {

// GPT-2's byte-to-unicode character for byte b, UTF-8 encoded.
inline std::string gpt2_byte_symbol(int b) {
  int next = 256, cp = -1;
  for (int v = 0; v <= b; ++v) {
    const bool printable = (v >= '!' && v <= '~') || (v >= 0xA1 && v <= 0xAC) || v >= 0xAE;
    cp = printable ? v : next++;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

}  // namespace stratum::testing
