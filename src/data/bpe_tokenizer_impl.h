// Internal to the BPE tokenizer's two source files (loading in bpe_tokenizer.cpp, encoding in
// bpe_tokenizer_encode.cpp): the compiled PCRE2 pattern type and the one UTF-8 helper both use.
// Not for other code.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "data/bpe_tokenizer.h"

namespace stratum {

struct BpeTokenizer::CompiledRegex {
  pcre2_code* code = nullptr;
  std::string name;  // for messages: "GPT-2's pre-tokenizer regex" or the file's
  CompiledRegex() = default;
  CompiledRegex(const CompiledRegex&) = delete;
  CompiledRegex& operator=(const CompiledRegex&) = delete;
  ~CompiledRegex() { pcre2_code_free(code); }
};

// Size of the character at s[i]: its UTF-8 length when well-formed, else 1 (one invalid byte).
std::size_t bpe_char_size_at(std::string_view s, std::size_t i);

}  // namespace stratum
