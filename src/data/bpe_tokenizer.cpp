// GPT-2 byte-level BPE tokenizer: file loading and validation, PCRE2 pre-tokenization, merges.
// Does not: handle special tokens, normalize text, or cache across encode() calls (see the
// thread-safety note in bpe_tokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe_tokenizer.h"

#include <pcre2.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/file_util.h"
#include "stratum/error.h"

namespace stratum {

namespace {

// GPT-2's pre-tokenizer (openai/gpt-2 src/encoder.py).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEotText = "<|endoftext|>";
constexpr int kUnmapped = -1;

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

// A token quoted for a one-line error message: control bytes escaped, long ones cut.
std::string quoted_for_message(std::string_view s) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 48; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + (s.size() > 48 ? "...'" : "'");
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string tokenizer_file_read(const std::string& path) {
  STRATUM_CHECK(file_exists(path), "[tokenizer] '", path,
                "' is missing: put the GPT-2 tokenizer files (encoder.json + vocab.bpe or "
                "vocab.json + merges.txt) in that folder");
  try {
    return file_read_all(path);
  } catch (const Error& e) {
    STRATUM_FAIL("[tokenizer] cannot read '", path, "': ", e.what());
  }
}

constexpr const char* kFixHint = ": use the GPT-2 tokenizer files unmodified";

}  // namespace

struct BpeTokenizer::CompiledRegex {
  pcre2_code* code = nullptr;
  CompiledRegex() = default;
  CompiledRegex(const CompiledRegex&) = delete;
  CompiledRegex& operator=(const CompiledRegex&) = delete;
  ~CompiledRegex() { pcre2_code_free(code); }
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::load(const std::string& dir) {
  STRATUM_CHECK(dir_exists(dir), "[tokenizer] tokenizer folder '", dir,
                "' does not exist: pass the folder holding encoder.json + vocab.bpe "
                "(or vocab.json + merges.txt)");
  const bool openai_names = file_exists(dir + "/encoder.json");
  STRATUM_CHECK(openai_names || file_exists(dir + "/vocab.json"), "[tokenizer] folder '", dir,
                "' has neither encoder.json nor vocab.json: pass the folder holding the GPT-2 "
                "tokenizer files");
  const std::string vocab_path = dir + (openai_names ? "/encoder.json" : "/vocab.json");
  const std::string merges_path = dir + (openai_names ? "/vocab.bpe" : "/merges.txt");
  const std::string vocab_text = tokenizer_file_read(vocab_path);
  const std::string merges_text = tokenizer_file_read(merges_path);

  BpeTokenizer tok;
  std::unordered_map<std::string, std::int32_t> bytes_to_id;  // raw token bytes -> id

  // Vocabulary: a JSON object of token -> id, ids unique and covering 0..N-1.
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[tokenizer] '", vocab_path, "' is not valid JSON (", one_line(e.what()), ")",
                 kFixHint);
  }
  STRATUM_CHECK(vocab.is_object() && !vocab.empty(), "[tokenizer] '", vocab_path,
                "' must be a non-empty JSON object of token -> id, got a ", vocab.type_name(),
                kFixHint);
  const std::size_t n = vocab.size();
  STRATUM_CHECK(n <= static_cast<std::size_t>(INT32_MAX), "[tokenizer] '", vocab_path,
                "' has too many entries (", n, ")");
  tok.id_to_bytes_.resize(n);
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (const auto& [key, value] : vocab.items()) {
    STRATUM_CHECK(value.is_number_integer(), "[tokenizer] '", vocab_path, "': token ",
                  quoted_for_message(key), " maps to a ", value.type_name(),
                  ", expected an integer id", kFixHint);
    const std::int64_t id = value.get<std::int64_t>();
    STRATUM_CHECK(
        id >= 0 && static_cast<std::uint64_t>(id) < n && !seen[static_cast<std::size_t>(id)],
        "[tokenizer] '", vocab_path, "': token ", quoted_for_message(key), " has id ", id,
        " but ids must be unique and cover 0..", n - 1, kFixHint);
    STRATUM_CHECK(symbol_to_bytes(key, bytes), "[tokenizer] '", vocab_path, "': token ",
                  quoted_for_message(key),
                  " has a character outside GPT-2's byte-to-unicode alphabet", kFixHint);
    seen[static_cast<std::size_t>(id)] = true;
    tok.id_to_bytes_[static_cast<std::size_t>(id)] = bytes;
    bytes_to_id.emplace(bytes, static_cast<std::int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    STRATUM_CHECK(it != bytes_to_id.end(), "[tokenizer] '", vocab_path,
                  "' lacks the single-byte token for byte ", b,
                  ": a byte-level BPE vocabulary needs all 256", kFixHint);
    tok.byte_ids_[b] = it->second;
  }
  if (const auto it = bytes_to_id.find(kEotText); it != bytes_to_id.end()) tok.eot_id_ = it->second;

  // Merges: optional "#version" first line, then one "left right" pair per line, rank = order.
  std::size_t line_no = 0;
  std::int32_t rank = 0;
  std::string left_bytes, right_bytes;
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
        "[tokenizer] '", merges_path, "' line ", line_no, ": bad merges line ",
        quoted_for_message(line), ", expected two symbols separated by one space", kFixHint);
    STRATUM_CHECK(symbol_to_bytes(left, left_bytes) && symbol_to_bytes(right, right_bytes),
                  "[tokenizer] '", merges_path, "' line ", line_no, ": merge ",
                  quoted_for_message(line),
                  " has a character outside GPT-2's byte-to-unicode alphabet", kFixHint);
    const auto left_it = bytes_to_id.find(left_bytes);
    const auto right_it = bytes_to_id.find(right_bytes);
    const auto merged_it = bytes_to_id.find(left_bytes + right_bytes);
    STRATUM_CHECK(left_it != bytes_to_id.end() && right_it != bytes_to_id.end() &&
                      merged_it != bytes_to_id.end(),
                  "[tokenizer] '", merges_path, "' line ", line_no, ": merge ",
                  quoted_for_message(line), " names a symbol (or makes a token) that is not in '",
                  vocab_path, "': use the merges file that belongs to this vocabulary");
    const std::uint64_t key = (static_cast<std::uint64_t>(left_it->second) << 32) |
                              static_cast<std::uint32_t>(right_it->second);
    // Like Python's dict(zip(merges, range(...))), a repeated pair keeps its last rank.
    tok.merges_[key] = Merge{rank++, merged_it->second};
  }

  // Pre-tokenizer regex; JIT when available (the interpreter gives the same matches).
  tok.regex_ = std::make_unique<CompiledRegex>();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  tok.regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (tok.regex_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    STRATUM_FAIL("[tokenizer] PCRE2 cannot compile the GPT-2 pre-tokenizer regex at offset ",
                 error_offset, ": ", reinterpret_cast<const char*>(message),
                 " (install a libpcre2-8 built with Unicode support, >= 10.34)");
  }
  pcre2_jit_compile(tok.regex_->code, PCRE2_JIT_COMPLETE);  // failure: interpreter is used
  return tok;
}

const BpeTokenizer::Merge* BpeTokenizer::merge_find(std::int32_t left_id,
                                                    std::int32_t right_id) const {
  const auto it = merges_.find((static_cast<std::uint64_t>(left_id) << 32) |
                               static_cast<std::uint32_t>(right_id));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeTokenizer::bpe_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  // Same result as encoder.py's bpe(): repeatedly take the adjacent pair of lowest rank and
  // merge every occurrence of it, left to right without overlap, until no pair is a merge.
  std::vector<std::int32_t> word;  // (symbols) token ids of the current segmentation
  word.reserve(piece.size());
  for (const char c : piece) word.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  while (word.size() > 1) {
    const Merge* best = nullptr;
    std::int32_t best_left = 0, best_right = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const Merge* m = merge_find(word[i], word[i + 1]);
      if (m != nullptr && (best == nullptr || m->rank < best->rank)) {
        best = m, best_left = word[i], best_right = word[i + 1];
      }
    }
    if (best == nullptr) break;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_left && word[i + 1] == best_right) {
        word[kept++] = best->merged_id;
        i += 2;
      } else {
        word[kept++] = word[i++];
      }
    }
    word.resize(kept);
  }
  out.insert(out.end(), word.begin(), word.end());
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  if (text.empty()) return out;
  STRATUM_ASSERT(regex_ != nullptr);  // null only in a moved-from tokenizer
  // Per-call cache (keeps encode thread-safe): piece -> (offset, count) of its ids in `out`.
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> cache;
  constexpr std::size_t kCacheMaxEntries = 1 << 16;
  const auto emit = [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (const auto it = cache.find(piece); it != cache.end()) {
      const auto [offset, count] = it->second;
      for (std::size_t k = 0; k < count; ++k) {
        const std::int32_t id = out[offset + k];  // copy: push_back may reallocate
        out.push_back(id);
      }
      return;
    }
    const std::size_t offset = out.size();
    bpe_piece(piece, out);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(piece, std::make_pair(offset, out.size() - offset));
  };

  using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;
  MatchData match(pcre2_match_data_create_from_pattern(regex_->code, nullptr),
                  &pcre2_match_data_free);
  STRATUM_CHECK(match != nullptr, "[tokenizer] out of memory allocating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      emit(text.substr(pos));  // trailing invalid UTF-8: Note [bpe invalid utf-8]
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      STRATUM_FAIL("[tokenizer] PCRE2 match failed at byte ", pos, " of ", text.size(), ": ",
                   reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const std::size_t start = ovector[0], end = ovector[1];
    STRATUM_ASSERT(start >= pos && end > start && end <= text.size());
    if (start > pos) emit(text.substr(pos, start - pos));  // Note [bpe invalid utf-8]
    emit(text.substr(start, end - start));
    pos = end;
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (const std::int32_t id : ids) {
    STRATUM_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] cannot decode token id ", id,
                  ": ids must be in 0..", vocab_size() - 1,
                  " (was the text encoded with a "
                  "different vocabulary?)");
    out += id_to_bytes_[static_cast<std::size_t>(id)];
  }
  return out;
}

std::string BpeTokenizer::decode_token(std::int32_t id) const {
  STRATUM_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] cannot decode token id ", id,
                ": ids must be in 0..", vocab_size() - 1,
                " (was the text encoded with a "
                "different vocabulary?)");
  return id_to_bytes_[static_cast<std::size_t>(id)];
}

std::int32_t BpeTokenizer::vocab_size() const {
  return static_cast<std::int32_t>(id_to_bytes_.size());
}

std::int32_t BpeTokenizer::eot_id() const { return eot_id_; }

}  // namespace stratum
