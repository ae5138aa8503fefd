// libFuzzer target for BpeTokenizer::encode: loads the real GPT-2 tokenizer once (encoder.json +
// vocab.bpe from $STRATUM_SHARED_DATA, else <source dir>/../shared/data), encodes the input as
// arbitrary bytes and checks decode(encode(x)) == x (Note [bpe invalid utf-8]); then encodes it
// with the Qwen2-style golden tokenizer (tests/golden/tokenizer_json/qwen2_style: an NFC
// normalizer, Note [nfc normalizer]) and checks that its decoded text encodes to the same ids
// (NFC is idempotent); then with the SentencePiece-style golden tokenizer (llama2_style, Note
// [sentencepiece bpe]) and checks decode(encode(x)) == x for text without its special tokens
// (with each "\u2581" of x read as the space it decodes to); and with one of the three, that
// encode_each of the input's lines gives every line the ids encode() gives it (inputs up to 1 KiB).
// Pass: all hold. Fail: encode or decode throws (encode is documented never to fail), a round
// trip differs, or a sanitizer report. Does not fuzz loading (see bpe_load_fuzz.cpp).
// Run with tools/fuzz.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "stratum/error.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.bpe_encode] %s\n", what.c_str());
  std::abort();
}

std::string shared_data_dir() {
  const char* env = std::getenv("STRATUM_SHARED_DATA");
  return env != nullptr && *env != '\0' ? env : STRATUM_SOURCE_DIR "/../shared/data";
}

// The tokenizer every input is encoded with; loaded by LLVMFuzzerInitialize.
std::unique_ptr<const stratum::BpeTokenizer>& tokenizer() {
  static std::unique_ptr<const stratum::BpeTokenizer> owned;
  return owned;
}
std::unique_ptr<const stratum::BpeTokenizer>& nfc_tokenizer() {
  static std::unique_ptr<const stratum::BpeTokenizer> owned;
  return owned;
}
std::unique_ptr<const stratum::BpeTokenizer>& sp_tokenizer() {
  static std::unique_ptr<const stratum::BpeTokenizer> owned;
  return owned;
}

std::string escaped(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 64)) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(c));
    out += hex;
  }
  return out + (s.size() > 64 ? "..." : "");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = shared_data_dir();
  try {
    tokenizer() = std::make_unique<const stratum::BpeTokenizer>(stratum::BpeTokenizer::load(dir));
  } catch (const stratum::Error& e) {
    std::fprintf(stderr, "[fuzz.bpe_encode] cannot load the GPT-2 tokenizer from '%s' (set "
                 "STRATUM_SHARED_DATA to the folder with encoder.json + vocab.bpe): %s\n",
                 dir.c_str(), e.what());
    std::exit(2);
  }
  for (const char* name : {"qwen2_style", "llama2_style"}) {
    const std::string golden_dir = std::string(STRATUM_SOURCE_DIR "/tests/golden/tokenizer_json/") + name;
    try {
      (name[0] == 'q' ? nfc_tokenizer() : sp_tokenizer()) =
          std::make_unique<const stratum::BpeTokenizer>(stratum::BpeTokenizer::load(golden_dir));
    } catch (const stratum::Error& e) {
      std::fprintf(stderr, "[fuzz.bpe_encode] cannot load '%s': %s\n", golden_dir.c_str(), e.what());
      std::exit(2);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const stratum::BpeTokenizer& tok = *tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::int32_t> ids;
  std::string back;
  try {
    ids = tok.encode(text);
    back = tok.decode(ids);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("encode/decode threw on input ") + escaped(text) + ": " + e.what());
  }
  if (ids.size() > size) fuzz_fail("more tokens than input bytes");
  if (back != text)
    fuzz_fail("decode(encode(x)) != x: x = " + escaped(text) + ", got " + escaped(back));
  const stratum::BpeTokenizer& nfc = *nfc_tokenizer();
  std::vector<std::int32_t> once, again;
  try {
    once = nfc.encode(text);
    again = nfc.encode(nfc.decode(once));
  } catch (const std::exception& e) {
    fuzz_fail(std::string("NFC encode/decode threw on input ") + escaped(text) + ": " + e.what());
  }
  if (again != once) fuzz_fail("NFC: encode(decode(encode(x))) != encode(x): x = " + escaped(text));
  const stratum::BpeTokenizer& sp = *sp_tokenizer();
  try {
    ids = sp.encode(text);
    back = sp.decode(ids);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("SentencePiece-style encode/decode threw on input ") + escaped(text) + ": " + e.what());
  }
  if (ids.size() > size + 1) fuzz_fail("SentencePiece-style: more tokens than input bytes + 1");
  const bool special = text.find("<s>") != std::string_view::npos || text.find("</s>") != std::string_view::npos ||
                       text.find("<unk>") != std::string_view::npos;
  std::string spaced(text);  // a "\u2581" in the text is the space piece: it decodes as a space
  for (std::size_t at = spaced.find("\xE2\x96\x81"); at != std::string::npos; at = spaced.find("\xE2\x96\x81", at))
    spaced.replace(at, 3, " ");
  if (!special && back != spaced)
    fuzz_fail("SentencePiece-style decode(encode(x)) != x: x = " + escaped(text) + ", got " + escaped(back));
  // encode_each: the input's lines as a batch of texts (one cache) give each line encode()'s ids,
  // with one of the three tokenizers (by the input's size), for inputs up to 1 KiB: with all three
  // on every input the target ran ~300 execs/s instead of ~2200.
  if (size > 1024) return 0;
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  const stratum::BpeTokenizer* const each[] = {&tok, &nfc, &sp};
  const stratum::BpeTokenizer& t = *each[size % 3];
  std::vector<std::size_t> ends;
  const std::vector<std::int32_t> all = t.encode_each(lines, ends);
  if (ends.size() != lines.size()) fuzz_fail("encode_each: wrong number of ends");
  for (std::size_t k = 0; k < lines.size(); ++k) {
    const std::size_t from = k == 0 ? 0 : ends[k - 1];
    if (std::vector<std::int32_t>(all.begin() + static_cast<std::ptrdiff_t>(from),
                                  all.begin() + static_cast<std::ptrdiff_t>(ends[k])) != t.encode(lines[k]))
      fuzz_fail("encode_each's line " + std::to_string(k) + " != encode(line): x = " + escaped(text));
  }
  return 0;
}
