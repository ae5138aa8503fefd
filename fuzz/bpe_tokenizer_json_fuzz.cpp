// libFuzzer target for BpeTokenizer::load_tokenizer_json. An input starting with '{' is written
// as is to a per-process temporary file and loaded as a Hugging Face tokenizer.json. Any other
// input fills in a valid small tokenizer.json instead, so that regexes, added tokens and encoding
// get fuzzed too, not only the rejection of bad JSON: its first line is the Split regex (an empty
// line: ByteLevel with add_prefix_space), the next lines up to an empty one are added tokens, and
// the rest is text to encode. A tokenizer that loads must decode every id, report ids in range,
// find every token by its text, and round-trip decode(encode(x)) == x on a fixed sample (with
// added tokens in it) plus the text, unless it adds a prefix space (then encoding must still be
// deterministic); a SentencePiece-style one (byte fallback) must round-trip up to spaces, which
// its prefix space and its decoder's Strip add or take away (Note [sentencepiece bpe]).
// Pass: success or stratum::Error; encode may throw only PCRE2's match-limit class of error, for
// a backtracking regex from the file. Fail: any other exception, a BugError, a broken check, or a
// sanitizer report. Does not compare with Hugging Face (tests/bpe_tokenizer_json_test.cpp does).
// Run with tools/fuzz.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "fuzz_file.h"
#include "../tests/gpt2_byte_symbol.h"
#include "stratum/error.h"

namespace {

using stratum::testing::gpt2_byte_symbol;

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.bpe_tokenizer_json] %s\n", what.c_str());
  std::abort();
}

// Encodes `text`; nullopt when the file's regex gave up (PCRE2 match or depth limit).
std::optional<std::vector<std::int32_t>> encode(const stratum::BpeTokenizer& tok,
                                                std::string_view text) {
  try {
    return tok.encode(text);
  } catch (const stratum::BugError&) {
    throw;
  } catch (const stratum::Error& e) {
    if (std::string_view(e.what()).find("PCRE2 match with") == std::string_view::npos) throw;
    return std::nullopt;
  }
}

// The structured mode's tokenizer.json (see the top of the file); `text` gets the rest.
std::string structured_tokenizer_json(std::string_view input, std::string_view& text) {
  using Json = nlohmann::json;
  std::vector<std::string_view> lines;
  std::size_t pos = 0;
  while (pos <= input.size()) {
    const std::size_t end = std::min(input.find('\n', pos), input.size());
    lines.push_back(input.substr(pos, end - pos));
    pos = end + 1;
    if (lines.size() > 1 && lines.back().empty()) break;
  }
  text = pos < input.size() ? input.substr(pos) : std::string_view();
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_byte_symbol(b)] = b;
  const std::string space = gpt2_byte_symbol(' ');
  for (const std::string& token :
       std::vector<std::string>{"he", "ll", "hell", "hello", space + "t", space + space})
    vocab[token] = static_cast<int>(vocab.size());
  const Json merges =
      Json::array({"h e", "l l", "he ll", "hell o", space + " t", space + " " + space});
  Json added = Json::array();
  std::int64_t next_id = static_cast<std::int64_t>(vocab.size());
  for (std::size_t i = 1; i < lines.size() && !lines[i].empty(); ++i) {
    const std::string content(lines[i]);
    const auto in_vocab = vocab.find(content);
    added.push_back({{"id", in_vocab != vocab.end() ? in_vocab->get<std::int64_t>() : next_id++},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", i % 2 == 0},
                     {"special", i % 3 == 0}});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", lines[0].empty()},
                           {"use_regex", lines[0].empty()}};
  const Json pre_tokenizer =
      lines[0].empty()
          ? byte_level
          : Json{{"type", "Sequence"},
                 {"pretokenizers", Json::array({{{"type", "Split"},
                                                 {"pattern", {{"Regex", std::string(lines[0])}}},
                                                 {"behavior", "Isolated"},
                                                 {"invert", false}},
                                                byte_level})}};
  const Json json = {{"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", pre_tokenizer},
                     {"decoder", {{"type", "ByteLevel"}}},
                     {"model",
                      {{"type", "BPE"},
                       {"ignore_merges", lines.size() % 2 == 0},
                       {"vocab", vocab},
                       {"merges", merges}}}};
  // Invalid UTF-8 in the input becomes U+FFFD: the file stays valid JSON.
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// What decode(encode(x)) must give back for a (loaded, so valid) tokenizer.json.
enum class RoundTrip { Exact, None, UpToSpaces };
RoundTrip round_trip(std::string_view json_text) {
  const nlohmann::json json = nlohmann::json::parse(json_text);
  const nlohmann::json& model = json.at("model");
  if (model.contains("byte_fallback") && model.at("byte_fallback") == true) return RoundTrip::UpToSpaces;
  const nlohmann::json& pre = json.at("pre_tokenizer");
  return pre.at("type") == "ByteLevel" && pre.at("add_prefix_space") == true ? RoundTrip::None : RoundTrip::Exact;
}

std::string without_spaces(std::string s) {  // "\u2581" too: the space piece decodes as a space
  for (std::size_t at = s.find("\xE2\x96\x81"); at != std::string::npos; at = s.find("\xE2\x96\x81", at))
    s.replace(at, 3, " ");
  std::erase(s, ' ');
  return s;
}

void tokenizer_check(const stratum::BpeTokenizer& tok, std::string_view input, RoundTrip rule) {
  const std::int32_t n = tok.vocab_size();
  if (n < 256) fuzz_fail("loaded a vocabulary without all 256 byte tokens");
  for (std::int32_t id = 0; id < n; ++id) {
    const std::string text = tok.decode_token(id);
    const std::int32_t found = tok.token_id(text);
    if (found < 0 || found >= n || tok.decode_token(found) != text)
      fuzz_fail("token_id(decode_token(" + std::to_string(id) + ")) does not find the token");
  }
  for (const std::int32_t id : {tok.eot_id(), tok.bos_id(), tok.eos_id()}) {
    if (id < -1 || id >= n) fuzz_fail("eot/bos/eos id out of range: " + std::to_string(id));
  }
  std::string text =
      "Hello, world! It's 2024: I'LL \xC3\xBCnic\xC3\xB6"
      "de \xF0\x9F\x99\x82 "
      "\xFF\xC0 the hello  cd\n\n<|endoftext|><|eot_id|><|begin_of_text|> x ";
  text.append(input.substr(0, 256));
  const auto ids = encode(tok, text);
  if (!ids) return;
  for (const std::int32_t id : *ids) {
    if (id < 0 || id >= n) fuzz_fail("encode produced an out-of-range id " + std::to_string(id));
  }
  if (encode(tok, text) != ids) fuzz_fail("encode is not deterministic");
  if (rule == RoundTrip::Exact && tok.decode(*ids) != text) fuzz_fail("decode(encode(x)) != x");
  if (rule == RoundTrip::UpToSpaces && without_spaces(tok.decode(*ids)) != without_spaces(text))
    fuzz_fail("SentencePiece-style: decode(encode(x)) != x but for spaces");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();  // Note [fuzz stack limit]
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static stratum::fuzz::FuzzFile file("tokenizer.json");
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string generated;
  if (!input.starts_with('{')) {
    generated = structured_tokenizer_json(input, input);
    data = reinterpret_cast<const std::uint8_t*>(generated.data());
    size = generated.size();
  }
  const std::string& path = file.write(data, size);
  std::optional<stratum::BpeTokenizer> tok;
  try {
    tok.emplace(stratum::BpeTokenizer::load_tokenizer_json(path));
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input: the expected outcome for most fuzz inputs
  } catch (const std::exception& e) {
    fuzz_fail(std::string("unexpected exception while loading: ") + e.what());
  }
  try {
    tokenizer_check(*tok, input, round_trip(std::string_view(reinterpret_cast<const char*>(data), size)));
  } catch (const std::exception& e) {
    fuzz_fail(std::string("a tokenizer that loaded then threw: ") + e.what());
  }
  return 0;
}
