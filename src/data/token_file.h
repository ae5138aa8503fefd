// Reads and writes pre-tokenized training data: llm.c shards (256 x int32 header with magic
// 20240520, version 1 = uint16 tokens, version 2 = uint32 tokens), Stratum's masked shards (the
// same header with magic 20261129: uint32 tokens carrying a loss mask, Note [loss mask]) and raw
// little-endian uint16 streams (nanoGPT .bin). Reads the whole file in one pass through a bounded staging buffer.
// Does not tokenize text (see the BPE tokenizer), memory-map, or batch (see the loader).
// Format notes: docs/formats.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stratum {

// Note [loss mask]: instruction tuning trains on the answers, not on the prompts (TRL's
// completion-only loss, Hugging Face's labels of -100). A token that is not a loss target, one
// the model is never asked to predict, is held in a token vector with bit 31 set (token_no_loss):
// a negative int32 whose low 31 bits are its id. It is still an input. A masked shard stores the
// same 32 bits per token. DataLoader::batch turns such a token into its id among the inputs and
// into the target -1 among the targets; a target below 0 adds nothing to the loss and its
// gradient, and the loss is the mean over the step's targets that count (Note [masked loss] in
// exec/executor.h). Text, raw and llm.c files carry no mask: every token is a target.
inline constexpr std::int32_t token_no_loss(std::int32_t id) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(id) | 0x80000000u);
}
inline constexpr bool token_is_target(std::int32_t token) { return token >= 0; }
inline constexpr std::int32_t token_id(std::int32_t token) { return token & 0x7fffffff; }
// How many of tokens[0, n) are loss targets (token_is_target; a batch's targets: those >= 0).
std::size_t token_target_count(const std::int32_t* tokens, std::size_t n);

enum class TokenFileFormat { RawU16, LlmcShard, MaskedShard };

struct TokenFileData {
  TokenFileFormat format = TokenFileFormat::RawU16;
  std::vector<std::int32_t> tokens;  // (N,) token ids, N >= 1; a masked shard's as Note [loss mask]
};

// How a data file is read, decided by its content (Note [data by content]): the llm.c magic
// makes a shard; otherwise the first 64 KiB decide between UTF-8 text (valid UTF-8, no NUL, at most
// 1% other control bytes) and raw uint16 token ids (anything else; token ids below 256 alone put a
// NUL in every other byte). Only a file under 16 bytes that looks like text is decided by its
// name (".bin": tokens). `note` is one line saying which reading was chosen when the content
// overrode the name ("x.bin holds UTF-8 text: reading it as text"), else empty. Throws Error
// when the file cannot be read, or when it is neither text nor a whole number of uint16 ids.
enum class DataFileKind { Text, RawU16, LlmcShard, MaskedShard };
struct DataFileReading {
  DataFileKind kind = DataFileKind::Text;
  std::string note;
  std::string not_text;  // RawU16: why it is not read as text ("byte 12 is not UTF-8", ...)
};
DataFileReading data_file_reading(const std::string& path);

// A file whose first int32 is the llm.c magic is a shard, the masked magic a masked shard;
// anything else is raw uint16. Throws stratum::Error ("[data.tokens] '<path>': ...") for a missing
// or empty file, an odd-sized raw file, a bad shard version, a shard with fewer or more tokens
// than its header says, or a version-2 token id above INT32_MAX.
TokenFileData token_file_read(const std::string& path);

// Atomic writes (temporary + fsync + rename). Tokens non-empty, ids >= 0; a raw file's in
// 0..65535. A shard is version 1 (uint16) where every id fits, else version 2 (uint32: the
// vocabularies of Llama 3 and Qwen2).
void token_file_write_raw_u16(const std::string& path, const std::vector<std::int32_t>& tokens);
void token_file_write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens);
// A masked shard (Note [loss mask]): tokens as held in memory, at least one of them a target.
void token_file_write_masked(const std::string& path, const std::vector<std::int32_t>& tokens);

std::string token_file_format_name(TokenFileFormat format);  // "raw-u16", "llmc-shard" or "masked-shard"

}  // namespace stratum
