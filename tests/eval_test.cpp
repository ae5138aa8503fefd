// `stratum eval` (Note [evaluate only] in train/trainer.h): a model's mean loss over a data file
// equals PyTorch's on the golden tiny GPT-2, and is the validation loss training reports for the
// same weights (full and LoRA); a loss mask counts only its targets; a budget streams it to the
// same number; bad uses are refused with one line. Does not time anything.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "integration_util.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::run_stratum;
using testing::source_path;
using testing::TempDir;

// The loss `stratum eval` printed on stdout ("... loss X, perplexity ..."), or NaN.
double eval_loss(const testing::CommandResult& r) {
  const std::size_t at = r.output.find(": loss ");
  return at == std::string::npos ? std::nan("") : std::stod(r.output.substr(at + 7));
}

std::string eval_targets(const testing::CommandResult& r) {
  const std::size_t end = r.output.find(" targets)");
  const std::size_t begin = r.output.rfind('(', end);
  return end == std::string::npos || begin == std::string::npos ? "" : r.output.substr(begin + 1, end - begin - 1);
}

// The golden model's first batch: PyTorch's mean cross-entropy (tools/make_golden.py).
TEST(Eval, FirstBatchLossIsPyTorchs) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  const auto r = run_stratum("eval --model " + dir + " --data " + dir + "/tokens.bin --batch 4 --seq 32 --batches 1 "
                             "--threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  EXPECT_NEAR(eval_loss(r), golden_f32(ref, "loss")[0], 2e-6) << r.output;
  EXPECT_EQ(eval_targets(r), "128") << r.output;
  EXPECT_NE(r.output.find("perplexity "), std::string::npos) << r.output;
}

// Training's validation loss of its final weights (full, and LoRA over the golden base), read
// from the log, is what eval gives the saved checkpoint over the same batches; on a masked shard
// it counts the targets alone, and under a budget that streams the weights it is the same number.
TEST(Eval, IsTrainingsValidationLossOfTheSameWeights) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  const std::string data = dir + "/tokens_masked.bin";
  TempDir tmp;
  for (const std::string lora : {"", " --lora-r 4"}) {
    SCOPED_TRACE(lora.empty() ? "full" : "lora");
    const std::string save = tmp.file(lora.empty() ? "full" : "lora");
    const auto train = run_stratum("train --model " + dir + " --data " + dir + "/tokens.bin --val-data " + data +
                                   " --batch 4 --seq 32 --steps 3 --eval-every 3 --eval-batches 5 --threads 2 --quiet "
                                   "--log " + tmp.file("log.jsonl") + " --save " + save + lora);
    ASSERT_EQ(train.exit_code, 0) << train.errors;
    const auto log = testing::read_jsonl(tmp.file("log.jsonl"));
    ASSERT_FALSE(log.empty());
    const double val = log.back()["val_loss"].get<double>();
    const std::string model = lora.empty() ? "--model " + save : "--model " + dir + " --adapter " + save;
    const std::string args = "eval " + model + " --data " + data + " --batch 4 --seq 32 --batches 5 --threads 2";
    const auto ram = run_stratum(args);
    ASSERT_EQ(ram.exit_code, 0) << ram.errors;
    EXPECT_NEAR(eval_loss(ram), val, 5e-7 * val) << ram.output;
    const std::string targets = eval_targets(ram);
    EXPECT_GT(std::stoi(targets), 0);
    EXPECT_LT(std::stoi(targets), 5 * 128) << "a masked shard counts its targets alone";
    if (!lora.empty()) {
      EXPECT_NE(ram.output.find(" + " + save), std::string::npos) << ram.output;
    }
    const auto streamed = run_stratum(args + " --mem-budget 400K --offload-dir " + tmp.path());
    ASSERT_EQ(streamed.exit_code, 0) << streamed.errors;
    EXPECT_EQ(eval_loss(streamed), eval_loss(ram)) << streamed.output;
    EXPECT_NE(streamed.errors.find("tier traffic: read"), std::string::npos) << streamed.errors;
    EXPECT_EQ(streamed.errors.find("read 0 bytes"), std::string::npos) << "the budget must stream: " << streamed.errors;
  }
}

TEST(Eval, BadUsesAreRefusedWithOneLine) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--data " + dir + "/tokens.bin", "--model DIR is required for 'stratum eval'"},
      {"--model " + dir, "--data FILE is required"},
      {"--model " + dir + " --data " + dir + "/tokens.bin --batches 0", "--batches"},
      {"--model " + dir + " --data " + dir + "/tokens.bin --steps 3", "--steps"},
      {"--model " + dir + " --data " + dir + "/tokens.bin --seq 65", "longer than the model context"},
      {"--model " + dir + " --data " + dir + "/tokens.bin --mem-budget 1M", "--mem-budget needs --offload-dir"},
      {"--model " + dir + " --data " + tmp.file("none.bin"), "none.bin"},
      {"--model " + tmp.path() + " --data " + dir + "/tokens.bin", "config.json"},
  };
  for (const auto& [flags, fragment] : cases) {
    const auto r = run_stratum("eval " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.errors.find(fragment), std::string::npos) << flags << ": " << r.errors;
    EXPECT_TRUE(r.output.empty()) << flags << ": " << r.output;
  }
}

}  // namespace
}  // namespace stratum
