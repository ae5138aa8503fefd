// The user path with a SentencePiece-style tokenizer.json (Llama 2's layout, Note [sentencepiece
// bpe]): prepare writes the ids the tokenizer gives, a small Llama trains on them from the token
// file and from the text alike, info names the tokenizer, the saved model carries it, and a text
// prompt generates as its ids after the tokenizer's BOS do (as Hugging Face's tokenizer(text)
// gives them). Does not time anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "data/token_file.h"
#include "integration_util.h"

namespace stratum {
namespace {

using testing::run_stratum;
using testing::shared_data;
using testing::source_path;

TEST(Cli, SentencePieceTokenizerPreparesTrainsAndGenerates) {
  testing::TempDir tmp;
  const std::string tok = tmp.file("tok");
  std::filesystem::create_directory(tok);
  std::filesystem::copy_file(source_path("tests/golden/tokenizer_json/llama2_style/tokenizer.json"),
                             tok + "/tokenizer.json");
  const std::string text = file_read_all(shared_data("tinyshakespeare.txt")).substr(0, 20000);
  {
    std::ofstream out(tmp.file("corpus.txt"), std::ios::binary);
    out << text;
  }
  auto r = run_stratum("prepare --input " + tmp.file("corpus.txt") + " --tokenizer " + tok + " --out " +
                       tmp.file("train.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const BpeTokenizer tokenizer = BpeTokenizer::load(tok);
  const std::vector<std::int32_t> want = tokenizer.encode(text);
  EXPECT_EQ(token_file_read(tmp.file("train.bin")).tokens, want);

  const std::string model = " --arch llama --vocab 1000 --layers 1 --heads 2 --embd 32 --ctx 64 --batch 2 --seq 32"
                            " --steps 4 --quiet --threads 2";
  r = run_stratum("train" + model + " --data " + tmp.file("train.bin") + " --save " + tmp.file("model") +
                  " --tokenizer " + tok);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = testing::params_hash_of(r.errors);
  ASSERT_EQ(hash.size(), 16u);
  r = run_stratum("train" + model + " --data " + tmp.file("corpus.txt") + " --tokenizer " + tok);
  EXPECT_EQ(testing::params_hash_of(r.errors), hash) << r.errors;

  r = run_stratum("info " + tmp.file("model"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("tokenizer: tokenizer.json, SentencePiece-style BPE with byte fallback, 1000 tokens"),
            std::string::npos)
      << r.output;

  // A text prompt is the tokenizer's BOS (<s>, id 1) and then the prompt's pieces.
  const std::string gen = "generate --model " + tmp.file("model") + " --temperature 0 --max-tokens 8 --no-stop";
  const auto by_text = run_stratum(gen + " --prompt 'ROMEO:' --output-ids");
  ASSERT_EQ(by_text.exit_code, 0) << by_text.errors;
  std::string ids = "1";
  for (const std::int32_t id : tokenizer.encode("ROMEO:")) ids += "," + std::to_string(id);
  const auto by_ids = run_stratum(gen + " --prompt-ids " + ids + " --output-ids");
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.errors;
  EXPECT_EQ(by_text.output, by_ids.output);
  const auto streamed = run_stratum(gen + " --prompt 'ROMEO:'");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.errors;
  EXPECT_EQ(streamed.output.rfind("ROMEO:", 0), 0u) << streamed.output;
  EXPECT_GT(streamed.output.size(), std::string("ROMEO:\n").size());
}

}  // namespace
}  // namespace stratum
