// Note [generation config] (model/hf_config.h): a model directory's generation_config.json gives
// `stratum generate` the sampling values its flags do not (do_sample false: greedy) and more stop
// tokens, and saves (checkpoints, merge) carry it. The reader's values and one-line refusals; the
// CLI against explicit flags on a directory without the file (same seed, same ids). Does not time
// anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "integration_util.h"
#include "infer/generator.h"
#include "model/hf_config.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using Json = nlohmann::json;
using testing::run_stratum;
using testing::source_path;

const std::string kLlama = source_path("tests/golden/tiny_llama");

// The tiny Llama's model files (no references) in tmp/name, with generation_config.json `gen`
// unless it is null.
std::string model_dir(const testing::TempDir& tmp, const std::string& name, const Json& gen) {
  const std::string dir = tmp.file(name);
  std::filesystem::create_directory(dir);
  for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json"})
    std::filesystem::copy_file(kLlama + "/" + f, dir + "/" + f);
  if (!gen.is_null()) file_write_atomic(dir + "/generation_config.json", gen.dump(2));
  return dir;
}

std::vector<std::int32_t> ids_of(const std::string& output) {
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  while (at < output.size() && output[at] >= '0' && output[at] <= '9') {
    std::size_t used = 0;
    ids.push_back(std::stoi(output.substr(at), &used));
    at += used;
    if (at < output.size() && output[at] == ',') ++at;
  }
  return ids;
}

TEST(GenerationConfig, ReadsWhatGenerateUsesWithTransformersDefaults) {
  testing::TempDir tmp;
  const std::string path = tmp.file("generation_config.json");
  EXPECT_FALSE(hf_generation_config_read(path).present);
  file_write_atomic(path, R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                              "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                              "transformers_version": "4.51.0"})");
  HfGenerationConfig g = hf_generation_config_read(path);
  EXPECT_TRUE(g.present);
  EXPECT_TRUE(g.do_sample);
  EXPECT_DOUBLE_EQ(g.temperature, 0.6);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_DOUBLE_EQ(g.top_p, 0.95);
  EXPECT_EQ(g.eos_token_ids, (std::vector<std::int32_t>{151645, 151643}));
  file_write_atomic(path, R"({"eos_token_id": 2, "temperature": null})");
  g = hf_generation_config_read(path);
  EXPECT_FALSE(g.do_sample);
  EXPECT_DOUBLE_EQ(g.temperature, 1.0);
  EXPECT_EQ(g.top_k, 50) << "transformers' GenerationConfig default";
  EXPECT_EQ(g.eos_token_ids, std::vector<std::int32_t>{2});
  EXPECT_DOUBLE_EQ(g.repetition_penalty, 1.0);
  file_write_atomic(path, R"({"do_sample": true, "repetition_penalty": 1.05, "temperature": 0.7})");  // Qwen2.5's
  EXPECT_DOUBLE_EQ(hf_generation_config_read(path).repetition_penalty, 1.05);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1]", "must be a JSON object"},
      {"{\"do_sample\": 1}", "'do_sample' must be true or false"},
      {"{\"top_p\": 1.5}", "'top_p' must be in (0, 1]"},
      {"{\"top_p\": 0}", "'top_p' must be in (0, 1]"},
      {"{\"top_k\": -1}", "'top_k' must be >= 0"},
      {"{\"temperature\": -0.5}", "'temperature' must be a finite number >= 0"},
      {"{\"temperature\": \"hot\"}", "temperature"},
      {"{\"eos_token_id\": \"</s>\"}", "'eos_token_id' must hold token ids"},
      {"{\"repetition_penalty\": 0}", "'repetition_penalty' must be a finite number > 0"},
      {"{\"top_k\": 20", "not valid JSON"},
  };
  for (const auto& [text, fragment] : bad) {
    file_write_atomic(path, text);
    try {
      hf_generation_config_read(path);
      ADD_FAILURE() << text << ": read";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(fragment), std::string::npos) << text << ": " << message;
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

// transformers' RepetitionPenaltyLogitsProcessor: each id of the sequence once, positive logits
// divided, negative (and zero) multiplied, in fp32 with the penalty rounded to float.
TEST(GenerationConfig, RepetitionPenaltyIsTransformers) {
  const std::vector<float> logits = {2.0f, 4.0f, -2.0f, -6.0f, 1.0f, 0.0f};
  const std::vector<std::int32_t> ids = {1, 3, 3, 1, 5};
  std::vector<float> out(logits.size());
  repetition_penalize(out.data(), logits.data(), 6, ids.data(), ids.size(), 2.0);
  EXPECT_EQ(out, (std::vector<float>{2.0f, 2.0f, -2.0f, -12.0f, 1.0f, 0.0f}));
  const std::vector<float> qwen = {3.0f, -3.0f};
  const std::vector<std::int32_t> both = {0, 1};
  std::vector<float> qwen_out(2);
  repetition_penalize(qwen_out.data(), qwen.data(), 2, both.data(), both.size(), 1.05);
  EXPECT_EQ(qwen_out[0], 3.0f / 1.05f);
  EXPECT_EQ(qwen_out[1], -3.0f * 1.05f);
}

TEST(GenerationConfig, GenerateSamplesAndStopsAsTheFileSaysUnlessAFlagSaysOtherwise) {
  testing::TempDir tmp;
  const std::string plain = model_dir(tmp, "plain", nullptr);
  const std::string gen = " --prompt-ids 1,5,9,17,33 --max-tokens 12 --output-ids --seed 7";
  auto run = [&](const std::string& dir, const std::string& flags) {
    const auto r = run_stratum("generate --model " + dir + gen + flags);
    EXPECT_EQ(r.exit_code, 0) << r.errors;
    return r;
  };
  const auto greedy = run(plain, " --temperature 0");
  const auto sampled = run(plain, " --temperature 0.7 --top-k 5 --top-p 0.9");
  ASSERT_FALSE(ids_of(greedy.output).empty());
  EXPECT_NE(greedy.output, sampled.output) << "the sampled run must differ from greedy for this check to mean anything";

  // do_sample false (or absent): greedy, said once.
  const std::string off = model_dir(tmp, "off", Json{{"do_sample", false}, {"temperature", 0.7}});
  auto r = run(off, "");
  EXPECT_EQ(r.output, greedy.output);
  EXPECT_NE(r.errors.find("greedy decoding (generation_config.json: do_sample false"), std::string::npos) << r.errors;
  // do_sample true: its temperature, top_k and top_p; a flag overrides its own value.
  const std::string on =
      model_dir(tmp, "on", Json{{"do_sample", true}, {"temperature", 0.7}, {"top_k", 5}, {"top_p", 0.9}});
  r = run(on, "");
  EXPECT_EQ(r.output, sampled.output);
  EXPECT_NE(r.errors.find("sampling at temperature 0.7, top-k 5, top-p 0.9"), std::string::npos) << r.errors;
  EXPECT_EQ(run(on, " --temperature 0").output, greedy.output);
  EXPECT_EQ(run(on, " --top-k 0").output, run(plain, " --temperature 0.7 --top-k 0 --top-p 0.9").output);
  EXPECT_EQ(run(on, " --quiet").errors.find("generation_config"), std::string::npos);
  EXPECT_NE(run_stratum("info " + on).output.find("generation: generation_config.json samples at temperature 0.7, "
                                                 "top-k 5, top-p 0.9"), std::string::npos);
  EXPECT_NE(run_stratum("info " + off).output.find("generation: generation_config.json decodes greedily"),
            std::string::npos);

  // Note [repetition penalty]: greedy decoding too; 1 changes nothing; the file's unless the flag's.
  const auto penalized = run(plain, " --temperature 0 --repetition-penalty 3");
  EXPECT_NE(penalized.output, greedy.output) << "the penalty must change this greedy run for the check to mean anything";
  EXPECT_EQ(run(plain, " --temperature 0 --repetition-penalty 1").output, greedy.output);
  const std::string rep = model_dir(tmp, "rep", Json{{"do_sample", false}, {"repetition_penalty", 3}});
  r = run(rep, "");
  EXPECT_EQ(r.output, penalized.output);
  EXPECT_NE(r.errors.find("greedy decoding, repetition penalty 3 (generation_config.json"), std::string::npos)
      << r.errors;
  EXPECT_EQ(run(rep, " --repetition-penalty 1").output, greedy.output);
  EXPECT_NE(run_stratum("info " + rep).output.find("decodes greedily, repetition penalty 3"), std::string::npos);
  r = run_stratum("generate --model " + plain + gen + " --repetition-penalty 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("--repetition-penalty must be > 0"), std::string::npos) << r.errors;

  // Its eos_token_id stops generation too: the greedy ids up to the first one that is its stop id.
  const std::vector<std::int32_t> all = ids_of(greedy.output);
  const std::int32_t stop = all[all.size() / 2];
  const std::string eos = model_dir(tmp, "eos", Json{{"eos_token_id", Json::array({stop})}});
  const std::vector<std::int32_t> stopped = ids_of(run(eos, "").output);
  ASSERT_LT(stopped.size(), all.size());
  EXPECT_TRUE(std::equal(stopped.begin(), stopped.end(), all.begin()));
  EXPECT_EQ(ids_of(run(eos, " --no-stop").output), all);

  // A malformed file: one line naming it, nothing generated.
  const std::string bad = model_dir(tmp, "bad", Json{{"top_p", 2}});
  r = run_stratum("generate --model " + bad + gen);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find(bad + "/generation_config.json': field 'top_p' must be in (0, 1]"), std::string::npos)
      << r.errors;
  EXPECT_TRUE(r.output.empty()) << r.output;
}

// Checkpoints (full and LoRA) and a merged model carry the source model's file; `verify` accepts
// the checkpoint, and generating from it samples as from its source.
TEST(GenerationConfig, SavesCarryTheSourceModelsFile) {
  testing::TempDir tmp;
  const Json g{{"do_sample", true}, {"temperature", 0.7}, {"top_k", 5}, {"top_p", 0.9}, {"eos_token_id", 2}};
  const std::string src = model_dir(tmp, "src", g);
  const std::string data = " --data " + kLlama + "/tokens.bin --batch 2 --seq 16 --quiet --threads 2";
  auto r = run_stratum("train --model " + src + data + " --steps 2 --save-every 1 --save " + tmp.file("full"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string step = tmp.file("full/step-00000001");
  EXPECT_EQ(file_read_all(step + "/generation_config.json"), file_read_all(src + "/generation_config.json"));
  r = run_stratum("verify " + tmp.file("full"));
  EXPECT_EQ(r.exit_code, 0) << r.errors << r.output;
  r = run_stratum("generate --model " + step + " --prompt-ids 1,5,9 --max-tokens 4 --output-ids");
  EXPECT_NE(r.errors.find("sampling at temperature 0.7, top-k 5, top-p 0.9"), std::string::npos) << r.errors;
  // Resumed, the checkpoint is the source.
  r = run_stratum("train --resume " + step + " --save " + tmp.file("again") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(file_read_all(tmp.file("again/step-00000002/generation_config.json")),
            file_read_all(src + "/generation_config.json"));
  r = run_stratum("train --model " + src + data + " --steps 1 --lora-r 2 --save " + tmp.file("lora"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_TRUE(file_exists(tmp.file("lora/step-00000001/generation_config.json")));
  r = run_stratum("merge --model " + src + " --adapter " + tmp.file("lora") + " --out " + tmp.file("merged"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(file_read_all(tmp.file("merged/generation_config.json")), file_read_all(src + "/generation_config.json"));
}

}  // namespace
}  // namespace stratum
