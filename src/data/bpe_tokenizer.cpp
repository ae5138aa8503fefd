// Byte-level BPE tokenizer, loading half (encoding is bpe_tokenizer_encode.cpp): file loading and validation (encoder.json + vocab.bpe, vocab.json +
// merges.txt, Hugging Face tokenizer.json), added-token splitting, PCRE2 pre-tokenization, merges.
// Does not: normalize text, apply a tokenizer.json post_processor, or cache across encode() calls
// (see the thread-safety note in bpe_tokenizer.h).
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "core/file_util.h"
#include "core/printable.h"
#include "data/bpe_tokenizer_impl.h"
#include "formats/json_fields.h"
#include "stratum/error.h"

namespace stratum {

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer (openai/gpt-2 src/encoder.py); also Hugging Face's ByteLevel regex.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEotText = "<|endoftext|>";
constexpr int kUnmapped = -1;

constexpr const char* kFixHint = ": use the GPT-2 tokenizer files unmodified";
constexpr const char* kJsonFixHint =
    ": use the tokenizer.json that came with the model, unmodified";
constexpr const char* kSupported =
    "Stratum supports BPE tokenizer.json files: byte-level (GPT-2, Llama 3, Qwen2) and "
    "SentencePiece-style with byte fallback (Llama 2, TinyLlama, Mistral)";
constexpr const char* kSentencePiece =
    "SentencePiece-style spaces need \"model\": {\"byte_fallback\": true} (as Llama 2's and "
    "Mistral's have); ";
constexpr const char* kPreTokenizersSupported =
    "supported: ByteLevel, or a Sequence of Split {\"pattern\": {\"Regex\": ...}, \"behavior\": "
    "\"Isolated\", \"invert\": false} and ByteLevel {\"add_prefix_space\": false, \"use_regex\": "
    "false} as in Llama 3";

// GPT-2's bytes_to_unicode(), inverted: code point (< 324) -> byte value, or kUnmapped.
// Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in byte order.
std::array<int, 324> unicode_to_byte_table() {
  std::array<int, 324> table;
  table.fill(kUnmapped);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[static_cast<std::size_t>(printable ? b : next++)] = b;
  }
  return table;
}

// Decodes one UTF-8 code point at s[i]; returns false on an ill-formed sequence.
bool utf8_next(std::string_view s, std::size_t& i, char32_t& cp) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  int extra = 0;
  if (lead < 0x80) {
    cp = lead;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    cp = lead & 0x1F, extra = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    cp = lead & 0x0F, extra = 2;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    cp = lead & 0x07, extra = 3;
  } else {
    return false;
  }
  if (s.size() - i <= static_cast<std::size_t>(extra)) return false;  // truncated
  for (int k = 1; k <= extra; ++k) {
    const unsigned char c = byte(i + static_cast<std::size_t>(k));
    if ((c & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (c & 0x3F);
  }
  static const char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  i += static_cast<std::size_t>(extra) + 1;
  return true;
}

std::size_t char_size_at(std::string_view s, std::size_t i) {
  std::size_t next = i;
  char32_t cp = 0;
  return utf8_next(s, next, cp) ? next - i : 1;
}

// Turns a token as written in the files (byte-to-unicode alphabet) into its raw bytes.
bool symbol_to_bytes(std::string_view symbol, std::string& bytes) {
  static const std::array<int, 324> kTable = unicode_to_byte_table();
  bytes.clear();
  for (std::size_t i = 0; i < symbol.size();) {
    char32_t cp = 0;
    if (!utf8_next(symbol, i, cp) || cp >= kTable.size() || kTable[cp] == kUnmapped) return false;
    bytes.push_back(static_cast<char>(kTable[cp]));
  }
  return true;
}


std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string tokenizer_file_read(const std::string& path, const char* missing_hint) {
  STRATUM_CHECK(file_exists(path), "[tokenizer] '", path, "' is missing: ", missing_hint);
  try {
    return file_read_all(path);
  } catch (const Error& e) {
    STRATUM_FAIL("[tokenizer] cannot read '", path, "': ", one_line(e.what()));
  }
}

constexpr const char* kGpt2FilesHint =
    "put the GPT-2 tokenizer files (encoder.json + vocab.bpe or vocab.json + merges.txt) in that "
    "folder";

}  // namespace

std::string bpe_quoted(std::string_view s) {
  return "'" + printable_text(s.substr(0, 48)) + (s.size() > 48 ? "...'" : "'");
}

void bpe_vocab_walk(const Json& vocab, const std::string& where, const char* hint,
                    const std::function<void(const std::string& token, std::int32_t id)>& each) {
  STRATUM_CHECK(vocab.is_object() && !vocab.empty(), "[tokenizer] ", where,
                " must be a non-empty JSON object of token -> id, got a ", vocab.type_name(), hint);
  const std::size_t n = vocab.size();
  STRATUM_CHECK(n <= static_cast<std::size_t>(INT32_MAX), "[tokenizer] ", where, " has too many entries (", n, ")");
  std::vector<bool> seen(n, false);
  for (const auto& [key, value] : vocab.items()) {
    STRATUM_CHECK(value.is_number_integer(), "[tokenizer] ", where, ": token ", bpe_quoted(key), " maps to a ",
                  value.type_name(), ", expected an integer id", hint);
    const std::int64_t id = value.get<std::int64_t>();
    STRATUM_CHECK(id >= 0 && static_cast<std::uint64_t>(id) < n && !seen[static_cast<std::size_t>(id)],
                  "[tokenizer] ", where, ": token ", bpe_quoted(key), " has id ", id,
                  " but ids must be unique and cover 0..", n - 1, hint);
    seen[static_cast<std::size_t>(id)] = true;
    each(key, static_cast<std::int32_t>(id));
  }
}

// Fills a BpeTokenizer from parsed files; shared by both loaders so that they validate alike.
struct BpeTokenizer::Loader {
  BpeTokenizer& tok;
  std::int32_t next_rank = 0;

  // Reads the vocabulary, a JSON object of token -> id with ids unique and covering 0..N-1.
  // `where` starts messages ("'dir/encoder.json'", "'dir/tokenizer.json' model.vocab").
  // A token outside the byte-to-unicode alphabet is accepted only when `added` (content -> id of
  // added tokens) holds it with the same id: its bytes are then its content.
  void vocab_read(const Json& vocab, const std::string& where, const char* hint,
                  const StringToId& added) {
    tok.id_to_bytes_.resize(vocab.is_object() ? vocab.size() : 0);
    std::string bytes;
    bpe_vocab_walk(vocab, where, hint, [&](const std::string& key, std::int32_t id) {
      if (symbol_to_bytes(key, bytes)) {
        tok.id_to_bytes_[static_cast<std::size_t>(id)] = bytes;
        tok.bytes_to_id_.emplace(bytes, id);
        return;
      }
      const auto it = added.find(key);
      STRATUM_CHECK(it != added.end() && it->second == id, "[tokenizer] ", where, ": token ", bpe_quoted(key),
                    " has a character outside GPT-2's byte-to-unicode alphabet", hint);
      tok.id_to_bytes_[static_cast<std::size_t>(id)] = key;  // reached as an added token only
    });
    for (int b = 0; b < 256; ++b) {
      const auto it = tok.bytes_to_id_.find(std::string(1, static_cast<char>(b)));
      STRATUM_CHECK(it != tok.bytes_to_id_.end(), "[tokenizer] ", where,
                    " lacks the single-byte token for byte ", b,
                    ": a byte-level BPE vocabulary needs all 256", hint);
      tok.byte_ids_[b] = it->second;
    }
  }

  // Adds the next merge (rank = call order). where() names it for messages ("'dir/vocab.bpe'
  // line 7"), vocab_name names the vocabulary, as_written quotes it.
  template <class Where>
  void merge_add(std::string_view left, std::string_view right, Where where,
                 const std::string& vocab_name, std::string_view as_written, const char* hint) {
    std::int32_t ids[3] = {-1, -1, -1};  // left, right, merged
    if (tok.sp_) {  // pieces as written (Note [sentencepiece bpe])
      ids[0] = SentencePiece::piece_id(tok, left);
      ids[1] = SentencePiece::piece_id(tok, right);
      ids[2] = SentencePiece::piece_id(tok, std::string(left) + std::string(right));
    } else {
      std::string left_bytes, right_bytes;
      STRATUM_CHECK(symbol_to_bytes(left, left_bytes) && symbol_to_bytes(right, right_bytes),
                    "[tokenizer] ", where(), ": merge ", bpe_quoted(as_written),
                    " has a character outside GPT-2's byte-to-unicode alphabet", hint);
      const auto id_of = [&](const std::string& bytes) {
        const auto it = tok.bytes_to_id_.find(bytes);
        return it == tok.bytes_to_id_.end() ? -1 : it->second;
      };
      ids[0] = id_of(left_bytes), ids[1] = id_of(right_bytes), ids[2] = id_of(left_bytes + right_bytes);
    }
    STRATUM_CHECK(ids[0] >= 0 && ids[1] >= 0 && ids[2] >= 0,
                  "[tokenizer] ", where(), ": merge ", bpe_quoted(as_written),
                  " names a symbol (or makes a token) that is not in ", vocab_name,
                  ": use the merges that belong to this vocabulary");
    STRATUM_CHECK(next_rank < INT32_MAX, "[tokenizer] ", where(), ": too many merges");
    const std::uint64_t key = (static_cast<std::uint64_t>(ids[0]) << 32) | static_cast<std::uint32_t>(ids[1]);
    // Like Python's dict(zip(merges, range(...))) and Hugging Face's merge map, a repeated pair
    // keeps its last rank.
    tok.merges_[key] = Merge{next_rank++, ids[2]};
  }

  // A merges list cut short (or of another vocabulary) leaves tokens no merge makes, and would
  // encode text into more, shorter tokens without a word. Every token of several bytes but a few
  // special ones (GPT-2's <|endoftext|>, added tokens) comes from a merge. Then indexes the merges
  // for encoding (merge_table_) and drops the loading map.
  void merges_check(const std::string& merges_where, const std::string& vocab_where, const char* hint) {
    std::size_t unmade = 0;
    if (tok.sp_) {
      unmade = SentencePiece::unmade_count(tok);
    } else {
      std::unordered_set<std::int32_t> made;
      for (const auto& [key, merge] : tok.merges_) made.insert(merge.merged_id);
      for (const auto& [bytes, id] : tok.bytes_to_id_) unmade += bytes.size() > 1 && made.count(id) == 0 ? 1 : 0;
    }
    STRATUM_CHECK(unmade <= std::max<std::size_t>(16, tok.bytes_to_id_.size() / 100), "[tokenizer] ", merges_where,
                  " has ", tok.merges_.size(), " merges, and ", unmade, " tokens of several bytes in ", vocab_where,
                  " come from none of them (a truncated or mismatched merges list?)", hint);
    tok.merge_table_build();
  }

  // Compiles the pre-tokenizer regex (Note [bpe invalid utf-8]); JIT when available (the
  // interpreter gives the same matches). `fix` says what to do when it does not compile.
  void regex_compile(std::string_view pattern, std::uint32_t options, const std::string& name,
                     const char* fix) {
    tok.regex_ = std::make_unique<CompiledRegex>();
    tok.regex_->name = name;
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    tok.regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | options,
                                     &error_code, &error_offset, nullptr);
    if (tok.regex_->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof message);
      STRATUM_FAIL("[tokenizer] PCRE2 cannot compile ", name, " at offset ", error_offset, ": ",
                   reinterpret_cast<const char*>(message), fix);
    }
    pcre2_jit_compile(tok.regex_->code, PCRE2_JIT_COMPLETE);  // failure: interpreter is used
  }

  // Sorts the added tokens of each pass for encode_added (longest first per first byte).
  void added_index() {
    for (AddedTokenPass& pass : tok.added_passes_) {
      std::sort(pass.tokens.begin(), pass.tokens.end(),
                [](const AddedToken& a, const AddedToken& b) {
                  const auto a0 = static_cast<unsigned char>(a.content[0]);
                  const auto b0 = static_cast<unsigned char>(b.content[0]);
                  if (a0 != b0) return a0 < b0;
                  if (a.content.size() != b.content.size())
                    return a.content.size() > b.content.size();
                  return a.content < b.content;
                });
      std::uint32_t k = 0;
      for (std::size_t b = 0; b <= 256; ++b) {
        while (k < pass.tokens.size() && static_cast<unsigned char>(pass.tokens[k].content[0]) < b)
          ++k;
        pass.first_byte_begin[b] = k;
      }
    }
  }

  // tokenizer.json parts.
  void json_model_check(const JsonFields& f, const Json& model);
  void json_normalizer_check(const JsonFields& f, const Json& root);
  void json_pre_tokenizer_read(const JsonFields& f, const Json& root);
  void json_decoder_check(const JsonFields& f, const Json& root);
  void json_merges_read(const JsonFields& f, const Json& merges);
  void json_post_processor_read(const JsonFields& f, const Json& root);
  void json_template_read(const JsonFields& f, const Json& processor, const std::string& where);
};

void BpeTokenizer::Loader::json_model_check(const JsonFields& f, const Json& model) {
  const std::string type = f.type(model, "model");
  if (type == "Unigram") {
    STRATUM_FAIL("[tokenizer] ", f.file(),
                 ": model.type is \"Unigram\": SentencePiece's Unigram "
                 "tokenizers (e.g. T5, ALBERT, XLNet) are not supported; ",
                 kSupported);
  }
  if (type == "WordPiece" || type == "WordLevel") {
    STRATUM_FAIL("[tokenizer] ", f.file(), ": model.type is \"", type, "\": ", type,
                 " tokenizers (e.g. BERT) are not supported; ", kSupported);
  }
  STRATUM_CHECK(type == "BPE", "[tokenizer] ", f.file(), ": model.type ", bpe_quoted(type),
                " is unknown; ", kSupported);
  tok.sp_ = f.boolean(model, "model", "byte_fallback", 0);  // Note [sentencepiece bpe]
  if (const Json* dropout = JsonFields::find(model, "dropout"); dropout != nullptr) {
    STRATUM_CHECK(dropout->is_null() || (dropout->is_number() && dropout->get<double>() == 0.0),
                  "[tokenizer] ", f.file(),
                  ": model.dropout must be null (BPE dropout is a "
                  "training-time option)",
                  kJsonFixHint);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* value = JsonFields::find(model, key);
    if (value == nullptr || value->is_null()) continue;
    f.expect(value->is_string(), *value, JsonFields::join("model", key), "a string or null");
    STRATUM_CHECK(value->get<std::string>().empty(), "[tokenizer] ", f.file(), ": model.", key,
                  " is ", bpe_quoted(value->get<std::string>()),
                  ": word-piece style BPE is not supported; ", kSupported);
  }
  if (const Json* unk = JsonFields::find(model, "unk_token"); unk != nullptr) {
    // Ignored: a byte-level vocabulary has all 256 bytes, and so must a byte-fallback one, so
    // no text is unknown.
    f.expect(unk->is_null() || unk->is_string(), *unk, "model.unk_token", "a string or null");
  }
  f.boolean(model, "model", "fuse_unk", 0);
  tok.ignore_merges_ = f.boolean(model, "model", "ignore_merges", 0);
}

void BpeTokenizer::Loader::json_normalizer_check(const JsonFields& f, const Json& root) {
  const Json* normalizer = JsonFields::find(root, "normalizer");
  if (normalizer == nullptr || normalizer->is_null()) return;
  if (const Json* parts = normalizer->is_object() ? JsonFields::find(*normalizer, "normalizers") : nullptr;
      parts != nullptr && parts->is_array() && parts->empty() && (*normalizer)["type"] == "Sequence")
    return;  // an empty Sequence is no normalizer
  const std::string type = f.type(*normalizer, "normalizer");
  bool sentencepiece = type == "Prepend" || type == "Replace";
  if (const Json* parts = JsonFields::find(*normalizer, "normalizers");
      type == "Sequence" && parts != nullptr && parts->is_array()) {
    for (const Json& part : *parts) {
      const Json* part_type = part.is_object() ? JsonFields::find(part, "type") : nullptr;
      sentencepiece |= part_type != nullptr && (*part_type == "Prepend" || *part_type == "Replace");
    }
  }
  STRATUM_CHECK(!sentencepiece, "[tokenizer] ", f.file(), ": normalizer ", bpe_quoted(type),
                " (SentencePiece's \"\xE2\x96\x81\" spaces) without byte fallback: ", kSentencePiece, kSupported);
  if (type == "NFC") {  // Qwen2's (Note [nfc normalizer])
    tok.nfc_ = true;
    return;
  }
  STRATUM_FAIL("[tokenizer] ", f.file(), ": normalizer ", bpe_quoted(type),
               " is not supported: Stratum normalizes text only to NFC, so only \"normalizer\": null "
               "or {\"type\": \"NFC\"} is accepted; ",
               kSupported);
}

void BpeTokenizer::Loader::json_pre_tokenizer_read(const JsonFields& f, const Json& root) {
  const Json* pre = JsonFields::find(root, "pre_tokenizer");
  STRATUM_CHECK(pre != nullptr && !pre->is_null(), "[tokenizer] ", f.file(),
                ": pre_tokenizer is missing or null: byte-level BPE needs one; ",
                kPreTokenizersSupported);
  const std::string type = f.type(*pre, "pre_tokenizer");
  STRATUM_CHECK(type != "Metaspace", "[tokenizer] ", f.file(),
                ": pre_tokenizer is Metaspace without byte fallback: ", kSentencePiece, kSupported);
  const std::string regex_name = "the pre_tokenizer regex of " + f.file();
  const char* regex_fix = ": fix the pattern or use the tokenizer.json that came with the model";
  if (type == "ByteLevel") {
    tok.add_prefix_space_ = f.boolean(*pre, "pre_tokenizer", "add_prefix_space", -1);
    STRATUM_CHECK(f.boolean(*pre, "pre_tokenizer", "use_regex", 1), "[tokenizer] ", f.file(),
                  ": pre_tokenizer ByteLevel with use_regex false is not supported alone; ",
                  kPreTokenizersSupported);
    regex_compile(kGpt2Pattern, 0, "GPT-2's pre-tokenizer regex",
                  " (install a libpcre2-8 built with Unicode support, >= 10.34)");
    return;
  }
  STRATUM_CHECK(type == "Sequence", "[tokenizer] ", f.file(), ": pre_tokenizer ",
                bpe_quoted(type), " is not supported; ", kPreTokenizersSupported);
  const Json& parts = f.required(*pre, "pre_tokenizer", "pretokenizers");
  f.expect(parts.is_array(), parts, "pre_tokenizer.pretokenizers", "an array");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string where = JsonFields::index("pre_tokenizer.pretokenizers", i);
    STRATUM_CHECK(f.type(parts[i], where) != "Metaspace", "[tokenizer] ", f.file(), ": ", where,
                  " is Metaspace without byte fallback: ", kSentencePiece, kSupported);
  }
  const auto part_type = [&](std::size_t i) {
    return f.type(parts[i], JsonFields::index("pre_tokenizer.pretokenizers", i));
  };
  STRATUM_CHECK(parts.size() == 2 && part_type(0) == "Split" && part_type(1) == "ByteLevel",
                "[tokenizer] ", f.file(), ": pre_tokenizer Sequence of ", parts.size(),
                " parts is not supported; ", kPreTokenizersSupported);
  const std::string split_where = "pre_tokenizer.pretokenizers[0]";
  const Json& split = parts[0];
  const Json& pattern = f.object(split, split_where, "pattern");
  const Json* regex = JsonFields::find(pattern, "Regex");
  STRATUM_CHECK(regex != nullptr, "[tokenizer] ", f.file(), ": ", split_where,
                ".pattern has no \"Regex\" (a String pattern is not supported); ",
                kPreTokenizersSupported);
  f.expect(regex->is_string(), *regex, split_where + ".pattern.Regex", "a string");
  const std::string behavior = f.string(split, split_where, "behavior");
  STRATUM_CHECK(behavior == "Isolated", "[tokenizer] ", f.file(), ": ", split_where, ".behavior ",
                bpe_quoted(behavior), " is not supported; ", kPreTokenizersSupported);
  STRATUM_CHECK(!f.boolean(split, split_where, "invert", -1), "[tokenizer] ", f.file(), ": ",
                split_where, ".invert true is not supported; ", kPreTokenizersSupported);
  const std::string byte_where = "pre_tokenizer.pretokenizers[1]";
  STRATUM_CHECK(!f.boolean(parts[1], byte_where, "add_prefix_space", -1) &&
                    !f.boolean(parts[1], byte_where, "use_regex", 1),
                "[tokenizer] ", f.file(), ": ", byte_where,
                " (ByteLevel after Split) must have add_prefix_space and use_regex false; ",
                kPreTokenizersSupported);
  // Oniguruma, which Hugging Face uses, lets ^ and $ match at line ends.
  regex_compile(regex->get<std::string>(), PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, regex_name,
                regex_fix);
}

void BpeTokenizer::Loader::json_decoder_check(const JsonFields& f, const Json& root) {
  const Json* decoder = JsonFields::find(root, "decoder");
  STRATUM_CHECK(decoder != nullptr && !decoder->is_null(), "[tokenizer] ", f.file(),
                ": decoder is missing or null; supported: ByteLevel (byte-level BPE)");
  const std::string type = f.type(*decoder, "decoder");
  STRATUM_CHECK(type == "ByteLevel", "[tokenizer] ", f.file(), ": decoder ",
                bpe_quoted(type), " is not supported; supported: ByteLevel (", kSupported,
                ")");
}

void BpeTokenizer::Loader::json_merges_read(const JsonFields& f, const Json& merges) {
  f.expect(merges.is_array(), merges, "model.merges", "an array");
  const bool pairs = !merges.empty() && merges[0].is_array();
  std::string written;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const Json& merge = merges[i];
    const auto where = [&] { return f.file() + " " + JsonFields::index("model.merges", i); };
    std::string_view left, right;
    if (pairs) {
      STRATUM_CHECK(
          merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
          "[tokenizer] ", where(),
          " must be a pair of strings like model.merges[0] "
          "(merges are all \"a b\" strings or all [\"a\", \"b\"] pairs)",
          kJsonFixHint);
      left = merge[0].get_ref<const std::string&>();
      right = merge[1].get_ref<const std::string&>();
      written.assign(left).append(" ").append(right);
    } else {
      STRATUM_CHECK(merge.is_string(), "[tokenizer] ", where(),
                    " must be a string like model.merges[0] (merges are all \"a b\" strings or "
                    "all [\"a\", \"b\"] pairs), got a ",
                    merge.type_name(), kJsonFixHint);
      written = merge.get<std::string>();
      const std::size_t space = written.find(' ');
      STRATUM_CHECK(space != std::string::npos && written.find(' ', space + 1) == std::string::npos,
                    "[tokenizer] ", where(), ": bad merge ", bpe_quoted(written),
                    ", expected two symbols separated by one space", kJsonFixHint);
      left = std::string_view(written).substr(0, space);
      right = std::string_view(written).substr(space + 1);
    }
    merge_add(left, right, where, "model.vocab", written, kJsonFixHint);
  }
}

void BpeTokenizer::Loader::json_template_read(const JsonFields& f, const Json& processor,
                                              const std::string& where) {
  const Json& single = f.required(processor, where, "single");
  f.expect(single.is_array(), single, where + ".single", "an array");
  const Json& special = f.object(processor, where, "special_tokens");
  // The id of piece i of "single" when it is a SpecialToken, else -1.
  const auto special_id = [&](std::size_t i) -> std::int32_t {
    if (i >= single.size() || !single[i].is_object()) return -1;
    const Json* token = JsonFields::find(single[i], "SpecialToken");
    if (token == nullptr) return -1;
    const std::string piece = JsonFields::index(where + ".single", i);
    f.expect(token->is_object(), *token, piece + ".SpecialToken", "an object");
    const std::string name = f.string(*token, piece + ".SpecialToken", "id");
    const auto entry_it = special.find(name);
    const Json* entry = entry_it == special.end() ? nullptr : &*entry_it;
    STRATUM_CHECK(entry != nullptr && entry->is_object(), "[tokenizer] ", f.file(), ": ", where,
                  ".special_tokens has no entry ", bpe_quoted(name), " (used by ", piece,
                  ")", kJsonFixHint);
    const Json& ids = f.required(*entry, where + ".special_tokens." + name, "ids");
    STRATUM_CHECK(ids.is_array() && ids.size() == 1 && ids[0].is_number_integer() &&
                      ids[0].get<std::int64_t>() >= 0 &&
                      ids[0].get<std::int64_t>() < tok.vocab_size(),
                  "[tokenizer] ", f.file(), ": ", where, ".special_tokens.", name,
                  ".ids must hold one id in 0..", tok.vocab_size() - 1, kJsonFixHint);
    return static_cast<std::int32_t>(ids[0].get<std::int64_t>());
  };
  for (std::size_t i = 0; i < single.size(); ++i) {
    const Json* sequence =
        single[i].is_object() ? JsonFields::find(single[i], "Sequence") : nullptr;
    if (sequence == nullptr) continue;
    tok.bos_id_ = i > 0 ? special_id(i - 1) : -1;
    tok.eos_id_ = special_id(i + 1);
    return;
  }
  STRATUM_FAIL("[tokenizer] ", f.file(), ": ", where,
               ".single has no {\"Sequence\": {\"id\": \"A\"}} piece", kJsonFixHint);
}

void BpeTokenizer::Loader::json_post_processor_read(const JsonFields& f, const Json& root) {
  const Json* processor = JsonFields::find(root, "post_processor");
  if (processor == nullptr || processor->is_null()) return;
  const std::string type = f.type(*processor, "post_processor");
  if (type == "TemplateProcessing") json_template_read(f, *processor, "post_processor");
  if (type != "Sequence") return;  // ByteLevel, RobertaProcessing, ...: no template to report
  const Json& parts = f.required(*processor, "post_processor", "processors");
  f.expect(parts.is_array(), parts, "post_processor.processors", "an array");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string where = JsonFields::index("post_processor.processors", i);
    if (f.type(parts[i], where) == "TemplateProcessing") json_template_read(f, parts[i], where);
  }
}

BpeTokenizer BpeTokenizer::load(const std::string& dir) {
  STRATUM_CHECK(dir_exists(dir), "[tokenizer] tokenizer folder '", dir,
                "' does not exist: pass the folder holding tokenizer.json, encoder.json + "
                "vocab.bpe or vocab.json + merges.txt");
  if (file_exists(dir + "/tokenizer.json")) return load_tokenizer_json(dir + "/tokenizer.json");
  const bool openai_names = file_exists(dir + "/encoder.json");
  STRATUM_CHECK(openai_names || file_exists(dir + "/vocab.json"), "[tokenizer] folder '", dir,
                "' has none of tokenizer.json, encoder.json, vocab.json: pass the folder holding "
                "the tokenizer files");
  const std::string vocab_path = dir + (openai_names ? "/encoder.json" : "/vocab.json");
  const std::string merges_path = dir + (openai_names ? "/vocab.bpe" : "/merges.txt");
  const std::string vocab_text = tokenizer_file_read(vocab_path, kGpt2FilesHint);
  const std::string merges_text = tokenizer_file_read(merges_path, kGpt2FilesHint);

  BpeTokenizer tok;
  Loader loader{tok};
  Json vocab;
  try {
    vocab = Json::parse(vocab_text);
  } catch (const Json::exception& e) {
    STRATUM_FAIL("[tokenizer] '", vocab_path, "' is not valid JSON (", one_line(e.what()), ")",
                 kFixHint);
  }
  loader.vocab_read(vocab, "'" + vocab_path + "'", kFixHint, StringToId());

  // Merges: optional "#version" first line, then one "left right" pair per line, rank = order.
  std::size_t line_no = 0;
  const auto where = [&] { return "'" + merges_path + "' line " + std::to_string(line_no); };
  for (std::size_t pos = 0; pos < merges_text.size();) {
    std::size_t end = merges_text.find('\n', pos);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::size_t space = line.find(' ');
    const std::string_view left = line.substr(0, space);
    const std::string_view right =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    STRATUM_CHECK(
        !left.empty() && !right.empty() && right.find_first_of(" \t") == std::string_view::npos,
        "[tokenizer] ", where(), ": bad merges line ", bpe_quoted(line),
        ", expected two symbols separated by one space", kFixHint);
    loader.merge_add(left, right, where, "'" + vocab_path + "'", line, kFixHint);
  }
  loader.merges_check("'" + merges_path + "'", "'" + vocab_path + "'", kFixHint);
  loader.regex_compile(kGpt2Pattern, 0, "the GPT-2 pre-tokenizer regex",
                       " (install a libpcre2-8 built with Unicode support, >= 10.34)");
  tok.eot_id_ = tok.token_id(kEotText);
  return tok;
}

BpeTokenizer BpeTokenizer::load_tokenizer_json(const std::string& path) {
  const std::string text =
      tokenizer_file_read(path, "pass a Hugging Face tokenizer.json (or a folder holding one)");
  const JsonFields f("'" + path + "'", "tokenizer", kJsonFixHint);  // nested access
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    STRATUM_FAIL("[tokenizer] ", f.file(), " is not valid JSON (", one_line(e.what()), ")",
                 kJsonFixHint);
  }
  f.expect(root.is_object(), root, "the top level (a Hugging Face tokenizer.json)", "an object");

  BpeTokenizer tok;
  Loader loader{tok};
  const Json& model = f.object(root, "", "model");
  loader.json_model_check(f, model);
  if (tok.sp_) {
    SentencePiece::components_read(tok, f, root);
  } else {
    loader.json_normalizer_check(f, root);
    loader.json_pre_tokenizer_read(f, root);
    loader.json_decoder_check(f, root);
  }

  // Added tokens: read first, because a vocabulary token outside the byte alphabet is valid
  // only as an added token.
  struct Added {
    std::string content;
    std::int64_t id;
    bool normalized;
  };
  std::vector<Added> added;
  StringToId added_by_content;
  if (const Json* list = JsonFields::find(root, "added_tokens"); list != nullptr) {
    f.expect(list->is_array(), *list, "added_tokens", "an array");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const Json& token = (*list)[i];
      const std::string where = JsonFields::index("added_tokens", i);
      f.expect(token.is_object(), token, where, "an object");
      const Json& id = f.required(token, where, "id");
      f.expect(id.is_number_integer() && id.get<std::int64_t>() >= 0, id, where + ".id",
               "a non-negative integer");
      Added entry{f.string(token, where, "content"), id.get<std::int64_t>(),
                  f.boolean(token, where, "normalized", -1)};
      STRATUM_CHECK(!entry.content.empty(), "[tokenizer] ", f.file(), ": ", where,
                    ".content is empty", kJsonFixHint);
      f.boolean(token, where, "special", -1);
      for (const char* key : {"single_word", "lstrip", "rstrip"}) {
        STRATUM_CHECK(!f.boolean(token, where, key, -1), "[tokenizer] ", f.file(), ": ", where,
                      " (", bpe_quoted(entry.content), ") has ", key,
                      " true: added tokens that strip spaces or match whole words only are not "
                      "supported; ",
                      kSupported);
      }
      STRATUM_CHECK(added_by_content
                        .emplace(entry.content, static_cast<std::int32_t>(
                                                    std::min<std::int64_t>(entry.id, INT32_MAX)))
                        .second,
                    "[tokenizer] ", f.file(), ": ", where, " repeats the added token ",
                    bpe_quoted(entry.content), kJsonFixHint);
      added.push_back(std::move(entry));
    }
  }

  if (tok.sp_) {
    SentencePiece::vocab_read(tok, f, f.required(model, "model", "vocab"));
  } else {
    loader.vocab_read(f.required(model, "model", "vocab"), f.file() + " model.vocab", kJsonFixHint,
                      added_by_content);
  }
  const Json& vocab = model.at("vocab");
  // Hugging Face keeps the vocabulary id of an added token already in model.vocab and gives the
  // others the next free ids in file order (ignoring the ids written); accept only files whose
  // ids say the same.
  std::int64_t next_id = static_cast<std::int64_t>(tok.id_to_bytes_.size());
  for (std::size_t i = 0; i < added.size(); ++i) {
    const Added& token = added[i];
    const auto in_vocab = vocab.find(token.content);
    const std::int64_t expected =
        in_vocab != vocab.end() ? in_vocab->get<std::int64_t>() : next_id++;
    STRATUM_CHECK(token.id == expected, "[tokenizer] ", f.file(), ": added_tokens[", i, "] (",
                  bpe_quoted(token.content), ") has id ", token.id, " but ",
                  in_vocab != vocab.end()
                      ? std::string("model.vocab gives it id ") + std::to_string(expected)
                      : "Hugging Face gives it id " + std::to_string(expected) +
                            " (added tokens not in model.vocab take the ids after it, in file "
                            "order)",
                  kJsonFixHint);
    STRATUM_CHECK(expected < INT32_MAX, "[tokenizer] ", f.file(), ": too many added tokens");
    // Matched in the text as its content, so it must also decode to it (decode(encode(x)) == x).
    STRATUM_CHECK(in_vocab == vocab.end() ||
                      tok.id_to_bytes_[static_cast<std::size_t>(expected)] == token.content,
                  "[tokenizer] ", f.file(), ": added_tokens[", i, "] (",
                  bpe_quoted(token.content),
                  ") is a model.vocab token whose text is different (",
                  bpe_quoted(tok.id_to_bytes_[static_cast<std::size_t>(expected)]),
                  "): not supported; an added token in the vocabulary must stand for its own text");
    if (in_vocab == vocab.end()) tok.id_to_bytes_.push_back(token.content);
    const auto id = static_cast<std::int32_t>(token.id);
    tok.added_passes_[token.normalized ? 1 : 0].tokens.push_back(AddedToken{token.content, id});
    tok.added_ids_.emplace(token.content, id);
  }
  loader.added_index();

  loader.json_merges_read(f, f.required(model, "model", "merges"));
  loader.merges_check(f.file() + " model.merges", f.file() + " model.vocab", kJsonFixHint);
  loader.json_post_processor_read(f, root);
  tok.eot_id_ = tok.token_id(kEotText);
  return tok;
}

std::size_t bpe_char_size_at(std::string_view s, std::size_t i) { return char_size_at(s, i); }

}  // namespace stratum
