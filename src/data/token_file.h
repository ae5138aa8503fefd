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

// How a data file is read, decided by its content (Note [data by content]): the llm.c magic
// makes a shard; otherwise the first 64 KiB decide between UTF-8 text (valid UTF-8, no NUL, at most
// 1% other control bytes) and raw uint16 token ids (anything else; token ids below 256 alone put a
// NUL in every other byte). Only a file under 16 bytes that looks like text is decided by its
// name (".bin": tokens). `note` is one line saying which reading was chosen when the content
// overrode the name ("x.bin holds UTF-8 text: reading it as text"), else empty. Throws Error
// when the file cannot be read, or when it is neither text nor a whole number of uint16 ids.
enum class DataFileKind { Text, RawU16, LlmcShard };
struct DataFileReading {
  DataFileKind kind = DataFileKind::Text;
  std::string note;
  std::string not_text;  // RawU16: why it is not read as text ("byte 12 is not UTF-8", ...)
};
DataFileReading data_file_reading(const std::string& path);

// A file whose first int32 is the llm.c magic is a shard; anything else is raw uint16. Throws
// stratum::Error ("[data.tokens] '<path>': ...") for a missing or empty file, an odd-sized raw
// file, a bad shard version, a shard with fewer or more tokens than its header says, or a
// version-2 token id above INT32_MAX.
TokenFileData token_file_read(const std::string& path);

// Atomic writes (temporary + fsync + rename). Tokens non-empty, ids >= 0; a raw file's in
// 0..65535. A shard is version 1 (uint16) where every id fits, else version 2 (uint32: the
// vocabularies of Llama 3 and Qwen2).
void token_file_write_raw_u16(const std::string& path, const std::vector<std::int32_t>& tokens);
void token_file_write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens);

std::string token_file_format_name(TokenFileFormat format);  // "raw-u16" or "llmc-shard"

}  // namespace stratum
