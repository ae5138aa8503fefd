// Internal to the BPE tokenizer's source files (loading in bpe_tokenizer.cpp, encoding in
// bpe_tokenizer_encode.cpp, the SentencePiece-style parts in bpe_tokenizer_sp.cpp): the compiled
// PCRE2 pattern type, one encode() call's state, the SentencePiece-style loading steps and the
// UTF-8 helper they share. Not for other code.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

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

struct BpeTokenizer::EncodeState {
  std::vector<std::int32_t> out;
  // Per-call cache (keeps encode thread-safe): piece -> (offset, count) of its ids in `out`.
  // Pieces are views into the text or into `prefixed`.
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> cache;
  std::deque<std::string> prefixed;  // text pieces with the ByteLevel prefix space, or NFC'd; never move
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match{nullptr, &pcre2_match_data_free};
  const char* text_begin = nullptr;  // the text encode() was given (Metaspace's prepend_scheme "first")

  // Appends the ids `piece` got earlier in this call; false when it has none yet.
  bool cached(std::string_view piece) {
    const auto it = cache.find(piece);
    if (it == cache.end()) return false;
    const auto [offset, count] = it->second;
    for (std::size_t k = 0; k < count; ++k) {
      const std::int32_t id = out[offset + k];  // copy: push_back may reallocate
      out.push_back(id);
    }
    return true;
  }
  // Records out[offset..] as the ids of `piece` (a view that outlives the call's cache).
  void remember(std::string_view piece, std::size_t offset) {
    constexpr std::size_t kCacheMaxEntries = 1 << 16;
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(piece, std::make_pair(offset, out.size() - offset));
  }
};

class JsonFields;

// Note [sentencepiece bpe]: the tokenizer.json parts of a model with "byte_fallback": true, read
// into `tok` with one-line errors as the rest of the loader gives them.
struct BpeTokenizer::SentencePiece {
  // "normalizer", "pre_tokenizer" and "decoder".
  static void components_read(BpeTokenizer& tok, const JsonFields& f, const nlohmann::json& root);
  // model.vocab: pieces, "\u2581" for a space, and the 256 "<0xNN>" byte tokens.
  static void vocab_read(BpeTokenizer& tok, const JsonFields& f, const nlohmann::json& vocab);
  // The id of a piece as written in model.merges, or -1.
  static std::int32_t piece_id(const BpeTokenizer& tok, std::string_view piece);
  // How many pieces of several characters no merge makes (byte and added tokens aside).
  static std::size_t unmade_count(const BpeTokenizer& tok);
};

// Size of the character at s[i]: its UTF-8 length when well-formed, else 1 (one invalid byte).
std::size_t bpe_char_size_at(std::string_view s, std::size_t i);

// A token quoted for a one-line error message: control bytes escaped, long ones cut.
std::string bpe_quoted(std::string_view s);

// Both vocabularies' checks (byte-level and SentencePiece-style): `vocab` is a non-empty JSON
// object of token -> integer id, the ids unique and covering 0..N-1 (N = vocab.size()); calls
// each(token, id) for every entry in file order. `where` starts its one-line errors
// ("'dir/tokenizer.json' model.vocab"), `hint` ends them.
void bpe_vocab_walk(const nlohmann::json& vocab, const std::string& where, const char* hint,
                    const std::function<void(const std::string& token, std::int32_t id)>& each);

// Note [sentencepiece bpe]: `text` with each space as "\u2581", after one "\u2581" when `prepend`
// (the legacy normalizer and the Metaspace pre-tokenizer both make it).
std::string bpe_sp_spaces(std::string_view text, bool prepend);

}  // namespace stratum
