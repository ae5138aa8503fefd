// Byte-level BPE tokenizer, encoding half (loading is bpe_tokenizer.cpp): construction, which
// files a folder holds, added-token splitting,
// PCRE2 pre-tokenization, merges, and decoding. Does not cache across encode() calls (see the
// thread-safety note in bpe_tokenizer.h).
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "core/file_util.h"
#include "data/bpe_tokenizer_impl.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// The NFC form of well-formed UTF-8 `run` appended to out (Note [nfc normalizer]): ICU works on
// UTF-16, so through it and back. A run ICU does not take as UTF-8 is appended as it is.
void nfc_append(std::string_view run, std::string& out) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  STRATUM_CHECK(U_SUCCESS(status), "[tokenizer] ICU's NFC normalizer is unavailable: ", u_errorName(status));
  STRATUM_CHECK(run.size() < (1u << 30), "[tokenizer] a text piece of ", run.size(), " bytes is too long to normalize");
  const auto n8 = static_cast<int32_t>(run.size());
  std::vector<UChar> utf16(run.size());  // at most one UTF-16 unit per byte
  int32_t n16 = 0;
  u_strFromUTF8(utf16.data(), n8, &n16, run.data(), n8, &status);
  if (U_FAILURE(status) || unorm2_quickCheck(nfc, utf16.data(), n16, &status) == UNORM_YES || U_FAILURE(status)) {
    out.append(run);
    return;
  }
  std::vector<UChar> normal(static_cast<std::size_t>(n16) * 3 + 16);  // NFC grows a string at most 3x
  const int32_t n_normal =
      unorm2_normalize(nfc, utf16.data(), n16, normal.data(), static_cast<int32_t>(normal.size()), &status);
  STRATUM_CHECK(U_SUCCESS(status), "[tokenizer] NFC normalization failed: ", u_errorName(status));
  const std::size_t at = out.size();
  out.resize(at + static_cast<std::size_t>(n_normal) * 3);  // at most 3 UTF-8 bytes per UTF-16 unit
  int32_t written = 0;
  u_strToUTF8(out.data() + at, static_cast<int32_t>(out.size() - at), &written, normal.data(), n_normal, &status);
  STRATUM_CHECK(U_SUCCESS(status), "[tokenizer] NFC normalization failed: ", u_errorName(status));
  out.resize(at + static_cast<std::size_t>(written));
}

// Whether `text` changes under NFC; if so, its NFC form (well-formed runs normalized, ill-formed
// bytes kept) is in `out`. Pure ASCII never changes.
bool nfc_normalize(std::string_view text, std::string& out) {
  std::size_t i = 0;
  while (i < text.size() && static_cast<unsigned char>(text[i]) < 0x80) ++i;
  if (i == text.size()) return false;
  out.clear();
  out.reserve(text.size());
  std::size_t run = 0;  // start of the current well-formed run (the ASCII before i is one)
  while (i < text.size()) {
    const std::size_t size = bpe_char_size_at(text, i);
    if (size == 1 && static_cast<unsigned char>(text[i]) >= 0x80) {  // an ill-formed byte
      nfc_append(text.substr(run, i - run), out);
      out.push_back(text[i]);
      run = ++i;
      continue;
    }
    i += size;
  }
  nfc_append(text.substr(run), out);
  return out != text;
}
}  // namespace

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::files_in(const std::string& dir) {
  if (file_exists(dir + "/tokenizer.json")) return "tokenizer.json";
  if (file_exists(dir + "/encoder.json") && file_exists(dir + "/vocab.bpe")) return "encoder.json + vocab.bpe";
  if (file_exists(dir + "/vocab.json") && file_exists(dir + "/merges.txt")) return "vocab.json + merges.txt";
  return "";
}

const BpeTokenizer::Merge* BpeTokenizer::merge_find(std::int32_t left_id,
                                                    std::int32_t right_id) const {
  if (merge_table_.empty()) return nullptr;
  const std::uint64_t key = (static_cast<std::uint64_t>(left_id) << 32) | static_cast<std::uint32_t>(right_id);
  const std::size_t mask = merge_table_.size() - 1;
  for (std::size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;; i = (i + 1) & mask) {
    const MergeSlot& slot = merge_table_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == ~std::uint64_t{0}) return nullptr;
  }
}

void BpeTokenizer::merge_table_build() {
  std::size_t size = 2;
  int bits = 1;
  while (size < 2 * merges_.size()) size *= 2, ++bits;
  merge_table_.assign(size, MergeSlot{});
  merge_shift_ = 64 - bits;
  for (const auto& [key, merge] : merges_) {
    std::size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    while (merge_table_[i].key != ~std::uint64_t{0}) i = (i + 1) & (size - 1);
    merge_table_[i] = MergeSlot{key, merge};
  }
  std::unordered_map<std::uint64_t, Merge>().swap(merges_);
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
  std::vector<std::size_t> ends;
  return encode_each({text}, ends);
}

std::vector<std::int32_t> BpeTokenizer::encode_each(const std::vector<std::string_view>& texts,
                                                    std::vector<std::size_t>& ends) const {
  STRATUM_ASSERT(regex_ != nullptr || sp_);  // no regex only in SentencePiece-style BPE or a moved-from tokenizer
  ends.clear();
  EncodeState state;
  if (regex_ != nullptr) {
    state.match.reset(pcre2_match_data_create_from_pattern(regex_->code, nullptr));
    STRATUM_CHECK(state.match != nullptr, "[tokenizer] out of memory allocating PCRE2 match data");
  }
  // The cache's keys are views into the texts (or into state.prefixed), all alive for the call; a
  // piece's ids do not depend on the text around it, so one cache serves every text.
  for (const std::string_view text : texts) {
    state.text_begin = text.data();
    if (!text.empty()) encode_added(text, 0, state);
    ends.push_back(state.out.size());
  }
  return std::move(state.out);
}

void BpeTokenizer::encode_added(std::string_view text, std::size_t pass, EncodeState& state) const {
  // Note [nfc normalizer]: after the first pass (the "normalized": false added tokens).
  if (pass == 1 && nfc_) {
    if (std::string normal; nfc_normalize(text, normal)) {
      state.prefixed.push_back(std::move(normal));  // never moves: the cache holds views into it
      text = state.prefixed.back();
    }
  }
  // Note [sentencepiece bpe]: the legacy normalizer, also after the first pass.
  if (pass == 1 && sp_replace_) {
    state.prefixed.push_back(bpe_sp_spaces(text, sp_prepend_));
    text = state.prefixed.back();
  }
  if (pass == added_passes_.size()) {
    encode_segment(text, state);
    return;
  }
  const AddedTokenPass& tokens = added_passes_[pass];
  if (tokens.tokens.empty()) {
    encode_added(text, pass + 1, state);
    return;
  }
  // Leftmost match, longest first (Hugging Face's Aho-Corasick LeftmostLongest). Contents are
  // valid UTF-8, so a match never starts inside a character of valid text.
  std::size_t piece_start = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const auto b = static_cast<unsigned char>(text[pos]);
    const AddedToken* found = nullptr;
    for (std::uint32_t k = tokens.first_byte_begin[b]; k < tokens.first_byte_begin[b + 1]; ++k) {
      if (text.substr(pos).starts_with(tokens.tokens[k].content)) {
        found = &tokens.tokens[k];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    if (pos > piece_start)
      encode_added(text.substr(piece_start, pos - piece_start), pass + 1, state);
    state.out.push_back(found->id);
    pos += found->content.size();
    piece_start = pos;
  }
  if (piece_start < text.size()) encode_added(text.substr(piece_start), pass + 1, state);
}

void BpeTokenizer::encode_segment(std::string_view segment, EncodeState& state) const {
  if (sp_) {
    sp_segment(segment, state);
    return;
  }
  if (add_prefix_space_ && segment.front() != ' ') {
    state.prefixed.push_back(" " + std::string(segment));
    segment = state.prefixed.back();
  }
  std::vector<std::int32_t>& out = state.out;
  const auto emit = [&](std::size_t begin, std::size_t end) {
    const std::string_view piece = segment.substr(begin, end - begin);
    if (piece.size() == 1) {
      out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (state.cached(piece)) return;
    const std::size_t offset = out.size();
    const auto whole = ignore_merges_ ? bytes_to_id_.find(piece) : bytes_to_id_.end();
    if (whole != bytes_to_id_.end()) {
      out.push_back(whole->second);
    } else {
      bpe_piece(piece, out);
    }
    state.remember(piece, offset);
  };

  // Note [bpe invalid utf-8]: matches and the gaps between them are the pre-tokens.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(segment.data());
  std::size_t gap_start = 0;
  for (std::size_t search = 0; search < segment.size();) {
    const int rc =
        pcre2_match(regex_->code, subject, segment.size(), search, 0, state.match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      STRATUM_FAIL("[tokenizer] PCRE2 match with ", regex_->name, " failed at byte ", search,
                   " of ", segment.size(), ": ", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match.get());
    const std::size_t start = ovector[0], end = ovector[1];
    STRATUM_ASSERT(start >= search && end >= start && end <= segment.size());
    if (start > gap_start) emit(gap_start, start);
    gap_start = start;
    if (end == start) {  // no pre-token; search again from the next character, as Oniguruma does
      if (start == segment.size()) break;
      search = start + bpe_char_size_at(segment, start);
      continue;
    }
    emit(start, end);
    gap_start = search = end;
  }
  if (gap_start < segment.size()) emit(gap_start, segment.size());
}

std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  // Note [sentencepiece bpe]: a Metaspace decoder drops the first token's "\u2581"s (not a byte token's).
  const bool first_spaces = sp_first_spaces_ && !ids.empty() && ids[0] >= 0 && ids[0] < vocab_size() &&
                            (id_to_bytes_[static_cast<std::size_t>(ids[0])].size() != 1 ||
                             byte_ids_[static_cast<unsigned char>(id_to_bytes_[static_cast<std::size_t>(ids[0])][0])] != ids[0]);
  for (const std::int32_t id : ids) {
    STRATUM_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] cannot decode token id ", id,
                  ": ids must be in 0..", vocab_size() - 1,
                  " (was the text encoded with a "
                  "different vocabulary?)");
    out += id_to_bytes_[static_cast<std::size_t>(id)];
  }
  if (sp_strip_ && !out.empty() && out.front() == ' ') out.erase(0, 1);  // Note [sentencepiece bpe]
  if (first_spaces) {
    const std::size_t first = id_to_bytes_[static_cast<std::size_t>(ids[0])].size();
    out.erase(std::remove(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(first), ' '),
              out.begin() + static_cast<std::ptrdiff_t>(first));
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

std::vector<std::string> BpeTokenizer::added_tokens() const {
  std::vector<std::pair<std::int32_t, std::string>> by_id;
  for (const auto& [content, id] : added_ids_) by_id.emplace_back(id, content);
  std::sort(by_id.begin(), by_id.end());
  std::vector<std::string> out;
  for (auto& [id, content] : by_id) out.push_back(std::move(content));
  return out;
}

std::int32_t BpeTokenizer::token_id(std::string_view content) const {
  if (const auto it = added_ids_.find(content); it != added_ids_.end()) return it->second;
  if (const auto it = bytes_to_id_.find(content); it != bytes_to_id_.end()) return it->second;
  return -1;
}

std::int32_t BpeTokenizer::bos_id() const { return bos_id_; }

std::int32_t BpeTokenizer::eos_id() const { return eos_id_; }

const char* BpeTokenizer::kind() const {
  return sp_ ? "SentencePiece-style BPE with byte fallback" : "byte-level BPE";
}

}  // namespace stratum
