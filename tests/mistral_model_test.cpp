// Mistral (model_type "mistral", Note [mistral window]): its config.json reads as a Llama with
// the Mistral variant and sliding window and writes back the same; a Mistral directory holding
// the tiny Llama's weights trains and generates with the Llama's bits (the same architecture);
// sequences longer than the sliding window are refused with one line, generation stops at the
// window saying so, and a saved model stays a MistralForCausalLM with its window and resumes. Does not time
// anything.
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
  EXPECT_EQ(cfg.context(), 16);
  EXPECT_EQ(cfg.context_text(), "sliding_window=16");
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
  hf_config_write(tmp.file("open.json"), open);
  EXPECT_TRUE(Json::parse(file_read_all(tmp.file("open.json")))["sliding_window"].is_null());
  // A window beyond the context changes nothing.
  EXPECT_EQ(hf_config_read(mistral_dir(tmp, "wide", 4096) + "/config.json").context(), 64);

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

TEST(Mistral, TrainsAndGeneratesWithTheLlamasBitsWithinItsWindow) {
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

  // A checkpoint of it resumes to the bits of the run that did not stop.
  const std::string five = " --data " + kLlama + "/tokens.bin --batch 2 --seq 16 --steps 5 --quiet --threads 2";
  r = run_stratum("train --model " + mistral + five);
  const std::string hash5 = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + mistral + five + " --save-every 3 --save " + tmp.file("ckpt"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("train --resume " + tmp.file("ckpt") + "/step-00000003 --save " + tmp.file("ckpt2") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);

  // Longer than the window: refused, naming it.
  r = run_stratum("train --model " + mistral + " --data " + kLlama + "/tokens.bin --batch 2 --seq 17 --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("--seq 17 is longer than the model context sliding_window=16; use --seq <= 16"),
            std::string::npos)
      << r.errors;

  // Generation: the same greedy ids as the Llama, and it stops at the window.
  const std::string gen = " --prompt-ids 5,9,2 --temperature 0 --no-stop --output-ids";
  const auto llama = run_stratum("generate --model " + kLlama + gen + " --max-tokens 13");
  const auto same = run_stratum("generate --model " + mistral + gen + " --max-tokens 13");
  ASSERT_EQ(same.exit_code, 0) << same.errors;
  EXPECT_EQ(same.output, llama.output);
  const auto full = run_stratum("generate --model " + mistral + gen + " --max-tokens 40");
  ASSERT_EQ(full.exit_code, 0) << full.errors;
  EXPECT_EQ(full.output, llama.output);  // 3 + 13 = 16 tokens: the window
  EXPECT_NE(full.errors.find("prompt 1 stopped after 13 tokens: the context is full"), std::string::npos)
      << full.errors;
}

}  // namespace
}  // namespace stratum
