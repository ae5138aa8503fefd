// SentencePiece-style BPE (Note [sentencepiece bpe]): the tokenizer.json parts that differ from
// byte-level BPE (normalizer, pre-tokenizer and decoder; a vocabulary of "\u2581" pieces and
// "<0xNN>" byte tokens) and the encoding of a piece of text: spaces to "\u2581", characters to
// pieces or byte tokens, merges in Hugging Face's order. Does not: read SentencePiece's own
// tokenizer.model, sample (BPE dropout), or fall back to an unknown token (every byte has a token).
#include <cstdint>
#include <queue>
#include <string>
#include <unordered_set>
#include <vector>

#include "data/bpe_tokenizer_impl.h"
#include "formats/json_fields.h"
#include "stratum/error.h"

namespace stratum {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // "\u2581", SentencePiece's space
constexpr const char* kHint = ": use the tokenizer.json that came with the model, unmodified";
constexpr const char* kLayouts =
    "supported with byte fallback: the normalizer Sequence [Prepend \"\xE2\x96\x81\", Replace \" \" -> "
    "\"\xE2\x96\x81\"] with \"pre_tokenizer\": null (Llama 2), the Replace alone with a null or Split \" \" "
    "pre_tokenizer (Gemma), or \"normalizer\": null with a Metaspace pre_tokenizer (transformers' legacy=False)";
constexpr const char* kDecoders =
    "supported with byte fallback: a Sequence of Replace \"\xE2\x96\x81\" -> \" \", ByteFallback, Fuse "
    "and an optional Strip {\"content\": \" \", \"start\": 0 or 1, \"stop\": 0} (Llama 2's), or Metaspace";

// The byte of a byte-fallback token "<0xNN>" (uppercase hex, as Hugging Face spells it), or -1.
int byte_token_value(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (const char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

std::string spaces_for_pieces(std::string_view piece) {
  std::string out;
  for (std::size_t i = 0; i < piece.size();) {
    if (piece.substr(i).starts_with(kSpace)) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

// A Replace component {"pattern": {"String": from}, "content": to}.
bool replace_is(const JsonFields& f, const Json& part, const std::string& where, std::string_view from,
                std::string_view to) {
  const Json& pattern = f.object(part, where, "pattern");
  const Json* string = JsonFields::find(pattern, "String");
  return string != nullptr && string->is_string() && *string == from && f.string(part, where, "content") == to;
}

}  // namespace

void BpeTokenizer::SentencePiece::components_read(BpeTokenizer& tok, const JsonFields& f, const Json& root) {
  // The normalizer: null, or Llama 2's [Prepend "\u2581"], Replace " " -> "\u2581".
  if (const Json* normalizer = JsonFields::find(root, "normalizer"); normalizer != nullptr && !normalizer->is_null()) {
    const bool sequence = f.type(*normalizer, "normalizer") == "Sequence";
    const Json* parts = sequence ? &f.required(*normalizer, "normalizer", "normalizers") : normalizer;
    if (sequence) f.expect(parts->is_array(), *parts, "normalizer.normalizers", "an array");
    const std::size_t n = sequence ? parts->size() : 1;  // an empty Sequence is no normalizer
    for (std::size_t i = 0; i < n; ++i) {
      const Json& part = sequence ? (*parts)[i] : *parts;
      const std::string where = sequence ? JsonFields::index("normalizer.normalizers", i) : "normalizer";
      const std::string type = f.type(part, where);
      if (type == "Prepend" && i == 0 && f.string(part, where, "prepend") == kSpace) {
        tok.sp_prepend_ = true;
      } else if (type == "Replace" && !tok.sp_replace_ && replace_is(f, part, where, " ", kSpace)) {
        tok.sp_replace_ = true;
      } else {
        STRATUM_FAIL("[tokenizer] ", f.file(), ": ", where, " (", type, ") is not supported; ", kLayouts);
      }
    }
    STRATUM_CHECK(tok.sp_replace_ || n == 0, "[tokenizer] ", f.file(), ": the normalizer has no Replace \" \" -> \"",
                  kSpace, "\"; ", kLayouts);
  }

  // The pre-tokenizer: null after that normalizer, or (Gemma's) a Split on " ", which finds no
  // space in the normalized text (every one is "\u2581" by then) and so splits nothing; else
  // Metaspace.
  const Json* pre = JsonFields::find(root, "pre_tokenizer");
  const bool split_on_space = pre != nullptr && pre->is_object() && tok.sp_replace_ &&
                              f.type(*pre, "pre_tokenizer") == "Split" && pre->contains("pattern") &&
                              (*pre)["pattern"].is_object() && (*pre)["pattern"].contains("String") &&
                              (*pre)["pattern"]["String"] == " ";
  if (pre == nullptr || pre->is_null() || split_on_space) {
    STRATUM_CHECK(tok.sp_replace_, "[tokenizer] ", f.file(),
                  ": neither the normalizer nor the pre_tokenizer turns spaces into \"", kSpace, "\"; ", kLayouts);
  } else {
    const std::string type = f.type(*pre, "pre_tokenizer");
    STRATUM_CHECK(type == "Metaspace" && !tok.sp_replace_, "[tokenizer] ", f.file(), ": pre_tokenizer ", type,
                  tok.sp_replace_ ? " after a normalizer" : "", " is not supported; ", kLayouts);
    STRATUM_CHECK(f.string(*pre, "pre_tokenizer", "replacement") == kSpace, "[tokenizer] ", f.file(),
                  ": pre_tokenizer.replacement must be \"", kSpace, "\"", kHint);
    if (JsonFields::find(*pre, "prepend_scheme") != nullptr) {
      const std::string scheme = f.string(*pre, "pre_tokenizer", "prepend_scheme");
      STRATUM_CHECK(scheme == "first" || scheme == "always" || scheme == "never", "[tokenizer] ", f.file(),
                    ": pre_tokenizer.prepend_scheme \"", scheme, "\" is unknown (first, always or never)", kHint);
      tok.sp_scheme_ = scheme == "first" ? Prepend::First : scheme == "always" ? Prepend::Always : Prepend::Never;
    } else {  // older files: add_prefix_space, true by default
      tok.sp_scheme_ = f.boolean(*pre, "pre_tokenizer", "add_prefix_space", 1) ? Prepend::Always : Prepend::Never;
    }
    tok.sp_split_ = f.boolean(*pre, "pre_tokenizer", "split", 1);
    tok.sp_metaspace_ = true;
  }

  // The decoder: Replace "\u2581" -> " ", ByteFallback, Fuse, [Strip " " at the start]; or Metaspace.
  const Json* decoder = JsonFields::find(root, "decoder");
  if (decoder != nullptr && decoder->is_object() && JsonFields::find(*decoder, "type") != nullptr &&
      (*decoder)["type"] == "Metaspace") {
    STRATUM_CHECK(f.string(*decoder, "decoder", "replacement") == kSpace, "[tokenizer] ", f.file(),
                  ": decoder.replacement must be \"", kSpace, "\"", kHint);
    tok.sp_first_spaces_ = JsonFields::find(*decoder, "prepend_scheme") != nullptr
                               ? f.string(*decoder, "decoder", "prepend_scheme") != "never"
                               : f.boolean(*decoder, "decoder", "add_prefix_space", 1);
    return;
  }
  STRATUM_CHECK(decoder != nullptr && !decoder->is_null() && decoder->is_object() &&
                    JsonFields::find(*decoder, "type") != nullptr && (*decoder)["type"] == "Sequence",
                "[tokenizer] ", f.file(), ": the decoder is not a Sequence; ", kDecoders);
  const Json& parts = f.required(*decoder, "decoder", "decoders");
  f.expect(parts.is_array(), parts, "decoder.decoders", "an array");
  static const char* const kOrder[] = {"Replace", "ByteFallback", "Fuse", "Strip"};
  STRATUM_CHECK(parts.size() == 3 || parts.size() == 4, "[tokenizer] ", f.file(), ": decoder.decoders has ",
                parts.size(), " parts; ", kDecoders);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string where = JsonFields::index("decoder.decoders", i);
    const std::string type = f.type(parts[i], where);
    bool ok = type == kOrder[i];
    if (ok && i == 0) ok = replace_is(f, parts[i], where, kSpace, " ");
    if (ok && i == 3) {
      const Json* start = JsonFields::find(parts[i], "start");
      const Json* stop = JsonFields::find(parts[i], "stop");
      ok = f.string(parts[i], where, "content") == " " && start != nullptr && stop != nullptr && *stop == 0 &&
           (*start == 0 || *start == 1);
      tok.sp_strip_ = ok && *start == 1;
    }
    STRATUM_CHECK(ok, "[tokenizer] ", f.file(), ": ", where, " (", type, ") is not supported there; ", kDecoders);
  }
}

void BpeTokenizer::SentencePiece::vocab_read(BpeTokenizer& tok, const JsonFields& f, const Json& vocab) {
  const std::string where = f.file() + " model.vocab";
  tok.id_to_bytes_.resize(vocab.is_object() ? vocab.size() : 0);
  bool byte_seen[256] = {};
  bpe_vocab_walk(vocab, where, kHint, [&](const std::string& piece, std::int32_t id) {
    tok.piece_to_id_.emplace(piece, id);
    if (const int b = byte_token_value(piece); b >= 0) {
      tok.id_to_bytes_[static_cast<std::size_t>(id)] = std::string(1, static_cast<char>(b));
      tok.byte_ids_[b] = id;
      byte_seen[b] = true;
    } else {
      tok.id_to_bytes_[static_cast<std::size_t>(id)] = spaces_for_pieces(piece);
      tok.bytes_to_id_.emplace(tok.id_to_bytes_[static_cast<std::size_t>(id)], id);
    }
  });
  // No merge can make or extend a piece that holds "\n" unless a piece of several characters does.
  tok.sp_line_words_ = tok.sp_space_words_ = true;
  for (const auto& [piece, id] : tok.piece_to_id_) {
    if (piece.size() > 1 && piece.find('\n') != std::string::npos) tok.sp_line_words_ = false;
    for (std::size_t at = piece.find(kSpace, 1); at != std::string::npos; at = piece.find(kSpace, at + 1))
      if (at < kSpace.size() || std::string_view(piece).substr(at - kSpace.size(), kSpace.size()) != kSpace)
        tok.sp_space_words_ = false;
  }
  for (int b = 0; b < 256; ++b) {
    STRATUM_CHECK(byte_seen[b], "[tokenizer] ", where, " lacks the byte token \"<0x", "0123456789ABCDEF"[b >> 4],
                  "0123456789ABCDEF"[b & 15], ">\": model.byte_fallback needs all 256", kHint);
    tok.bytes_to_id_.emplace(std::string(1, static_cast<char>(b)), tok.byte_ids_[b]);  // a piece wins
    if (b < 128) {
      const auto it = tok.piece_to_id_.find(std::string(1, static_cast<char>(b)));
      tok.sp_ascii_ids_[b] = it != tok.piece_to_id_.end() ? it->second : tok.byte_ids_[b];
    }
  }
}

std::int32_t BpeTokenizer::SentencePiece::piece_id(const BpeTokenizer& tok, std::string_view piece) {
  const auto it = tok.piece_to_id_.find(piece);
  return it == tok.piece_to_id_.end() ? -1 : it->second;
}

std::size_t BpeTokenizer::SentencePiece::unmade_count(const BpeTokenizer& tok) {
  std::unordered_set<std::int32_t> made;
  for (const auto& [key, merge] : tok.merges_) made.insert(merge.merged_id);
  std::size_t unmade = 0;
  for (const auto& [piece, id] : tok.piece_to_id_) {
    if (byte_token_value(piece) >= 0 || tok.added_ids_.count(piece) != 0 || made.count(id) != 0) continue;
    unmade += bpe_char_size_at(piece, 0) < piece.size() ? 1 : 0;  // a piece of several characters
  }
  return unmade;
}

std::string bpe_sp_spaces(std::string_view text, bool prepend) {
  std::string out(prepend ? kSpace : "");
  for (const char c : text) out += c == ' ' ? kSpace : std::string_view(&c, 1);
  return out;
}

void BpeTokenizer::sp_segment(std::string_view segment, EncodeState& state) const {
  if (sp_metaspace_) {
    const bool prepend = segment.front() != ' ' && !segment.starts_with(kSpace) &&
                         (sp_scheme_ == Prepend::Always ||
                          (sp_scheme_ == Prepend::First && segment.data() == state.text_begin));
    state.prefixed.push_back(bpe_sp_spaces(segment, prepend));
    segment = state.prefixed.back();
  }
  if (!sp_metaspace_ || !sp_split_) {
    sp_word(segment, state);
    return;
  }
  // Split before each "\u2581" (Hugging Face's MergedWithNext).
  std::size_t start = 0;
  for (std::size_t at = segment.find(kSpace, 1); at != std::string_view::npos; at = segment.find(kSpace, at + 1)) {
    sp_word(segment.substr(start, at - start), state);
    start = at;
  }
  sp_word(segment.substr(start), state);
}

void BpeTokenizer::sp_word(std::string_view word, EncodeState& state) const {
  if (word.empty()) return;
  std::vector<std::int32_t>& out = state.out;
  if (ignore_merges_ || (!sp_line_words_ && !sp_space_words_)) {
    sp_line(word, out);
    return;
  }
  // Note [sentencepiece bpe]: cut where no merge can cross; each piece of text between cuts is a
  // view into the text or state.prefixed (which never move) and its ids are cached for the call.
  const auto emit = [&](std::string_view chunk) {
    if (state.cached(chunk)) return;
    const std::size_t offset = out.size();
    sp_line(chunk, out);
    state.remember(chunk, offset);
  };
  std::size_t start = 0;
  for (std::size_t at = 1; at < word.size(); ++at) {
    const bool cut = (sp_line_words_ && word[at - 1] == '\n') ||
                     (sp_space_words_ && word[at] == kSpace[0] && word.substr(at).starts_with(kSpace) &&
                      !(at >= kSpace.size() && word.substr(at - kSpace.size(), kSpace.size()) == kSpace));
    if (!cut) continue;
    emit(word.substr(start, at - start));
    start = at;
  }
  emit(word.substr(start));
}

void BpeTokenizer::sp_line(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges_) {
    if (const auto it = piece_to_id_.find(word); it != piece_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Characters to pieces, or to byte tokens where the vocabulary lacks them (and for ill-formed bytes).
  struct Symbol {
    std::int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](std::int32_t id) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, true});
  };
  for (std::size_t i = 0; i < word.size();) {
    if (const auto c = static_cast<unsigned char>(word[i]); c < 0x80) {
      add(sp_ascii_ids_[c]);
      ++i;
      continue;
    }
    const std::size_t size = bpe_char_size_at(word, i);
    const bool well_formed = size > 1 || static_cast<unsigned char>(word[i]) < 0x80;
    const auto it = well_formed ? piece_to_id_.find(word.substr(i, size)) : piece_to_id_.end();
    if (it != piece_to_id_.end()) {
      add(it->second);
    } else {
      for (std::size_t k = 0; k < size; ++k) add(byte_ids_[static_cast<unsigned char>(word[i + k])]);
    }
    i += size;
  }
  // Hugging Face's merge loop: the lowest rank first, the leftmost on ties; an entry is stale when
  // its symbol was merged away or its pair no longer makes the same token.
  struct Candidate {
    std::int32_t rank, pos, merged_id;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto push_pair = [&](std::int32_t pos) {
    const std::int32_t next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    if (const Merge* m = merge_find(symbols[static_cast<std::size_t>(pos)].id, symbols[static_cast<std::size_t>(next)].id))
      queue.push(Candidate{m->rank, pos, m->merged_id});
  };
  for (std::int32_t pos = 0; pos + 1 < static_cast<std::int32_t>(symbols.size()); ++pos) push_pair(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const Merge* m = merge_find(left.id, right.id);
    if (m == nullptr || m->merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace stratum
