// BPE tokenizer: loads a Hugging Face tokenizer.json (byte-level BPE as in GPT-2, Llama 3 and
// Qwen2, Note [tokenizer.json]; SentencePiece-style BPE with byte fallback as in Llama 2,
// TinyLlama and Mistral, Note [sentencepiece bpe]) or GPT-2's encoder.json + vocab.bpe (OpenAI
// names) / vocab.json + merges.txt (Hugging Face names), encodes text to token ids exactly as
// OpenAI's GPT-2 encoder and Hugging Face `tokenizers` do, and decodes ids back to raw bytes.
// Does not: add BOS/EOS ids (bos_id() only reports them), normalize Unicode other than to NFC
// (a tokenizer.json's "NFC" normalizer, Qwen2's), pad or truncate, learn merges, or load
// Unigram/WordPiece tokenizers or SentencePiece's own tokenizer.model.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace stratum {

// Note [bpe invalid utf-8]
// Text is split with a pre-tokenizer regex (PCRE2, UTF + UCP): GPT-2's, or the one a
// tokenizer.json names. The pattern is compiled with PCRE2_MATCH_INVALID_UTF, so an ill-formed
// UTF-8 sequence (stray continuation byte, truncated or overlong sequence, encoded surrogate,
// > U+10FFFF) never matches any part of the pattern. The text between two matches becomes one
// pre-token of its own (Hugging Face's "Isolated" split behaviour) and is BPE-merged over its raw
// bytes like any other pre-token; with GPT-2's and Llama 3's patterns, which match every valid
// character, such gaps are exactly the maximal runs of invalid bytes. Empty matches produce no
// pre-token but end the gap before them, as in Hugging Face's Split. Encoding therefore never
// fails on bad input with those patterns (a tokenizer.json regex that backtracks past PCRE2's
// match limit makes encode throw), is deterministic, and decode(encode(x)) == x for every byte
// string x unless the tokenizer adds a prefix space (ByteLevel add_prefix_space: true).
//
// Note [tokenizer.json]
// Supported: "model": {"type": "BPE"} with a byte-level vocabulary (GPT-2's byte-to-unicode
// alphabet) and "merges" as "a b" strings or ["a", "b"] pairs; "normalizer": null or
// {"type": "NFC"} (Qwen2; Note [nfc normalizer]);
// "pre_tokenizer": ByteLevel (GPT-2's regex, add_prefix_space false or true) or a Sequence of
// Split {"pattern": {"Regex": ...}, "behavior": "Isolated", "invert": false} and ByteLevel
// {"add_prefix_space": false, "use_regex": false} (Llama 3); "decoder": ByteLevel;
// "model.ignore_merges" (a pre-token that is a vocabulary token is emitted whole, as Llama 3
// expects); "added_tokens" with lstrip, rstrip and single_word false; and the SentencePiece-style
// layout of Note [sentencepiece bpe]. Encoding follows Hugging
// Face `tokenizers`: added tokens are cut out of the raw text first (leftmost match, longest
// first; "normalized": false tokens in a first pass, "normalized": true ones in what is left),
// each map to their id, and every piece of text between them is pre-tokenized (a prefix space
// added to each piece when add_prefix_space is true) and BPE-merged. The post_processor is not
// applied: encode() never adds BOS/EOS; bos_id()/eos_id() report what its TemplateProcessing
// would add. "truncation" and "padding" are ignored. Ids must be what Hugging Face would assign:
// model.vocab covers 0..V-1, an added token already in the vocabulary keeps its id (and must
// stand for its own text there), and the others take V, V+1, ... in file order. Refused with
// one error naming the file, the field and what is supported: other model types (Unigram,
// WordPiece, WordLevel), normalizers other than NFC (and Note [sentencepiece bpe]'s), other
// pre-tokenizers and decoders, added tokens with lstrip, rstrip or single_word. PCRE2 stands in for Hugging Face's Oniguruma: they agree on the constructs real
// tokenizer regexes use (\p{L}, \p{N}, \s, (?i:...), lookahead, {m,n}); ^ and $ match at line
// ends as in Oniguruma; known differences: \h (hex digit in Oniguruma, horizontal space in
// PCRE2) and U+180E (\s in PCRE2 only).
//
// Note [nfc normalizer]: with "normalizer": {"type": "NFC"} each piece of text left after the
// "normalized": false added tokens are cut out is brought to Unicode Normalization Form C (ICU's
// unorm2 NFC) before the "normalized": true added tokens are matched and the rest is
// pre-tokenized, as Hugging Face's AddedVocabulary does. Pure ASCII is NFC already and is not
// copied. Only the well-formed UTF-8 runs are normalized; ill-formed bytes stay where they are
// (Note [bpe invalid utf-8]; Hugging Face takes no ill-formed text at all). decode() gives the
// normalized text back, so decode(encode(x)) == NFC(x).
//
// Note [sentencepiece bpe]
// "model": {"type": "BPE", "byte_fallback": true} is SentencePiece's BPE as Hugging Face's
// LlamaConverter writes it (Llama 2, TinyLlama, Mistral; the golden files come from a model that
// sentencepiece itself trained, and sentencepiece gives the same ids; tools/make_sp_tokenizer_json.py).
// Its vocabulary is of text pieces, where "\u2581" stands for a space, plus the 256 byte tokens
// "<0x00>".."<0xFF>" (all required). Spaces become "\u2581" in one of two ways, both accepted:
// - legacy (Llama 2 on the Hub): "normalizer" a Sequence of Prepend "\u2581" (optional) and
//   Replace " " -> "\u2581", "pre_tokenizer": null. As in Hugging Face, the normalizer runs on
//   each piece of text between "normalized": false added tokens, so each such piece gets the
//   prefix ("<s>Hi" -> "<s>", "\u2581Hi");
// - transformers' legacy=False: "normalizer": null, "pre_tokenizer" Metaspace {"replacement":
//   "\u2581", "prepend_scheme": "first" | "always" | "never" (or the older "add_prefix_space"),
//   "split": false | true}: spaces replaced, "\u2581" prepended to a piece that does not start
//   with one (with "first", only to the piece at the start of the text), and with split true the
//   piece is cut before each "\u2581".
// Each piece is one BPE word, split into characters: a character in the vocabulary is its token,
// any other (and every ill-formed UTF-8 byte) is its bytes' "<0xNN>" tokens; then the merges run
// in Hugging Face's order (lowest rank first, leftmost on ties, a heap over a linked list: a
// whole-document piece stays O(n log n)). Where no piece of several characters holds a newline,
// no merge can cross one, so a word is cut after each newline with the same ids and memory bounded
// by the longest line; where no piece holds "\u2581" right after a character other than "\u2581"
// (SentencePiece's pieces start with their spaces, as Llama 2's and Mistral's do), a word is also
// cut before each such "\u2581", and the pieces between cuts ("\u2581the") are cached for the call
// as byte-level pre-tokens are. "decoder": a Sequence of Replace "\u2581" -> " ",
// ByteFallback, Fuse and an optional Strip of " " at the start (Llama 2's), or a Metaspace decoder:
// decode_token gives a token's raw bytes (" the" for "\u2581the", one byte for "<0x0A>"), decode()
// their concatenation less the one space Strip takes off the front (or, with a Metaspace decoder
// whose prepend_scheme is not "never", less the first token's spaces, as Hugging Face's; it shows
// a byte token as its "<0xNN>" text there, where Stratum gives the byte). decode(encode(x)) == x
// unless x starts with a space or an added token, or holds a "\u2581" (the space piece: it decodes
// as a space); Hugging Face's decode differs from x the same way.
//
// Thread safety: a loaded BpeTokenizer is immutable. All const methods, encode included, may be
// called concurrently from any number of threads: encode keeps its merged-word cache and its
// PCRE2 match data local to the call, so there is no shared mutable state.
class BpeTokenizer {
 public:
  // dir holds tokenizer.json (Hugging Face; Note [tokenizer.json]), else encoder.json +
  // vocab.bpe (OpenAI names) or vocab.json + merges.txt (Hugging Face names). tokenizer.json wins
  // when a folder has both, because only it carries the added tokens and the pre-tokenizer regex.
  // Throws stratum::Error ("[tokenizer] ...") naming the file and the problem when a file is
  // missing or malformed. Requirements beyond the formats: token ids are unique and cover
  // 0..N-1, every one of the 256 single-byte tokens is present, and every merge names two tokens
  // of the vocabulary whose concatenation is also in it.
  static BpeTokenizer load(const std::string& dir);
  // The complete tokenizer file set in `dir`, in the order load() prefers them:
  // "tokenizer.json", "encoder.json + vocab.bpe" or "vocab.json + merges.txt"; "" when none is.
  static std::string files_in(const std::string& dir);
  // Loads one Hugging Face tokenizer.json file (Note [tokenizer.json]); same errors as load().
  static BpeTokenizer load_tokenizer_json(const std::string& path);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;
  ~BpeTokenizer();

  // Token ids of `text` (arbitrary bytes; see Note [bpe invalid utf-8]). Added tokens of a
  // tokenizer.json found in the text map to their ids; no BOS/EOS is added.
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Each of `texts` encoded as encode() encodes it, in one call whose cache of pieces serves them
  // all (a batch of short documents merges each distinct word once, not once per document): the
  // ids of every text in order, text k's ending at ends[k] (ends gets texts.size() entries).
  std::vector<std::int32_t> encode_each(const std::vector<std::string_view>& texts, std::vector<std::size_t>& ends) const;
  // Raw bytes of the tokens concatenated (may be invalid UTF-8 when cut mid-character); an
  // added token outside model.vocab gives its content. Throws stratum::Error if an id is out of
  // range.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  // Raw bytes of one token; throws stratum::Error if id is out of range.
  std::string decode_token(std::int32_t id) const;
  // Number of ids: max id + 1 over the vocabulary and the added tokens (50257 for GPT-2,
  // 128256 for Llama 3).
  std::int32_t vocab_size() const;
  // Id of "<|endoftext|>" (GPT-2's end of text), or -1 if there is no such token.
  std::int32_t eot_id() const;
  // Id of the token whose text is `content` (an added token's content, else a vocabulary token's
  // raw bytes, i.e. what decode_token returns: " the", not "Ġthe"), or -1. E.g.
  // token_id("<|begin_of_text|>"), token_id("<|eot_id|>").
  std::int32_t token_id(std::string_view content) const;
  // The contents of the tokenizer.json's added tokens ("<|im_start|>", "</s>", ...), in id order.
  std::vector<std::string> added_tokens() const;
  // Ids the tokenizer.json post_processor (TemplateProcessing, alone or in a Sequence) puts
  // before / after a single sequence, or -1 when it adds none or there is no tokenizer.json.
  // encode() never adds them. Llama 3: bos_id() == token_id("<|begin_of_text|>"), eos_id() == -1.
  std::int32_t bos_id() const;
  std::int32_t eos_id() const;
  // "byte-level BPE" or "SentencePiece-style BPE with byte fallback" (Note [sentencepiece bpe]).
  const char* kind() const;

 private:
  struct CompiledRegex;  // owns the PCRE2 code; defined in the .cpp to keep pcre2.h private
  struct EncodeState;    // one encode() call's cache and PCRE2 match data; bpe_tokenizer_impl.h
  struct Loader;         // file parsing and validation; defined in the .cpp
  struct SentencePiece;  // Note [sentencepiece bpe]'s loading; bpe_tokenizer_impl.h
  struct Merge {
    std::int32_t rank;       // order in the merges list; lower merges first
    std::int32_t merged_id;  // id of left + right
  };
  struct AddedToken {
    std::string content;  // matched verbatim in the text
    std::int32_t id;
  };
  // The added tokens of one matching pass, sorted by (first byte, length descending):
  // tokens[first_byte_begin[b] .. first_byte_begin[b + 1]) start with byte b.
  struct AddedTokenPass {
    std::vector<AddedToken> tokens;
    std::array<std::uint32_t, 257> first_byte_begin{};
  };

  // Hash for unordered_map<std::string, ...> lookups by std::string_view without a copy.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringToId = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

  BpeTokenizer();
  // Encodes `text` after cutting out the added tokens of pass `pass` and those of later passes.
  void encode_added(std::string_view text, std::size_t pass, EncodeState& state) const;
  // Pre-tokenizes one piece of text between added tokens and appends the ids of its pre-tokens.
  void encode_segment(std::string_view segment, EncodeState& state) const;
  // Appends the ids of one pre-token (raw bytes) to `out`.
  void bpe_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  // Note [sentencepiece bpe]: one piece of text between added tokens, and one BPE word of it.
  void sp_segment(std::string_view segment, EncodeState& state) const;
  void sp_word(std::string_view word, EncodeState& state) const;
  void sp_line(std::string_view word, std::vector<std::int32_t>& out) const;  // one word, or a line of it
  const Merge* merge_find(std::int32_t left_id, std::int32_t right_id) const;

  std::vector<std::string> id_to_bytes_;  // (vocab_size) raw bytes of each token
  std::int32_t byte_ids_[256] = {};       // id of the single-byte token for each byte value
  StringToId bytes_to_id_;                // raw bytes -> id of the model vocabulary's tokens
  std::unordered_map<std::uint64_t, Merge> merges_;  // while loading; key: left id << 32 | right id
  // Note [merge table]: merges_ as an open-addressing table (linear probing, a power-of-two size
  // at least twice the merges, Fibonacci hashing); an empty slot's key is ~0, which no pair has
  // (ids are below 2^31). merge_find was 30% of a SentencePiece-style encode in the map.
  struct MergeSlot {
    std::uint64_t key = ~std::uint64_t{0};
    Merge merge{};
  };
  std::vector<MergeSlot> merge_table_;
  int merge_shift_ = 64;
  void merge_table_build();  // from merges_, which it empties
  // [0]: "normalized": false added tokens, matched first; [1]: "normalized": true ones.
  std::array<AddedTokenPass, 2> added_passes_;
  StringToId added_ids_;           // content -> id of the added tokens
  bool add_prefix_space_ = false;  // ByteLevel add_prefix_space: " " before each text piece
  bool ignore_merges_ = false;     // a pre-token that is a vocabulary token is emitted whole
  bool nfc_ = false;               // "normalizer": {"type": "NFC"} (Note [nfc normalizer])
  // Note [sentencepiece bpe]; all false for byte-level BPE.
  enum class Prepend : std::uint8_t { Never, First, Always };
  bool sp_ = false;                // SentencePiece-style BPE (model.byte_fallback)
  bool sp_replace_ = false;        // the legacy normalizer: " " -> "\u2581" per piece ...
  bool sp_prepend_ = false;        // ... after a "\u2581" prefix (Prepend)
  bool sp_metaspace_ = false;      // the Metaspace pre-tokenizer, prepending by sp_scheme_
  Prepend sp_scheme_ = Prepend::Never;
  bool sp_split_ = false;          // Metaspace split: a word starts at each "\u2581"
  bool sp_strip_ = false;          // decode() drops one leading space (the Strip decoder)
  bool sp_first_spaces_ = false;   // decode() drops the first token's spaces (a Metaspace decoder)
  bool sp_line_words_ = false;     // no piece of several characters holds "\n": a word ends at each
  bool sp_space_words_ = false;    // no piece holds "\u2581" after another character: a word ends there
  StringToId piece_to_id_;         // vocabulary pieces as written ("\u2581the") -> id
  std::array<std::int32_t, 128> sp_ascii_ids_{};  // the piece of each ASCII character, or its byte token
  std::int32_t eot_id_ = -1;
  std::int32_t bos_id_ = -1;
  std::int32_t eos_id_ = -1;
  std::unique_ptr<CompiledRegex> regex_;
};

}  // namespace stratum
