// Tests for BpeTokenizer's Hugging Face tokenizer.json loading: the golden ids made by Hugging
// Face's own tokenizers library (tools/make_tokenizer_json_golden.sh) for a small Llama-3-style
// tokenizer and for GPT-2's tokenizer.json (with and without add_prefix_space) must match exactly
// and round-trip; GPT-2's tokenizer.json encodes like encoder.json + vocab.bpe apart from the
// special token; load() prefers tokenizer.json; malformed and unsupported files fail with one
// "[tokenizer]" line naming the file and the field. Does not time anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "gpt2_byte_symbol.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "tokenizer_json_cases.h"

namespace stratum {
namespace {

using Json = nlohmann::json;

const std::string kGoldenDir = STRATUM_SOURCE_DIR "/tests/golden/tokenizer_json";
const std::string kLlamaDir = kGoldenDir + "/llama3_style";
// Llama 3's pre-tokenizer regex, as in its tokenizer.json.
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string shared_data_dir() {
  const char* env = std::getenv("STRATUM_SHARED_DATA");
  return env != nullptr && *env != '\0' ? std::string(env)
                                        : std::string(STRATUM_SOURCE_DIR "/../shared/data");
}

using testing::TempDir;
using testing::gpt2_byte_symbol;

const Json& golden() {
  static const Json table = Json::parse(file_read_all(kGoldenDir + "/golden.json"));
  return table;
}

Json added_token(std::int64_t id, const std::string& content, bool special, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

// GPT-2's tokenizer.json as on the Hugging Face Hub, built from encoder.json + vocab.bpe; the
// same recipe as gpt2TokenizerJson in tools/tokenizer_json_golden.js.
Json gpt2_tokenizer_json(bool add_prefix_space) {
  Json merges = Json::array();
  const std::string text = file_read_all(shared_data_dir() + "/vocab.bpe");
  for (std::size_t pos = 0, line_no = 0; pos < text.size(); ++line_no) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && !(line_no == 0 && line.starts_with("#version"))) merges.push_back(line);
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", Json::array({added_token(50256, "<|endoftext|>", true, true)})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", add_prefix_space},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", Json::parse(file_read_all(shared_data_dir() + "/encoder.json"))},
            {"merges", merges}}}};
}

// GPT-2's tokenizer.json (add_prefix_space false), written once for the whole test binary.
const BpeTokenizer& gpt2_json() {
  static const TempDir dir;
  static const BpeTokenizer tok = [] {
    file_write_atomic(dir.file("tokenizer.json"), gpt2_tokenizer_json(false).dump());
    return BpeTokenizer::load(dir.path());
  }();
  return tok;
}

const BpeTokenizer& llama() {
  static const BpeTokenizer tok = BpeTokenizer::load(kLlamaDir);
  return tok;
}

// The ids of one golden section must match exactly; round_trip: decode gives the text back.
void golden_check(const BpeTokenizer& tok, const char* section, bool round_trip) {
  const Json& cases = golden().at(section);
  ASSERT_GE(cases.size(), 80u) << "golden table looks truncated: run "
                                  "tools/make_tokenizer_json_golden.sh";
  for (const Json& golden_case : cases) {
    const std::string text = golden_case.at("text").get<std::string>();
    const auto expected = golden_case.at("ids").get<std::vector<std::int32_t>>();
    const std::vector<std::int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, expected) << section << " text: " << Json(text).dump();
    if (round_trip) {
      EXPECT_EQ(tok.decode(ids), text) << section << " text: " << Json(text).dump();
    }
  }
}

TEST(BpeTokenizerJsonTest, Llama3StyleGoldenMatchesHuggingFaceAndRoundTrips) {
  golden_check(llama(), "llama3_style", true);
}

// Note [nfc normalizer]: Qwen2's layout (an NFC normalizer, its regex with single digits, no
// ignore_merges, <|im_start|> and <|im_end|>) gives Hugging Face's ids, combining marks,
// singletons and Hangul jamo composed before the merges (three golden texts move under NFC);
// ASCII and ill-formed bytes pass through; decode gives the NFC form.
TEST(BpeTokenizerJsonTest, Qwen2StyleNfcGoldenMatchesHuggingFace) {
  const BpeTokenizer tok = BpeTokenizer::load(kGoldenDir + "/qwen2_style");
  golden_check(tok, "qwen2_style", false);
  EXPECT_EQ(tok.decode(tok.encode("cafe\xCC\x81 \xE2\x84\xAB")), "caf\xC3\xA9 \xC3\x85");  // e + U+0301, U+212B
  EXPECT_EQ(tok.encode("cafe\xCC\x81"), tok.encode("caf\xC3\xA9"));
  const std::string ascii = "plain ASCII text, 123 <|im_end|>";
  EXPECT_EQ(tok.decode(tok.encode(ascii)), ascii);
  const std::string bad = "a\xFF e\xCC\x81\xC3 \x80x";  // ill-formed bytes around a mark
  EXPECT_EQ(tok.decode(tok.encode(bad)), "a\xFF \xC3\xA9\xC3 \x80x");
  EXPECT_EQ(tok.token_id("<|im_start|>"), tok.encode("<|im_start|>").at(0));
}

TEST(BpeTokenizerJsonTest, Gpt2GoldenMatchesHuggingFaceAndRoundTrips) {
  golden_check(gpt2_json(), "gpt2", true);
}

TEST(BpeTokenizerJsonTest, Gpt2AddPrefixSpaceGoldenMatchesHuggingFace) {
  TempDir dir;
  file_write_atomic(dir.file("tokenizer.json"), gpt2_tokenizer_json(true).dump());
  const BpeTokenizer tok = BpeTokenizer::load(dir.path());
  golden_check(tok, "gpt2_prefix_space", false);
  // Each piece of text between added tokens gets its own space.
  EXPECT_EQ(tok.decode(tok.encode("Hello<|endoftext|>World")), " Hello<|endoftext|> World");
  EXPECT_EQ(tok.decode(tok.encode(" Hello")), " Hello");
}

TEST(BpeTokenizerJsonTest, LlamaStyleFacts) {
  const BpeTokenizer& tok = llama();
  EXPECT_EQ(tok.vocab_size(), 667);  // 256 bytes + 400 merges + 5 whole words + 6 added
  EXPECT_EQ(tok.token_id("<|begin_of_text|>"), 661);
  EXPECT_EQ(tok.token_id("<|end_of_text|>"), 662);
  EXPECT_EQ(tok.token_id("<|eot_id|>"), 663);
  EXPECT_EQ(tok.token_id(" Capulet"), 666);
  EXPECT_EQ(tok.token_id("<|start_header_id|>"), -1);
  EXPECT_EQ(tok.token_id(""), -1);
  EXPECT_EQ(tok.bos_id(), 661);
  EXPECT_EQ(tok.eos_id(), -1);
  EXPECT_EQ(tok.eot_id(), -1);
  EXPECT_EQ(tok.decode_token(663), "<|eot_id|>");
  EXPECT_EQ(tok.decode_token(10), "\n");
  EXPECT_EQ(tok.token_id("\n"), 10);
  EXPECT_EQ(tok.token_id(" Romeo"), tok.encode(" Romeo").at(0));  // a whole word: ignore_merges
  EXPECT_EQ(tok.encode(" Romeo").size(), 1u);
  for (std::int32_t id = 0; id < tok.vocab_size(); ++id) {
    EXPECT_EQ(tok.token_id(tok.decode_token(id)), id) << "id " << id;
  }
  EXPECT_EQ(tok.encode("<|eot_id|>"), std::vector<std::int32_t>{663});
  const std::vector<std::int32_t> bos_hi = tok.encode("<|begin_of_text|>hi");
  EXPECT_EQ(bos_hi.front(), 661);
  EXPECT_EQ(tok.decode(bos_hi), "<|begin_of_text|>hi");
}

TEST(BpeTokenizerJsonTest, Llama3RegexGroupsDigitsInThreesAndFoldsContractions) {
  // Token boundaries never cross pre-token boundaries, so the decoded tokens show the split.
  const auto boundaries = [](const BpeTokenizer& tok, const std::string& text) {
    std::vector<std::size_t> ends;
    std::size_t at = 0;
    for (const std::int32_t id : tok.encode(text))
      ends.push_back(at += tok.decode_token(id).size());
    return ends;
  };
  const std::vector<std::size_t> digits = boundaries(llama(), "1234567");
  for (const std::size_t cut : {3u, 6u, 7u}) {
    EXPECT_NE(std::find(digits.begin(), digits.end(), cut), digits.end()) << cut;
  }
  const std::vector<std::size_t> shout = boundaries(llama(), "I'LL");
  EXPECT_NE(std::find(shout.begin(), shout.end(), 1u), shout.end());  // "I" | "'LL"
  // GPT-2 keeps "'LL" apart only in lower case: "'" then "LL".
  const std::vector<std::size_t> gpt2 = boundaries(gpt2_json(), "I'LL");
  EXPECT_NE(std::find(gpt2.begin(), gpt2.end(), 2u), gpt2.end());
}

TEST(BpeTokenizerJsonTest, Gpt2TokenizerJsonEncodesLikeTheOpenAiFiles) {
  const BpeTokenizer legacy = BpeTokenizer::load(shared_data_dir());
  const BpeTokenizer& json = gpt2_json();
  EXPECT_EQ(json.vocab_size(), 50257);
  EXPECT_EQ(json.eot_id(), 50256);
  EXPECT_EQ(json.token_id("<|endoftext|>"), 50256);
  EXPECT_EQ(json.bos_id(), -1);
  const std::string text = file_read_all(shared_data_dir() + "/tinyshakespeare.txt");
  ASSERT_EQ(text.find("<|endoftext|>"), std::string::npos);
  EXPECT_EQ(json.encode(text), legacy.encode(text));
  // The one difference: tokenizer.json makes "<|endoftext|>" in the text the special token.
  EXPECT_EQ(json.encode("a<|endoftext|>b"),
            (std::vector<std::int32_t>{json.token_id("a"), 50256, json.token_id("b")}));
  EXPECT_GT(legacy.encode("a<|endoftext|>b").size(), 3u);
}

TEST(BpeTokenizerJsonTest, LoadPrefersTokenizerJson) {
  TempDir dir;
  std::filesystem::copy_file(shared_data_dir() + "/encoder.json", dir.path() + "/encoder.json");
  std::filesystem::copy_file(shared_data_dir() + "/vocab.bpe", dir.path() + "/vocab.bpe");
  EXPECT_EQ(BpeTokenizer::load(dir.path()).vocab_size(), 50257);
  std::filesystem::copy_file(kLlamaDir + "/tokenizer.json", dir.path() + "/tokenizer.json");
  EXPECT_EQ(BpeTokenizer::load(dir.path()).vocab_size(), 667);
  EXPECT_EQ(BpeTokenizer::load_tokenizer_json(kLlamaDir + "/tokenizer.json").vocab_size(), 667);
}

TEST(BpeTokenizerJsonTest, ArbitraryBytesRoundTripAroundAddedTokens) {
  std::mt19937 rng(2024);  // fixed seed: random bytes, mostly invalid UTF-8, with added tokens
  const std::vector<std::string> specials = {"<|eot_id|>", "<|end", "QQ<|eot", " Capulet", "\n\n"};
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    const std::size_t parts = rng() % 6;
    for (std::size_t p = 0; p < parts; ++p) {
      if (rng() % 3 == 0) text += specials[rng() % specials.size()];
      std::string bytes(rng() % 24, '\0');
      for (char& c : bytes) c = static_cast<char>(rng() % 5 == 0 ? ' ' : rng() & 0xFF);
      text += bytes;
    }
    const std::vector<std::int32_t> ids = llama().encode(text);
    EXPECT_EQ(llama().encode(text), ids) << "trial " << trial;
    EXPECT_EQ(llama().decode(ids), text) << "trial " << trial;
    EXPECT_EQ(gpt2_json().decode(gpt2_json().encode(text)), text) << "trial " << trial;
  }
}

TEST(BpeTokenizerJsonTest, LongRunsEncodeWithoutRegexErrors) {
  // Backtracking over long runs (\s*[\r\n]+, \s+(?!\S)) must stay within PCRE2's limits.
  const std::vector<std::string> texts = {std::string(200000, ' ') + "x",
                                          std::string(200000, '\n'),
                                          std::string(100000, '\t') + "\n",
                                          [] {
                                            std::string mixed;
                                            for (int i = 0; i < 50000; ++i)
                                              mixed += i % 7 == 0 ? "\r\n" : " ";
                                            return mixed + "end";
                                          }(),
                                          std::string(100000, '7'),
                                          std::string(100000, 'a'),
                                          std::string(100000, '!') + "\n\n"};
  for (const std::string& text : texts) {
    for (const BpeTokenizer* tok : {&llama(), &gpt2_json()}) {
      std::vector<std::int32_t> ids;
      ASSERT_NO_THROW(ids = tok->encode(text)) << text.substr(0, 8);
      EXPECT_EQ(tok->decode(ids), text);
    }
  }
}

TEST(BpeTokenizerJsonTest, ConcurrentEncodesAgree) {
  const std::string text =
      file_read_all(shared_data_dir() + "/tinyshakespeare.txt").substr(0, 100000) +
      "<|eot_id|> Lady Capulet<|end_of_text|>";
  const std::vector<std::int32_t> expected = llama().encode(text);
  std::vector<std::vector<std::int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&text, &result] { result = llama().encode(text); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
  EXPECT_EQ(llama().decode(expected), text);
}

// A small valid Llama-3-style tokenizer.json: the 256 byte tokens, "ab" (256) from merge "a b",
// <|eot_id|> (257) and a BOS template. The malformed cases each break one thing in it.
Json small_tokenizer_json() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[gpt2_byte_symbol(b)] = b;
  vocab["ab"] = 256;
  return {
      {"version", "1.0"},
      {"added_tokens", Json::array({added_token(257, "<|eot_id|>", true, false)})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", kLlama3Regex}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({{{"SpecialToken", {{"id", "<|eot_id|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens",
         {{"<|eot_id|>", {{"id", "<|eot_id|>"}, {"ids", {257}}, {"tokens", {"<|eot_id|>"}}}}}}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", Json::array({"a b"})}}}};
}

BpeTokenizer load_json(const Json& json) {
  TempDir dir;
  file_write_atomic(dir.file("tokenizer.json"), json.dump());
  return BpeTokenizer::load(dir.path());
}

TEST(BpeTokenizerJsonTest, SmallTokenizerLoads) {
  const BpeTokenizer tok = load_json(small_tokenizer_json());
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.encode("ab<|eot_id|>"), (std::vector<std::int32_t>{256, 257}));
  EXPECT_EQ(tok.bos_id(), 257);
  EXPECT_EQ(tok.eos_id(), -1);
  Json pairs = small_tokenizer_json();
  pairs["model"]["merges"] = Json::array({Json::array({"a", "b"})});
  EXPECT_EQ(load_json(pairs).encode("ab"), std::vector<std::int32_t>{256});
  Json wrapped = small_tokenizer_json();
  Json single = wrapped["post_processor"]["single"];
  single.push_back(single[0]);  // <|eot_id|> $A <|eot_id|>
  wrapped["post_processor"]["single"] = single;
  wrapped["post_processor"] = {
      {"type", "Sequence"},
      {"processors", Json::array({{{"type", "ByteLevel"}}, wrapped["post_processor"]})}};
  EXPECT_EQ(load_json(wrapped).bos_id(), 257);
  EXPECT_EQ(load_json(wrapped).eos_id(), 257);
  Json none = small_tokenizer_json();
  none.erase("post_processor");
  EXPECT_EQ(load_json(none).bos_id(), -1);
}

// Empty regex matches yield no pre-token but end the text before them, as in Hugging Face's
// Split; ^ matches after newlines as in Oniguruma. Every expectation here is what tokenizers
// 0.23.2 gives for the same tokenizer.json.
TEST(BpeTokenizerJsonTest, EmptyRegexMatchesSplitLikeHuggingFace) {
  Json json = small_tokenizer_json();
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "x*";
  const BpeTokenizer star = load_json(json);
  EXPECT_EQ(star.encode("abxc"), (std::vector<std::int32_t>{'a', 'b', 'x', 'c'}));  // id = byte
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a*|b";
  const BpeTokenizer alt = load_json(json);
  EXPECT_EQ(alt.encode("bab"), (std::vector<std::int32_t>{'b', 'a', 'b'}));
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "ab";
  EXPECT_EQ(load_json(json).encode("xabab"), (std::vector<std::int32_t>{'x', 256, 256}));
  // Multiline anchors, as in Oniguruma: "^a" matches after each newline too, so the second "a"
  // is a pre-token of its own and does not merge with the "b" after it.
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "^a";
  EXPECT_EQ(load_json(json).encode("ab\nab"),
            (std::vector<std::int32_t>{'a', 'b', '\n', 'a', 'b'}));
}

using testing::MalformedCase;

TEST(BpeTokenizerJsonTest, MalformedAndUnsupportedFilesThrowOneLineErrors) {
  const char* const kSupported =
      "Stratum supports BPE tokenizer.json files: byte-level (GPT-2, Llama 3, Qwen2) and SentencePiece-style with "
      "byte fallback (Llama 2, TinyLlama, Mistral)";
  auto split = [](Json& j) -> Json& { return j["pre_tokenizer"]["pretokenizers"][0]; };
  auto byte_level = [](Json& j) -> Json& { return j["pre_tokenizer"]["pretokenizers"][1]; };
  const std::vector<MalformedCase> cases = {
      {"not JSON", nullptr, "is not valid JSON", "{\"model\": "},
      {"top level array", nullptr,
       "the top level (a Hugging Face tokenizer.json) must be an object", "[1, 2]"},
      {"no model", [](Json& j) { j.erase("model"); }, "has no \"model\" field"},
      {"model not object", [](Json& j) { j["model"] = 3; }, "model must be an object"},
      {"no model type", [](Json& j) { j["model"].erase("type"); }, "model has no \"type\" field"},
      {"Unigram", [](Json& j) { j["model"]["type"] = "Unigram"; },
       "model.type is \"Unigram\": SentencePiece's Unigram tokenizers (e.g. T5, ALBERT, XLNet) are "
       "not supported; Stratum supports BPE tokenizer.json files"},
      {"WordPiece", [](Json& j) { j["model"]["type"] = "WordPiece"; },
       "WordPiece tokenizers (e.g. BERT) are not supported"},
      {"WordLevel", [](Json& j) { j["model"]["type"] = "WordLevel"; }, "WordLevel tokenizers"},
      {"unknown model", [](Json& j) { j["model"]["type"] = "Magic"; }, "'Magic' is unknown"},
      // With byte fallback the file must have SentencePiece's spaces (bpe_tokenizer_sp_test.cpp).
      {"byte_fallback", [](Json& j) { j["model"]["byte_fallback"] = true; },
       "pre_tokenizer Sequence is not supported; supported with byte fallback"},
      {"byte_fallback not bool", [](Json& j) { j["model"]["byte_fallback"] = "no"; },
       "model.byte_fallback must be true or false, got a string"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout must be null"},
      {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix is '##': word-piece style BPE is not supported"},
      {"unk_token number", [](Json& j) { j["model"]["unk_token"] = 3; },
       "model.unk_token must be a string or null"},
      {"ignore_merges string", [](Json& j) { j["model"]["ignore_merges"] = "yes"; },
       "model.ignore_merges must be true or false"},
      {"normalizer NFKC",
       [](Json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer 'NFKC' is not supported: Stratum normalizes text only to NFC"},
      {"normalizer SentencePiece",
       [](Json& j) {
         j["normalizer"] = {
             {"type", "Sequence"},
             {"normalizers", Json::array({{{"type", "Prepend"}}, {{"type", "Replace"}}})}};
       },
       "without byte fallback: SentencePiece-style spaces need \"model\": {\"byte_fallback\": true}"},
      {"normalizer not object", [](Json& j) { j["normalizer"] = "NFC"; },
       "normalizer must be an object, got a string"},
      {"pre_tokenizer null", [](Json& j) { j["pre_tokenizer"] = nullptr; },
       "pre_tokenizer is missing or null"},
      {"pre_tokenizer missing", [](Json& j) { j.erase("pre_tokenizer"); },
       "pre_tokenizer is missing or null"},
      {"Metaspace",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer is Metaspace without byte fallback: SentencePiece-style spaces need"},
      {"Metaspace in Sequence",
       [&](Json& j) {
         split(j) = {{"type", "Metaspace"}};
       },
       "pre_tokenizer.pretokenizers[0] is Metaspace"},
      {"Whitespace",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer 'Whitespace' is not supported; supported: ByteLevel, or a Sequence"},
      {"ByteLevel without add_prefix_space",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
       },
       "pre_tokenizer has no \"add_prefix_space\" field"},
      {"ByteLevel without regex",
       [](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
       },
       "use_regex false is not supported alone"},
      {"Sequence of three",
       [&](Json& j) { j["pre_tokenizer"]["pretokenizers"].push_back(byte_level(j)); },
       "pre_tokenizer Sequence of 3 parts is not supported"},
      {"Sequence reversed", [&](Json& j) { std::swap(split(j), byte_level(j)); },
       "pre_tokenizer Sequence of 2 parts is not supported"},
      {"pretokenizers not array", [](Json& j) { j["pre_tokenizer"]["pretokenizers"] = 1; },
       "pre_tokenizer.pretokenizers must be an array"},
      {"Split String pattern",
       [&](Json& j) {
         split(j)["pattern"] = {{"String", " "}};
       },
       "pre_tokenizer.pretokenizers[0].pattern has no \"Regex\" (a String pattern is not "
       "supported)"},
      {"Split regex not string", [&](Json& j) { split(j)["pattern"]["Regex"] = 5; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex must be a string, got a number"},
      {"Split Removed", [&](Json& j) { split(j)["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior 'Removed' is not supported"},
      {"Split inverted", [&](Json& j) { split(j)["invert"] = true; }, ".invert true"},
      {"Split regex bad", [&](Json& j) { split(j)["pattern"]["Regex"] = "(ab"; },
       "PCRE2 cannot compile the pre_tokenizer regex of '"},
      {"Split regex \\C", [&](Json& j) { split(j)["pattern"]["Regex"] = "a\\C"; },
       "PCRE2 cannot compile the pre_tokenizer regex of '"},
      {"ByteLevel prefix after Split", [&](Json& j) { byte_level(j)["add_prefix_space"] = true; },
       "must have add_prefix_space and use_regex false"},
      {"ByteLevel regex after Split", [&](Json& j) { byte_level(j).erase("use_regex"); },
       "must have add_prefix_space and use_regex false"},
      {"decoder missing", [](Json& j) { j.erase("decoder"); }, "decoder is missing or null"},
      {"decoder WordPiece",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder 'WordPiece' is not supported; supported: ByteLevel"},
      {"added_tokens not array", [](Json& j) { j["added_tokens"] = Json::object(); },
       "added_tokens must be an array, got a object"},
      {"added token without special", [](Json& j) { j["added_tokens"][0].erase("special"); },
       "added_tokens[0] has no \"special\" field"},
      {"added token negative id", [](Json& j) { j["added_tokens"][0]["id"] = -3; },
       "added_tokens[0].id must be a non-negative integer"},
      {"added token empty", [](Json& j) { j["added_tokens"][0]["content"] = ""; },
       "added_tokens[0].content is empty"},
      {"added token lstrip", [](Json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "added_tokens[0] ('<|eot_id|>') has lstrip true"},
      {"added token single_word", [](Json& j) { j["added_tokens"][0]["single_word"] = true; },
       "has single_word true"},
      {"added token repeated",
       [](Json& j) { j["added_tokens"].push_back(added_token(258, "<|eot_id|>", true, false)); },
       "added_tokens[1] repeats the added token '<|eot_id|>'"},
      {"added token id gap", [](Json& j) { j["added_tokens"][0]["id"] = 300; },
       "added_tokens[0] ('<|eot_id|>') has id 300 but Hugging Face gives it id 257"},
      {"added tokens out of order",
       [](Json& j) {
         j["added_tokens"][0]["id"] = 258;
         j["added_tokens"].push_back(added_token(257, "<|x|>", true, false));
       },
       "added_tokens[0] ('<|eot_id|>') has id 258 but Hugging Face gives it id 257"},
      {"added token in vocab with another id",
       [](Json& j) { j["added_tokens"].push_back(added_token(258, "ab", true, false)); },
       "added_tokens[1] ('ab') has id 258 but model.vocab gives it id 256"},
      {"added token in vocab with other text",
       [](Json& j) {
         j["model"]["vocab"].erase("ab");
         j["model"]["vocab"][gpt2_byte_symbol(' ') + "x"] = 256;
         j["model"]["merges"] = Json::array();
         j["added_tokens"].push_back(added_token(256, gpt2_byte_symbol(' ') + "x", false, false));
       },
       "('\xC4\xA0x') is a model.vocab token whose text is different (' x')"},
      {"vocab missing", [](Json& j) { j["model"].erase("vocab"); }, "model has no \"vocab\" field"},
      {"vocab array", [](Json& j) { j["model"]["vocab"] = Json::array({"a"}); },
       "model.vocab must be a non-empty JSON object of token -> id, got a array"},
      {"vocab string id", [](Json& j) { j["model"]["vocab"]["ab"] = "256"; },
       "model.vocab: token 'ab' maps to a string, expected an integer id"},
      {"vocab duplicate id", [](Json& j) { j["model"]["vocab"]["ab"] = 7; },
       "ids must be unique and cover 0..256"},
      {"vocab id past the end", [](Json& j) { j["model"]["vocab"]["ab"] = 400; },
       "model.vocab: token 'ab' has id 400 but ids must be unique and cover 0..256"},
      {"vocab lacks a byte",
       [](Json& j) {
         j["model"]["vocab"].erase("a");
         j["model"]["vocab"]["ab"] = 'a';
       },
       "model.vocab lacks the single-byte token for byte 97"},
      {"vocab token outside the alphabet", [](Json& j) { j["model"]["vocab"]["a b"] = 257; },
       "model.vocab: token 'a b' has a character outside GPT-2's byte-to-unicode alphabet"},
      {"merges missing", [](Json& j) { j["model"].erase("merges"); },
       "model has no \"merges\" field"},
      {"merges object", [](Json& j) { j["model"]["merges"] = Json::object(); },
       "model.merges must be an array, got a object"},
      {"merge of three symbols", [](Json& j) { j["model"]["merges"].push_back("a b c"); },
       "model.merges[1]: bad merge 'a b c', expected two symbols separated by one space"},
      {"merge without space", [](Json& j) { j["model"]["merges"].push_back("ab"); },
       "model.merges[1]: bad merge 'ab'"},
      {"merge of unknown symbols", [](Json& j) { j["model"]["merges"].push_back("b c"); },
       "model.merges[1]: merge 'b c' names a symbol (or makes a token) that is not in model.vocab"},
      {"merge outside the alphabet",
       [](Json& j) { j["model"]["merges"].push_back("a \xE4\xB8\xAD"); },
       "has a character outside GPT-2's byte-to-unicode alphabet"},
      {"merges mixed",
       [](Json& j) {
         j["model"]["merges"].push_back(Json::array({"a", "b"}));
       },
       "model.merges[1] must be a string like model.merges[0]"},
      {"merge pair of three",
       [](Json& j) {
         j["model"]["merges"] =
             Json::array({Json::array({"a", "b"}), Json::array({"a", "b", "c"})});
       },
       "model.merges[1] must be a pair of strings"},
      {"template without $A", [](Json& j) { j["post_processor"]["single"].erase(1); },
       "post_processor.single has no {\"Sequence\": {\"id\": \"A\"}} piece"},
      {"template unknown special",
       [](Json& j) { j["post_processor"]["special_tokens"] = Json::object(); },
       "post_processor.special_tokens has no entry '<|eot_id|>'"},
      {"template id out of range",
       [](Json& j) { j["post_processor"]["special_tokens"]["<|eot_id|>"]["ids"] = {258}; },
       "post_processor.special_tokens.<|eot_id|>.ids must hold one id in 0..257"},
      {"template two ids",
       [](Json& j) {
         j["post_processor"]["special_tokens"]["<|eot_id|>"]["ids"] = {1, 2};
       },
       ".ids must hold one id"},
      {"post_processor without type", [](Json& j) { j["post_processor"] = Json::object(); },
       "post_processor has no \"type\" field"},
  };
  testing::expect_malformed_refused(small_tokenizer_json(), cases);
  // The unsupported kinds all say what is supported.
  for (const char* type : {"Unigram", "WordPiece"}) {
    Json json = small_tokenizer_json();
    json["model"]["type"] = type;
    try {
      load_json(json);
      ADD_FAILURE() << type << ": load did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(kSupported), std::string::npos) << e.what();
    }
  }
  try {
    BpeTokenizer::load_tokenizer_json("/nonexistent/stratum/tokenizer.json");
    ADD_FAILURE() << "missing file: load did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/stratum/tokenizer.json' is missing"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace stratum
