// Tests for SentencePiece-style BPE tokenizer.json files (Note [sentencepiece bpe]): the golden
// ids and decoded texts that Hugging Face's tokenizers library gives for a model that
// sentencepiece trained (tools/make_tokenizer_json_golden.sh; sentencepiece itself gives the same
// ids) must match exactly, in Llama 2's layout, transformers' legacy=False layout, and Metaspace
// with split and prepend_scheme "always"; ill-formed bytes and whole documents round-trip;
// malformed files fail with one "[tokenizer]" line. Does not time anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "tokenizer_json_cases.h"

namespace stratum {
namespace {

using Json = nlohmann::json;
using testing::TempDir;

const std::string kGoldenDir = STRATUM_SOURCE_DIR "/tests/golden/tokenizer_json";
const std::string kSpace = "\xE2\x96\x81";

const Json& golden() {
  static const Json table = Json::parse(file_read_all(kGoldenDir + "/golden.json"));
  return table;
}

Json llama2_json() { return Json::parse(file_read_all(kGoldenDir + "/llama2_style/tokenizer.json")); }

BpeTokenizer load_json(const Json& json) {
  TempDir dir;
  file_write_atomic(dir.file("tokenizer.json"), json.dump());
  return BpeTokenizer::load(dir.path());
}

const BpeTokenizer& llama2() {
  static const BpeTokenizer tok = BpeTokenizer::load(kGoldenDir + "/llama2_style");
  return tok;
}

// Every text of a golden section encodes to Hugging Face's ids, and (where the section has them)
// decodes to what Hugging Face's decoder gives for those ids; with `bytes_differ` only where no id
// is a byte token (a Metaspace decoder shows those as "<0xNN>" text, Stratum as their byte).
void golden_check(const BpeTokenizer& tok, const char* section, bool bytes_differ = false) {
  const Json& cases = golden().at(section);
  ASSERT_GE(cases.size(), 90u) << "golden table looks truncated: run tools/make_tokenizer_json_golden.sh";
  for (const Json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<std::int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, c.at("ids").get<std::vector<std::int32_t>>()) << section << " text: " << Json(text).dump();
    const bool byte_token = std::any_of(ids.begin(), ids.end(), [](std::int32_t id) { return id >= 3 && id < 259; });
    if (c.contains("decoded") && !(bytes_differ && byte_token)) {
      EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>()) << section << " text: " << Json(text).dump();
    }
  }
}

TEST(BpeTokenizerSpTest, Llama2StyleGoldenMatchesHuggingFace) { golden_check(llama2(), "llama2_style"); }

TEST(BpeTokenizerSpTest, MetaspaceStyleGoldenMatchesHuggingFace) {
  golden_check(BpeTokenizer::load(kGoldenDir + "/metaspace_style"), "metaspace_style");
}

// A Metaspace decoder (and an empty normalizer Sequence, as some Hub files have): the first
// token's spaces go.
TEST(BpeTokenizerSpTest, MetaspaceDecoderGoldenMatchesHuggingFace) {
  Json json = Json::parse(file_read_all(kGoldenDir + "/metaspace_style/tokenizer.json"));
  json["decoder"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "first"}, {"split", false}};
  json["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array()}};
  const BpeTokenizer tok = load_json(json);
  golden_check(tok, "metaspace_decoder", true);
  EXPECT_EQ(tok.decode(tok.encode("Hello\nworld")), "Hello\nworld");  // its byte token as the byte
  json["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(load_json(json).decode(load_json(json).encode("Hello")), " Hello");
}

TEST(BpeTokenizerSpTest, MetaspaceSplitAlwaysGoldenMatchesHuggingFace) {
  Json json = Json::parse(file_read_all(kGoldenDir + "/metaspace_style/tokenizer.json"));
  json["pre_tokenizer"]["split"] = true;
  json["pre_tokenizer"]["prepend_scheme"] = "always";
  golden_check(load_json(json), "metaspace_split_always");
  // The older spelling: add_prefix_space true means "always", and split defaults to true.
  json["pre_tokenizer"].erase("prepend_scheme");
  json["pre_tokenizer"].erase("split");
  json["pre_tokenizer"]["add_prefix_space"] = true;
  golden_check(load_json(json), "metaspace_split_always");
}

// Gemma's layout: the Replace normalizer alone (no Prepend) and a Split on " " that finds no space
// once every one is "\u2581", decoded without a Strip. A text with a space in front is then Llama
// 2's text with its prepended "\u2581": the same ids, decoded with that space.
TEST(BpeTokenizerSpTest, GemmaLayoutIsLlama2sWithoutThePrependedSpace) {
  Json json = llama2_json();
  json["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
  json["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"},
                           {"invert", false}};
  json["decoder"]["decoders"].erase(3);  // no Strip
  const BpeTokenizer tok = load_json(json);
  int checked = 0;
  for (const Json& c : golden().at("llama2_style")) {
    const std::string text = c.at("text").get<std::string>();
    // Llama 2's Prepend puts a space before each piece between added tokens; an empty text gets none.
    if (text.empty() || text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos ||
        text.find("<unk>") != std::string::npos)
      continue;
    const std::vector<std::int32_t> ids = tok.encode(" " + text);
    EXPECT_EQ(ids, c.at("ids").get<std::vector<std::int32_t>>()) << Json(text).dump();
    if (c.contains("decoded")) {  // Hugging Face's decoding of Llama 2's ids, which Strip drops the space of
      EXPECT_EQ(tok.decode(ids), " " + c.at("decoded").get<std::string>()) << Json(text).dump();
    }
    ++checked;
  }
  EXPECT_GE(checked, 80);
  EXPECT_NE(tok.encode("Hello"), llama2().encode("Hello")) << "no space is prepended";
  // A Split on anything else is refused.
  json["pre_tokenizer"]["pattern"]["String"] = "x";
  try {
    load_json(json);
    ADD_FAILURE() << "a Split on \"x\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer Split after a normalizer is not supported"), std::string::npos)
        << e.what();
  }
}

TEST(BpeTokenizerSpTest, Llama2StyleFacts) {
  const BpeTokenizer& tok = llama2();
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.token_id("<unk>"), 0);
  EXPECT_EQ(tok.token_id("<s>"), 1);
  EXPECT_EQ(tok.token_id("</s>"), 2);
  EXPECT_EQ(tok.bos_id(), 1);  // Llama 2's TemplateProcessing puts <s> first
  EXPECT_EQ(tok.eos_id(), -1);
  EXPECT_EQ(tok.eot_id(), -1);
  // Byte tokens decode to their byte; pieces to their text with spaces.
  EXPECT_EQ(tok.decode_token(3), std::string(1, '\0'));
  EXPECT_EQ(tok.decode_token(3 + 0x0A), "\n");
  EXPECT_EQ(tok.token_id("\n"), 3 + 0x0A);
  const std::int32_t the = tok.token_id(" the");
  ASSERT_GE(the, 259);
  EXPECT_EQ(tok.decode_token(the), " the");
  EXPECT_EQ(tok.encode("the").front(), the);  // the prefix space
  // Every piece but the byte tokens that a piece shadows is found by its text.
  for (std::int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::int32_t found = tok.token_id(tok.decode_token(id));
    EXPECT_TRUE(found == id || (id >= 3 && id < 259 && tok.decode_token(found) == tok.decode_token(id))) << id;
  }
  // decode() drops the one space the normalizer put in front, as Hugging Face's Strip does.
  EXPECT_EQ(tok.decode(tok.encode("Hello world")), "Hello world");
  EXPECT_EQ(tok.decode(tok.encode(" Hello")), " Hello");
}

// Bytes that are not UTF-8 become byte tokens (Hugging Face takes no such text) and come back.
TEST(BpeTokenizerSpTest, ArbitraryBytesRoundTrip) {
  const BpeTokenizer& tok = llama2();
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
  bytes += "\xC3\x28 \xE2\x82 \xF0\x9F\x8E\x89 \xED\xA0\x80 x";
  const std::vector<std::int32_t> ids = tok.encode(bytes);
  EXPECT_EQ(tok.decode(ids), bytes);
  EXPECT_EQ(tok.encode(std::string("\xFF")), (std::vector<std::int32_t>{tok.token_id(" "), 3 + 0xFF}));
  // A "\u2581" in the text is the space piece, so it decodes as a space (as in Hugging Face; the
  // fuzzer found it).
  EXPECT_EQ(tok.decode(tok.encode("a" + kSpace + "\x80" "b")), "a \x80" "b");
}

// A whole document is one BPE word (no pre-tokenizer): it must encode as its lines do, joined.
TEST(BpeTokenizerSpTest, AWholeDocumentEncodesAndRoundTrips) {
  const char* env = std::getenv("STRATUM_SHARED_DATA");
  const std::string data = env != nullptr && *env != '\0' ? env : STRATUM_SOURCE_DIR "/../shared/data";
  const std::string text = file_read_all(data + "/tinyshakespeare.txt");
  const BpeTokenizer& tok = llama2();
  const std::vector<std::int32_t> ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2);  // ~1000 pieces compress English well over 2x
  // Cut at lines and spaces, it gives the ids of the one-word encoding: pieces holding a newline
  // and a space after a letter that no merge makes turn the cutting off and change nothing else.
  Json json = llama2_json();
  json["model"]["vocab"]["\nQ"] = 1000;
  json["model"]["vocab"]["Q" + kSpace] = 1001;
  EXPECT_EQ(load_json(json).encode(text), ids);
  // A newline is a byte token that no merge touches, so a line's ids do not depend on the others.
  const std::size_t cut = text.find('\n', 5000);
  std::vector<std::int32_t> joined = tok.encode(text.substr(0, cut));
  std::vector<std::int32_t> rest = tok.encode(text.substr(cut));
  ASSERT_EQ(rest.at(0), tok.token_id(" "));  // the second half's prefix space
  joined.insert(joined.end(), rest.begin() + 1, rest.end());
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin(), ids.begin() + static_cast<long>(joined.size())), joined);
}

// Words are cut after each newline only where no piece holds one (Note [sentencepiece bpe]); a
// vocabulary with a "\n\n" piece must still merge across the line end.
TEST(BpeTokenizerSpTest, ANewlinePieceMergesAcrossLines) {
  const std::vector<std::int32_t> plain = llama2().encode("a\n\nb");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 3 + '\n'), 2) << Json(plain).dump();
  Json json = llama2_json();
  json["model"]["vocab"]["\n"] = 1000;
  json["model"]["vocab"]["\n\n"] = 1001;
  json["model"]["merges"].push_back("\n \n");
  const std::vector<std::int32_t> merged = load_json(json).encode("a\n\nb");
  EXPECT_EQ(std::count(merged.begin(), merged.end(), 1001), 1) << Json(merged).dump();
  EXPECT_EQ(load_json(json).decode(merged), "a\n\nb");
}

// Words are cut before a space only where no piece holds one after another character; a
// vocabulary whose first merge makes "e\u2581" must still merge across the word end.
TEST(BpeTokenizerSpTest, ASpaceAfterALetterInAPieceMergesAcrossWords) {
  const std::vector<std::int32_t> plain = llama2().encode("the cat");
  Json json = llama2_json();
  json["model"]["vocab"]["e" + kSpace] = 1000;
  json["model"]["merges"].insert(json["model"]["merges"].begin(), "e " + kSpace);
  const BpeTokenizer tok = load_json(json);
  const std::vector<std::int32_t> merged = tok.encode("the cat");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1000), 0) << Json(plain).dump();
  EXPECT_EQ(std::count(merged.begin(), merged.end(), 1000), 1) << Json(merged).dump();
  EXPECT_EQ(tok.decode(merged), "the cat");
}

using testing::MalformedCase;  // a malformed SentencePiece-style tokenizer.json

TEST(BpeTokenizerSpTest, MalformedFilesThrowOneLineErrors) {
  const std::vector<MalformedCase> cases = {
      {"no byte token", [](Json& j) { j["model"]["vocab"].erase("<0x41>"); },
       "ids must be unique and cover 0..998"},
      {"lowercase byte token",
       [](Json& j) {
         j["model"]["vocab"]["<0x4a>"] = j["model"]["vocab"]["<0x4A>"];
         j["model"]["vocab"].erase("<0x4A>");
       },
       "lacks the byte token \"<0x4A>\": model.byte_fallback needs all 256"},
      {"normalizer NFC", [](Json& j) { j["normalizer"] = {{"type", "NFC"}}; },
       "normalizer (NFC) is not supported; supported with byte fallback"},
      {"no Replace",
       [](Json& j) { j["normalizer"]["normalizers"].erase(1); },
       "the normalizer has no Replace"},
      {"Replace to another",
       [](Json& j) { j["normalizer"]["normalizers"][1]["content"] = "_"; },
       "normalizer.normalizers[1] (Replace) is not supported"},
      {"no normalizer nor pre-tokenizer", [](Json& j) { j["normalizer"] = nullptr; },
       "neither the normalizer nor the pre_tokenizer turns spaces into"},
      {"Metaspace after the normalizer",
       [](Json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSpace}}; },
       "pre_tokenizer Metaspace after a normalizer is not supported"},
      {"ByteLevel pre-tokenizer",
       [](Json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "ByteLevel"}};
       },
       "pre_tokenizer ByteLevel is not supported"},
      {"Metaspace replacement",
       [](Json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
       },
       "pre_tokenizer.replacement must be"},
      {"prepend_scheme",
       [](Json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "sometimes"}};
       },
       "prepend_scheme \"sometimes\" is unknown"},
      {"decoder Metaspace replacement",
       [](Json& j) { j["decoder"] = {{"type", "Metaspace"}, {"replacement", "_"}}; },
       "decoder.replacement must be"},
      {"decoder ByteLevel", [](Json& j) { j["decoder"] = {{"type", "ByteLevel"}}; },
       "the decoder is not a Sequence"},
      {"decoder without ByteFallback", [](Json& j) { j["decoder"]["decoders"].erase(1); },
       "decoder.decoders[1] (Fuse) is not supported there"},
      {"Strip of two", [](Json& j) { j["decoder"]["decoders"][3]["start"] = 2; },
       "decoder.decoders[3] (Strip) is not supported there"},
      {"merge of unknown pieces", [](Json& j) { j["model"]["merges"][0] = "xyzzy plugh"; },
       "names a symbol (or makes a token) that is not in model.vocab"},
      {"merges cut short", [](Json& j) { j["model"]["merges"] = Json::array({j["model"]["merges"][0]}); },
       "come from none of them"},
  };
  testing::expect_malformed_refused(llama2_json(), cases);
}

}  // namespace
}  // namespace stratum
