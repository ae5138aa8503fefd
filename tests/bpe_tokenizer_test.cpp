// Tests for BpeTokenizer: the golden table made by gpt-3-encoder (tools/make_bpe_golden.sh)
// must match exactly and round-trip, Hugging Face file names load, invalid UTF-8 round-trips,
// and malformed tokenizer files fail with one-line "[tokenizer]" errors.
// Does not time anything (benchmarks live in bench/).
#include "data/bpe_tokenizer.h"
#include "integration_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/file_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

std::string shared_data_dir() {
  const char* env = std::getenv("STRATUM_SHARED_DATA");
  return env != nullptr && *env != '\0' ? std::string(env)
                                        : std::string(STRATUM_SOURCE_DIR "/../shared/data");
}

// The GPT-2 tokenizer, loaded once for the whole test binary.
const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = BpeTokenizer::load(shared_data_dir());
  return tok;
}

using testing::TempDir;

TEST(BpeTokenizerTest, VocabularyFacts) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_id(), 50256);
  EXPECT_EQ(gpt2().decode_token(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2().decode_token(198), "\n");
  EXPECT_EQ(gpt2().decode_token(220), " ");
  EXPECT_EQ(gpt2().decode_token(0), "!");
}

TEST(BpeTokenizerTest, GoldenTableMatchesGpt3EncoderAndRoundTrips) {
  const std::string path = STRATUM_SOURCE_DIR "/tests/golden/bpe_golden.json";
  const nlohmann::json table = nlohmann::json::parse(file_read_all(path));
  ASSERT_TRUE(table.is_array());
  ASSERT_GE(table.size(), 50u) << "golden table looks truncated: run tools/make_bpe_golden.sh";
  for (const auto& golden_case : table) {
    const std::string text = golden_case.at("text").get<std::string>();
    const auto expected = golden_case.at("ids").get<std::vector<std::int32_t>>();
    const std::vector<std::int32_t> ids = gpt2().encode(text);
    EXPECT_EQ(ids, expected) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(gpt2().decode(ids), text) << "text: " << nlohmann::json(text).dump();
  }
}

TEST(BpeTokenizerTest, EndOfTextInTextIsOrdinaryText) {
  const std::vector<std::int32_t> ids = gpt2().encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  for (const std::int32_t id : ids) EXPECT_NE(id, gpt2().eot_id());
}

TEST(BpeTokenizerTest, WholeShakespeareRoundTrips) {
  const std::string text = file_read_all(shared_data_dir() + "/tinyshakespeare.txt");
  const std::vector<std::int32_t> ids = gpt2().encode(text);
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(gpt2().decode(ids), text);
  // The per-call cache must not change results: cut before a " word" (always a pre-token
  // boundary after a letter), the two halves, each with a fresh cache, encode like the whole.
  std::size_t cut = text.size() / 2;
  while (!(text[cut] == ' ' && std::isalpha(static_cast<unsigned char>(text[cut - 1])) &&
           std::isalpha(static_cast<unsigned char>(text[cut + 1])))) {
    ++cut;
  }
  std::vector<std::int32_t> halves = gpt2().encode(std::string_view(text).substr(0, cut));
  const std::vector<std::int32_t> tail = gpt2().encode(std::string_view(text).substr(cut));
  halves.insert(halves.end(), tail.begin(), tail.end());
  EXPECT_EQ(halves, ids);
}

TEST(BpeTokenizerTest, ConcurrentEncodesAgree) {
  const std::string text =
      file_read_all(shared_data_dir() + "/tinyshakespeare.txt").substr(0, 200000);
  const std::vector<std::int32_t> expected = gpt2().encode(text);
  std::vector<std::vector<std::int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&text, &result] { result = gpt2().encode(text); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(BpeTokenizerTest, InvalidUtf8IsDeterministicAndRoundTrips) {
  const std::vector<std::string> inputs = {
      std::string("\xff"),
      std::string("abc\xff\xfe def"),
      std::string("caf\xc3"),  // truncated 2-byte sequence at the end
      std::string("\x80\x80 lone continuation bytes"),
      std::string("\xc0\xaf overlong slash"),
      std::string("\xed\xa0\x80 encoded surrogate"),
      std::string("\xf4\x90\x80\x80 above U+10FFFF"),
      std::string(" \xe6\x97 truncated CJK \xe6\x97\xa5 then valid"),
      std::string("nul\0inside", 10),
  };
  for (const std::string& text : inputs) {
    const std::vector<std::int32_t> ids = gpt2().encode(text);
    EXPECT_EQ(gpt2().encode(text), ids);
    EXPECT_EQ(gpt2().decode(ids), text);
  }
  std::mt19937 rng(12345);  // fixed seed: random byte strings, mostly invalid UTF-8
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 8 == 0 ? ' ' : rng() & 0xFF);
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << "trial " << trial;
  }
  // Valid text around an invalid byte is split as if the byte were a separator.
  std::vector<std::int32_t> expected = gpt2().encode("abc");
  const std::vector<std::int32_t> ff = gpt2().encode("\xff");
  const std::vector<std::int32_t> def = gpt2().encode(" def");
  expected.insert(expected.end(), ff.begin(), ff.end());
  expected.insert(expected.end(), def.begin(), def.end());
  EXPECT_EQ(gpt2().encode("abc\xff def"), expected);
}

TEST(BpeTokenizerTest, HuggingFaceFileNamesLoadTheSameTokenizer) {
  TempDir dir;
  std::filesystem::copy_file(shared_data_dir() + "/encoder.json", dir.path() + "/vocab.json");
  std::filesystem::copy_file(shared_data_dir() + "/vocab.bpe", dir.path() + "/merges.txt");
  const BpeTokenizer hf = BpeTokenizer::load(dir.path());
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.eot_id(), 50256);
  for (const char* text : {"Hello world", "It's 2024!\n\tcaf\xc3\xa9 \xf0\x9f\x98\x80", ""}) {
    EXPECT_EQ(hf.encode(text), gpt2().encode(text)) << text;
  }
}

TEST(BpeTokenizerTest, DecodeRejectsOutOfRangeIds) {
  for (const std::int32_t id : {-1, 50257, 1 << 30}) {
    try {
      gpt2().decode_token(id);
      ADD_FAILURE() << "decode_token(" << id << ") did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[tokenizer]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(gpt2().decode({15496, id}), Error);
  }
}

// One malformed tokenizer folder: `setup` writes its files (copying the real GPT-2 ones where
// needed) and the error message must contain `message_fragment`.
struct MalformedCase {
  const char* name;
  std::function<void(const TempDir&)> setup;
  const char* message_fragment;
};

void copy_real(const TempDir& dir, const char* from, const char* to) {
  std::filesystem::copy_file(shared_data_dir() + "/" + from, dir.path() + "/" + to);
}

TEST(BpeTokenizerTest, MalformedFilesThrowTokenizerErrors) {
  const std::string merges_header = "#version: 0.2\n";
  const std::vector<MalformedCase> cases = {
      {"empty folder", [](const TempDir&) {}, "none of tokenizer.json, encoder.json, vocab.json"},
      {"vocab.bpe missing", [](const TempDir& d) { copy_real(d, "encoder.json", "encoder.json"); },
       "vocab.bpe"},
      {"merges.txt missing", [](const TempDir& d) { copy_real(d, "encoder.json", "vocab.json"); },
       "merges.txt"},
      {"invalid JSON",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"a\": 0,");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "not valid JSON"},
      {"JSON array instead of object",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "[\"a\", \"b\"]");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "JSON object"},
      {"string id",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"a\": \"0\"}");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "expected an integer id"},
      {"negative id",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"a\": -1}");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "ids must be unique"},
      {"duplicate id",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"a\": 0, \"b\": 0}");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "ids must be unique"},
      {"missing byte tokens",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"a\": 0, \"b\": 1}");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "single-byte token"},
      {"key outside the byte alphabet",
       [&](const TempDir& d) {
         file_write_atomic(d.file("encoder.json"), "{\"\\u4e2d\": 0}");
         file_write_atomic(d.file("vocab.bpe"), merges_header);
       },
       "byte-to-unicode alphabet"},
      {"merges line with three symbols",
       [&](const TempDir& d) {
         copy_real(d, "encoder.json", "encoder.json");
         file_write_atomic(d.file("vocab.bpe"), merges_header + "\xc4\xa0 t\nh e x\n");
       },
       "line 3"},
      {"merges line with one symbol",
       [&](const TempDir& d) {
         copy_real(d, "encoder.json", "encoder.json");
         file_write_atomic(d.file("vocab.bpe"), merges_header + "he\n");
       },
       "bad merges line"},
      {"merge naming an unknown symbol",
       [&](const TempDir& d) {
         copy_real(d, "encoder.json", "encoder.json");
         file_write_atomic(d.file("vocab.bpe"), merges_header + "\xc4\xa0 t\nzqxj vwkp\n");
       },
       "not in"},
  };
  for (const MalformedCase& c : cases) {
    TempDir dir;
    c.setup(dir);
    try {
      BpeTokenizer::load(dir.path());
      ADD_FAILURE() << c.name << ": load did not throw";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("[tokenizer] ", 0), 0u) << c.name << ": " << message;
      EXPECT_NE(message.find(c.message_fragment), std::string::npos) << c.name << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << c.name << ": " << message;
    }
  }
  try {
    BpeTokenizer::load("/nonexistent/stratum/tokenizer");
    ADD_FAILURE() << "missing folder: load did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[tokenizer]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stratum
