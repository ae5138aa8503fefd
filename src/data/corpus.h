// Turns a --data argument into tokens: a token file is read as is, UTF-8 text is encoded with the
// BPE tokenizer (which one is decided by content). Checks every id against the vocabulary.
// Does not batch (see data_loader.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stratum {

// tokenizer_dir may be empty when path is a token file. vocab_size > 0 enables the id check.
// Text or tokens is decided by content (data_file_reading); `note`, when given, receives its note
// (which reading was chosen when the content overrode the file's name; else empty).
std::vector<std::int32_t> corpus_load_tokens(const std::string& path, const std::string& tokenizer_dir,
                                             int vocab_size, std::string* note = nullptr);

// The tokenizer directory to use: `explicit_dir` if set, else `model_dir` when it holds a
// tokenizer file set (BpeTokenizer::files_in), else empty.
std::string corpus_find_tokenizer(const std::string& explicit_dir, const std::string& model_dir);

}  // namespace stratum
