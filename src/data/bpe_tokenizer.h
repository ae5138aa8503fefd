// GPT-2 byte-level BPE tokenizer: loads encoder.json + vocab.bpe (OpenAI names) or
// vocab.json + merges.txt (Hugging Face names), encodes text to token ids exactly as OpenAI's
// GPT-2 encoder does, and decodes ids back to raw bytes.
// Does not: treat "<|endoftext|>" or any other special token specially (it is ordinary text),
// add BOS/EOS ids, normalize Unicode, pad or truncate, or learn merges.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace stratum {

// Note [bpe invalid utf-8]
// Text is split with GPT-2's pre-tokenizer regex (PCRE2, UTF + UCP). The pattern is compiled
// with PCRE2_MATCH_INVALID_UTF, so an ill-formed UTF-8 sequence (stray continuation byte,
// truncated or overlong sequence, encoded surrogate, > U+10FFFF) never matches any part of the
// pattern. Every valid character is matched by some alternative, so the only bytes between two
// matches are invalid ones: each maximal run of such bytes becomes one pre-token of its own and
// is BPE-merged over its raw bytes like any other pre-token. Encoding therefore never fails on
// bad input, is deterministic, and decode(encode(x)) == x for every byte string x.
//
// Thread safety: a loaded BpeTokenizer is immutable. All const methods, encode included, may be
// called concurrently from any number of threads: encode keeps its merged-word cache and its
// PCRE2 match data local to the call, so there is no shared mutable state.
class BpeTokenizer {
 public:
  // dir holds encoder.json + vocab.bpe (OpenAI names) or vocab.json + merges.txt (Hugging Face
  // names). Throws stratum::Error ("[tokenizer] ...") naming the file and the problem when a
  // file is missing or malformed. Requirements beyond GPT-2's format: token ids are unique and
  // cover 0..N-1, every one of the 256 single-byte tokens is present, and every merge names two
  // tokens of the vocabulary whose concatenation is also in it.
  static BpeTokenizer load(const std::string& dir);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;
  ~BpeTokenizer();

  // Token ids of `text` (arbitrary bytes; see Note [bpe invalid utf-8]).
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Raw bytes of the tokens concatenated (may be invalid UTF-8 when cut mid-character).
  // Throws stratum::Error if an id is out of range.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  // Raw bytes of one token; throws stratum::Error if id is out of range.
  std::string decode_token(std::int32_t id) const;
  // Number of entries in encoder.json (50257 for GPT-2).
  std::int32_t vocab_size() const;
  // Id of "<|endoftext|>", or -1 if the vocabulary has no such token.
  std::int32_t eot_id() const;

 private:
  struct CompiledRegex;  // owns the PCRE2 code; defined in the .cpp to keep pcre2.h private
  struct Merge {
    std::int32_t rank;       // line order in the merges file; lower merges first
    std::int32_t merged_id;  // id of left + right
  };

  BpeTokenizer();
  // Appends the ids of one pre-token (raw bytes) to `out`.
  void bpe_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  const Merge* merge_find(std::int32_t left_id, std::int32_t right_id) const;

  std::vector<std::string> id_to_bytes_;  // (vocab_size) raw bytes of each token
  std::int32_t byte_ids_[256] = {};       // id of the single-byte token for each byte value
  std::unordered_map<std::uint64_t, Merge> merges_;  // key: left id << 32 | right id
  std::int32_t eot_id_ = -1;
  std::unique_ptr<CompiledRegex> regex_;
};

}  // namespace stratum
