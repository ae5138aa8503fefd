// Reads and writes pre-tokenized training data: llm.c shards (256 x int32 header with magic
// 20240520, version 1 = uint16 tokens, version 2 = uint32 tokens) and raw little-endian uint16
// streams (nanoGPT .bin). Reads the whole file in one pass through a bounded staging buffer.
// Does not tokenize text (see the BPE tokenizer), memory-map, or batch (see the loader).
// Format notes: docs/formats.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stratum {

enum class TokenFileFormat { RawU16, LlmcShard };

struct TokenFileData {
  TokenFileFormat format = TokenFileFormat::RawU16;
  std::vector<std::int32_t> tokens;  // (N,) token ids, N >= 1
};

// True when the file starts with the llm.c magic or its name ends in ".bin". Never throws: a
// missing or unreadable file counts only by its extension.
bool token_file_is_token_file(const std::string& path);

// A file whose first int32 is the llm.c magic is a shard; anything else is raw uint16. Throws
// stratum::Error ("[data.tokens] '<path>': ...") for a missing or empty file, an odd-sized raw
// file, a bad shard version, a shard with fewer or more tokens than its header says, or a
// version-2 token id above INT32_MAX.
TokenFileData token_file_read(const std::string& path);

// Atomic writes (temporary + fsync + rename). Every id must be in 0..65535 and tokens non-empty.
void token_file_write_raw_u16(const std::string& path, const std::vector<std::int32_t>& tokens);
void token_file_write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens);  // version 1

std::string token_file_format_name(TokenFileFormat format);  // "raw-u16" or "llmc-shard"

}  // namespace stratum
