// Mistral (model_type "mistral", Note [mistral window]): its config.json reads as a Llama with
// the Mistral variant and sliding window in every layer and writes back the same; a Mistral
// directory holding the tiny Llama's weights trains and generates with the Llama's bits within its
// window and runs past it on the CPU to max_position_embeddings (where the window changes the
// numbers; PyTorch's: tests/golden/tiny_mistral in llama_model_test, trainer_test, generator_test
// and lora_train_test); a saved model stays a MistralForCausalLM with its window and resumes; on
// CUDA, which has no windowed attention, the context is the window. Does not time anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "core/file_util.h"
#include "integration_util.h"
#include "model/hf_config.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using Json = nlohmann::json;
using testing::run_stratum;
using testing::source_path;

const std::string kLlama = source_path("tests/golden/tiny_llama");

// The tiny Llama's weights under a Mistral config.json with `window` (null when 0).
std::string mistral_dir(const testing::TempDir& tmp, const std::string& name, int window) {
  const std::string dir = tmp.file(name);
  std::filesystem::copy(kLlama, dir);
  Json config = Json::parse(file_read_all(dir + "/config.json"));
  config["model_type"] = "mistral";
  config["architectures"] = Json::array({"MistralForCausalLM"});
  config.erase("attention_bias");
  config.erase("mlp_bias");
  config["sliding_window"] = window > 0 ? Json(window) : Json(nullptr);
  file_write_atomic(dir + "/config.json", config.dump(2));
  return dir;
}

TEST(Mistral, ConfigReadsAndWritesItsWindow) {
  testing::TempDir tmp;
  const std::string dir = mistral_dir(tmp, "m", 16);
  const GptConfig cfg = hf_config_read(dir + "/config.json");
  EXPECT_TRUE(cfg.llama());
  EXPECT_EQ(cfg.variant, LlamaVariant::Mistral);
  EXPECT_STREQ(cfg.family(), "mistral");
  EXPECT_EQ(cfg.sliding_window, 16);
  EXPECT_EQ(cfg.n_ctx, 64);
  EXPECT_EQ(cfg.context(), 64);  // the CPU's attention skips the keys before the window
  EXPECT_EQ(cfg.context_text(Backend::Cpu), "n_ctx=64");
  for (int l = 0; l < cfg.n_layer; ++l) {
    EXPECT_TRUE(cfg.layer_sliding_attention(l)) << l;
    EXPECT_EQ(cfg.layer_scores(l).window, 16) << l;
  }
  EXPECT_EQ(cfg.context(Backend::Cuda), 16);  // where the window cuts no key
  EXPECT_EQ(cfg.context_text(Backend::Cuda),
            "sliding_window=16 (the cuda attention has no sliding window; --backend cpu runs n_ctx=64)");
  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["model_type"], "mistral");
  EXPECT_EQ(written["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(written["sliding_window"], 16);
  EXPECT_EQ(written["max_position_embeddings"], 64);
  EXPECT_FALSE(written.contains("attention_bias"));
  const GptConfig again = hf_config_read(tmp.file("out.json"));
  EXPECT_EQ(again.describe(), cfg.describe());
  EXPECT_NE(cfg.describe().find("mistral"), std::string::npos) << cfg.describe();

  // No window (Mistral 7B v0.2 and later): the whole max_position_embeddings, written as null.
  const GptConfig open = hf_config_read(mistral_dir(tmp, "open", 0) + "/config.json");
  EXPECT_EQ(open.sliding_window, 0);
  EXPECT_EQ(open.context(), 64);
  EXPECT_EQ(open.context(Backend::Cuda), 64);
  EXPECT_FALSE(open.layer_sliding_attention(0));
  EXPECT_EQ(open.layer_scores(0).window, 0);
  hf_config_write(tmp.file("open.json"), open);
  EXPECT_TRUE(Json::parse(file_read_all(tmp.file("open.json")))["sliding_window"].is_null());
  // A window beyond the context changes nothing.
  EXPECT_EQ(hf_config_read(mistral_dir(tmp, "wide", 4096) + "/config.json").context(Backend::Cuda), 64);

  const std::string bad = mistral_dir(tmp, "bad", 0);
  file_write_atomic(bad + "/config.json",
                    std::regex_replace(file_read_all(bad + "/config.json"), std::regex("\"sliding_window\": null"),
                                       "\"sliding_window\": 0"));
  try {
    hf_config_read(bad + "/config.json");
    ADD_FAILURE() << "sliding_window 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window must be >= 1 or null"), std::string::npos) << e.what();
  }
}

TEST(Mistral, TrainsAndGeneratesWithTheLlamasBitsWithinItsWindowAndRunsPastIt) {
  testing::TempDir tmp;
  const std::string mistral = mistral_dir(tmp, "m", 16);
  const std::string train = " --data " + kLlama + "/tokens.bin --batch 2 --seq 16 --steps 3 --quiet --threads 2";
  auto r = run_stratum("train --model " + kLlama + train);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + mistral + train + " --save " + tmp.file("saved"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash);
  const Json saved = Json::parse(file_read_all(tmp.file("saved") + "/step-00000003/config.json"));
  EXPECT_EQ(saved["model_type"], "mistral");
  EXPECT_EQ(saved["sliding_window"], 16);

  // Past the window: it runs, and the window changes the numbers; a checkpoint of it resumes to
  // the bits of the run that did not stop, streamed or not.
  const std::string past = " --data " + kLlama + "/tokens.bin --batch 2 --seq 40 --steps 5 --quiet --threads 2";
  r = run_stratum("train --model " + kLlama + past);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string llama40 = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + mistral + past);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash5 = testing::params_hash_of(r.errors);
  EXPECT_NE(hash5, llama40) << "a window of 16 keys over 40 positions must change the model";
  r = run_stratum("train --model " + mistral + past + " --save-every 3 --save " + tmp.file("ckpt") +
                  " --mem-budget 1500K --offload-dir " + tmp.path());
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5) << "streaming must not change a bit";
  r = run_stratum("train --resume " + tmp.file("ckpt") + "/step-00000003 --save " + tmp.file("ckpt2") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);

  // Past n_ctx: refused, naming it.
  r = run_stratum("train --model " + mistral + " --data " + kLlama + "/tokens.bin --batch 2 --seq 65 --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("--seq 65 is longer than the model context n_ctx=64; use --seq <= 64"), std::string::npos)
      << r.errors;

  // Generation: the Llama's greedy ids while the sequence fits the window, then the window's own.
  const std::string gen = " --prompt-ids 5,9,2 --temperature 0 --no-stop --output-ids";
  const auto llama = run_stratum("generate --model " + kLlama + gen + " --max-tokens 13");
  const auto same = run_stratum("generate --model " + mistral + gen + " --max-tokens 13");
  ASSERT_EQ(same.exit_code, 0) << same.errors;
  EXPECT_EQ(same.output, llama.output);
  const auto llama40g = run_stratum("generate --model " + kLlama + gen + " --max-tokens 40");
  const auto full = run_stratum("generate --model " + mistral + gen + " --max-tokens 40");
  ASSERT_EQ(full.exit_code, 0) << full.errors;
  ASSERT_GT(full.output.size(), llama.output.size());
  EXPECT_EQ(full.output.substr(0, llama.output.size() - 1), llama.output.substr(0, llama.output.size() - 1));
  EXPECT_NE(full.output, llama40g.output) << "40 tokens past a window of 16 must differ from full attention";
  EXPECT_EQ(full.errors.find("the context is full"), std::string::npos) << full.errors;
}

}  // namespace
}  // namespace stratum
