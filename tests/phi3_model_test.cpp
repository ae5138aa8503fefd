// Phi-3 and Phi-4 (model_type "phi3", Note [phi3 fused] in model/model_config.h): its config.json
// reads as a Llama with the Phi-3 variant and writes back the same; a Phi-3 directory holding a
// tiny Llama's weights fused (q, k, v in qkv_proj; gate, up in gate_up_proj) trains, streams,
// resumes and generates with that Llama's bits (the same math), its checkpoints hold the fused
// tensors with the trained Llama's values; past its sliding window it runs with a Mistral's bits
// (the same window in every layer, Note [mistral window]); what Stratum does not run (sequences
// past longrope's original context) is refused with one line. Phi-4-mini's partial
// rotary factor (Note [partial rotary]) reads and writes back: tests/golden/tiny_phi4mini.
// Phi-3.5's longrope (Note [longrope]) reads, caps generation at its original context, computes
// the attention factor as transformers does and writes both factor lists back; PyTorch's numbers:
// tests/golden/tiny_phi35 (short factors) and tiny_phi35_long (long ones, past the original
// context). PyTorch's numbers, LoRA on
// the fused modules among them: tests/golden/tiny_phi3 in llama_model_test, trainer_test,
// generator_test and lora_train_test. Does not time anything.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "formats/safetensors.h"
#include "integration_util.h"
#include "model/hf_config.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using Json = nlohmann::json;
using testing::run_stratum;
using testing::source_path;

const std::string kLlama = source_path("tests/golden/tiny_llama");

using Tensors = std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>;

// Every tensor of the directory's model files (model.safetensors or its shards), as F32.
Tensors tensors_read(const std::string& dir) {
  Tensors out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file_name = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors" || file_name.rfind("model", 0) != 0) continue;
    const SafetensorsFile file = SafetensorsFile::open(entry.path().string());
    for (const auto& t : file.tensors()) {
      std::vector<float> values(static_cast<std::size_t>(t.numel()));
      file.read_f32(t, values.data());
      out[t.name] = {t.shape, std::move(values)};
    }
  }
  return out;
}

void tensors_write(const std::string& path, const Tensors& tensors) {
  std::vector<SafetensorsWriteEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, DType::F32, t.first, t.second.data()});
  safetensors_write(path, entries, {{"format", "pt"}});
}

// Rows of the named tensors, one after another (a fused tensor from its parts).
std::pair<std::vector<std::int64_t>, std::vector<float>> rows_joined(const Tensors& t,
                                                                    const std::vector<std::string>& names) {
  std::pair<std::vector<std::int64_t>, std::vector<float>> out{{0, t.at(names[0]).first[1]}, {}};
  for (const std::string& n : names) {
    out.first[0] += t.at(n).first[0];
    out.second.insert(out.second.end(), t.at(n).second.begin(), t.at(n).second.end());
  }
  return out;
}

// The tiny Llama's tensors with Phi-3's names: each layer's q, k, v fused into qkv_proj and its
// gate, up into gate_up_proj.
Tensors fused(const Tensors& llama, int layers) {
  Tensors out = llama;
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out[p + "self_attn.qkv_proj.weight"] = rows_joined(
        llama, {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"});
    out[p + "mlp.gate_up_proj.weight"] = rows_joined(llama, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
    for (const char* part : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"})
      out.erase(p + part + ".weight");
  }
  return out;
}

// Two directories of the tiny Llama's weights without its rope scaling (Phi-3 has none): "llama"
// as it is, "phi3" fused under a Phi-3 config.json with `window` (null when 0).
struct Pair {
  std::string llama, phi3;
};
Pair phi3_pair(const testing::TempDir& tmp, const std::string& name, int window) {
  Pair out{tmp.file(name + "_llama"), tmp.file(name + "_phi3")};
  std::filesystem::create_directories(out.llama);
  std::filesystem::create_directories(out.phi3);
  Json config = Json::parse(file_read_all(kLlama + "/config.json"));
  config["rope_scaling"] = nullptr;
  file_write_atomic(out.llama + "/config.json", config.dump(2));
  const Tensors llama = tensors_read(kLlama);
  tensors_write(out.llama + "/model.safetensors", llama);
  config["model_type"] = "phi3";
  config["architectures"] = Json::array({"Phi3ForCausalLM"});
  config.erase("attention_bias");
  config.erase("mlp_bias");
  config["sliding_window"] = window > 0 ? Json(window) : Json(nullptr);
  config["original_max_position_embeddings"] = config["max_position_embeddings"];
  config["resid_pdrop"] = 0.0;
  file_write_atomic(out.phi3 + "/config.json", config.dump(2));
  tensors_write(out.phi3 + "/model.safetensors", fused(llama, config["num_hidden_layers"].get<int>()));
  return out;
}

std::string config_error(const std::string& dir) {
  try {
    hf_config_read(dir + "/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Phi3, ConfigReadsAndWritesAPhi3) {
  testing::TempDir tmp;
  const Pair dirs = phi3_pair(tmp, "p", 16);
  const GptConfig cfg = hf_config_read(dirs.phi3 + "/config.json");
  EXPECT_TRUE(cfg.llama());
  EXPECT_EQ(cfg.variant, LlamaVariant::Phi3);
  EXPECT_TRUE(cfg.fused_projections());
  EXPECT_STREQ(cfg.family(), "phi3");
  EXPECT_EQ(cfg.sliding_window, 16);
  EXPECT_EQ(cfg.context(), 64);
  EXPECT_EQ(cfg.context(Backend::Cuda), 16);
  EXPECT_EQ(cfg.layer_scores(1).window, 16);
  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["model_type"], "phi3");
  EXPECT_EQ(written["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ(written["sliding_window"], 16);
  EXPECT_FALSE(written.contains("attention_bias"));
  EXPECT_EQ(hf_config_read(tmp.file("out.json")).describe(), cfg.describe());

  // What Stratum does not run: each refused, naming it.
  const std::vector<std::pair<Json, std::string>> refused = {
      {Json{{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}},
       "rope_scaling (longrope) needs short_factor and long_factor of rotary_dim / 2 = 8 numbers each, got 1 and 1"},
      {Json{{"type", "longrope"}, {"short_factor", {1.0}}}, "rope_scaling (longrope) needs 'long_factor'"},
      {Json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 16}},
       "a Phi-3 model's rope_scaling must be null or longrope"},
  };
  Json config = Json::parse(file_read_all(dirs.phi3 + "/config.json"));
  std::filesystem::create_directories(tmp.file("bad"));
  for (const auto& [scaling, fragment] : refused) {
    Json c = config;
    c["rope_scaling"] = scaling;
    file_write_atomic(tmp.file("bad/config.json"), c.dump());
    EXPECT_NE(config_error(tmp.file("bad")).find(fragment), std::string::npos) << config_error(tmp.file("bad"));
  }
  for (const double factor : {0.0, 1.5, 0.1}) {  // out of (0, 1]; 0.1 of head_dim 16 rotates 1 channel
    config["partial_rotary_factor"] = factor;
    file_write_atomic(tmp.file("bad/config.json"), config.dump());
    EXPECT_NE(config_error(tmp.file("bad")).find("partial_rotary_factor"), std::string::npos)
        << config_error(tmp.file("bad"));
  }
}

// Note [partial rotary]: Phi-4-mini's partial_rotary_factor (tests/golden/tiny_phi4mini: 0.75 of
// 16 channels, longrope's six factors, tied) reads, writes back, sizes the rotary tables by the
// rotary channels and is refused on CUDA; PyTorch's numbers in llama_model_test, trainer_test and
// generator_test.
TEST(Phi3, PartialRotaryReadsAndWritesBack) {
  const std::string dir = source_path("tests/golden/tiny_phi4mini");
  const GptConfig cfg = hf_config_read(dir + "/config.json");
  EXPECT_EQ(cfg.partial_rotary_factor, 0.75);
  EXPECT_EQ(cfg.head_dim(), 16);
  EXPECT_EQ(cfg.rotary_dim(), 12);
  EXPECT_EQ(cfg.rope_scaling.short_factor.size(), 6u);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_THROW(cfg.backend_check(Backend::Cuda, "train"), Error);
  EXPECT_NO_THROW(cfg.backend_check(Backend::Cpu, "train"));
  testing::TempDir tmp;
  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["partial_rotary_factor"], 0.75);
  EXPECT_EQ(hf_config_read(tmp.file("out.json")).rotary_dim(), 12);
  Json wrong = Json::parse(file_read_all(dir + "/config.json"));
  wrong["partial_rotary_factor"] = 1.0;  // six factors for eight frequencies
  std::filesystem::create_directories(tmp.file("bad"));
  file_write_atomic(tmp.file("bad/config.json"), wrong.dump());
  EXPECT_NE(config_error(tmp.file("bad")).find("short_factor and long_factor of rotary_dim / 2 = 8"), std::string::npos)
      << config_error(tmp.file("bad"));
}

// The fused directory is the Llama's math: the same bits trained (in RAM and streamed), resumed and
// generated; the checkpoint is a Phi-3 again whose fused tensors are the trained Llama's parts.
TEST(Phi3, TrainsStreamsAndGeneratesWithTheLlamasBits) {
  testing::TempDir tmp;
  const Pair dirs = phi3_pair(tmp, "p", 0);
  const std::string train = " --data " + kLlama + "/tokens.bin --batch 2 --seq 16 --steps 3 --quiet --threads 2";
  auto r = run_stratum("train --model " + dirs.llama + train + " --save " + tmp.file("llama_saved"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + dirs.phi3 + train + " --save " + tmp.file("saved"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash);
  r = run_stratum("train --model " + dirs.phi3 + train + " --mem-budget 1500K --offload-dir " + tmp.path() +
                  " --prefetch 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash) << "streaming must not change a bit";

  const std::string step = "/step-00000003";
  const Json saved = Json::parse(file_read_all(tmp.file("saved") + step + "/config.json"));
  EXPECT_EQ(saved["model_type"], "phi3");
  EXPECT_EQ(saved["architectures"][0], "Phi3ForCausalLM");
  const Tensors phi3 = tensors_read(tmp.file("saved") + step);
  const Tensors want = fused(tensors_read(tmp.file("llama_saved") + step), 2);
  ASSERT_EQ(phi3.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(phi3.count(name)) << name;
    EXPECT_EQ(phi3.at(name).first, t.first) << name;
    EXPECT_EQ(phi3.at(name).second, t.second) << name;  // bit for bit
  }

  // A checkpoint resumes to the bits of the run that did not stop.
  const std::string five = " --data " + kLlama + "/tokens.bin --batch 2 --seq 16 --steps 5 --quiet --threads 2";
  r = run_stratum("train --model " + dirs.phi3 + five);
  const std::string hash5 = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + dirs.phi3 + five + " --save-every 3 --save " + tmp.file("ckpt"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("train --resume " + tmp.file("ckpt") + step + " --save " + tmp.file("ckpt2") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);

  const std::string gen = " --prompt-ids 5,9,2 --temperature 0 --no-stop --output-ids --max-tokens 13";
  const auto llama = run_stratum("generate --model " + dirs.llama + gen);
  const auto same = run_stratum("generate --model " + dirs.phi3 + gen);
  ASSERT_EQ(same.exit_code, 0) << same.errors;
  EXPECT_EQ(same.output, llama.output);
  EXPECT_FALSE(same.output.empty());
}

// Note [fused lora]: PEFT's Phi-3 targets are its fused modules; Llama's per-projection names are
// not Phi-3 layers and are refused naming the valid ones. Past its window (Note [mistral window])
// a Phi-3 trains with the bits of a Mistral of the same weights and window, not the Llama's.
TEST(Phi3, UnfusedLoraTargetsAreRefusedAndPastTheWindowItIsAMistral) {
  testing::TempDir tmp;
  const Pair dirs = phi3_pair(tmp, "p", 12);
  auto r = run_stratum("train --model " + dirs.phi3 + " --data " + kLlama +
                       "/tokens.bin --batch 2 --seq 12 --steps 1 --lora-r 4 --lora-targets q_proj --quiet");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("target module 'q_proj' is not a linear layer of a phi3 block; valid: self_attn.qkv_proj "
                          "(qkv_proj), self_attn.o_proj (o_proj), mlp.gate_up_proj (gate_up_proj), mlp.down_proj "
                          "(down_proj)"),
            std::string::npos)
      << r.errors;
  EXPECT_EQ(r.errors.find('\n'), r.errors.size() - 1) << r.errors;
  const std::string mistral = tmp.file("mistral");
  std::filesystem::copy(dirs.llama, mistral);
  Json config = Json::parse(file_read_all(mistral + "/config.json"));
  config["model_type"] = "mistral";
  config.erase("attention_bias");
  config.erase("mlp_bias");
  config["sliding_window"] = 12;
  file_write_atomic(mistral + "/config.json", config.dump(2));
  const std::string train = " --data " + kLlama + "/tokens.bin --batch 2 --seq 24 --steps 2 --quiet --threads 2";
  r = run_stratum("train --model " + dirs.phi3 + train);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + mistral + train);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash);
  r = run_stratum("train --model " + dirs.llama + train);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(testing::params_hash_of(r.errors), hash) << "a window of 12 over 24 positions must change the model";
}

TEST(Phi3, LongRopeReadsCapsGenerationAndWritesBack) {
  const std::string dir = source_path("tests/golden/tiny_phi35");
  const GptConfig cfg = hf_config_read(dir + "/config.json");
  const RopeScaling& s = cfg.rope_scaling;
  ASSERT_EQ(s.type, RopeScaling::Type::LongRope);
  EXPECT_EQ(s.original_max_position_embeddings, 32);
  EXPECT_EQ(s.short_factor.size(), 8u);
  EXPECT_DOUBLE_EQ(s.attention_factor, std::sqrt(1.0 + std::log(4.0) / std::log(32.0)));
  EXPECT_EQ(cfg.n_ctx, 128);
  EXPECT_EQ(cfg.context(), 128);  // past 32 positions, the long factors (tests/golden/tiny_phi35_long)
  EXPECT_FALSE(cfg.rope_long_factors(32));
  EXPECT_TRUE(cfg.rope_long_factors(33));
  EXPECT_EQ(cfg.generation_context(Backend::Cpu), 32);
  EXPECT_EQ(cfg.generation_context_text(Backend::Cpu),
            "original_max_position_embeddings=32 (generation runs longrope's short factors)");
  testing::TempDir tmp;
  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  const Json original = Json::parse(file_read_all(dir + "/config.json"));
  EXPECT_EQ(written["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(written["rope_scaling"]["short_factor"], original["rope_scaling"]["short_factor"]);
  EXPECT_EQ(written["rope_scaling"]["long_factor"], original["rope_scaling"]["long_factor"]);
  EXPECT_FALSE(written["rope_scaling"].contains("attention_factor"));  // computed, as in the input
  EXPECT_EQ(written["original_max_position_embeddings"], 32);
  EXPECT_EQ(written["max_position_embeddings"], 128);
  // A stated attention factor is taken as it is.
  Json stated = original;
  stated["rope_scaling"]["attention_factor"] = 1.25;
  file_write_atomic(tmp.file("stated.json"), stated.dump());
  EXPECT_EQ(hf_config_read(tmp.file("stated.json")).rope_scaling.attention_factor, 1.25);

  // Past n_ctx training is refused; past the original context a prompt is, naming it.
  auto r = run_stratum("train --model " + dir + " --data " + dir + "/tokens.bin --batch 1 --seq 129 --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("--seq 129 is longer than the model context n_ctx=128; use --seq <= 128"), std::string::npos)
      << r.errors;
  std::string prompt = "1";
  for (int i = 1; i < 32; ++i) prompt += "," + std::to_string(i % 100);
  r = run_stratum("generate --model " + dir + " --prompt-ids " + prompt + " --max-tokens 4 --output-ids");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("prompt 1 is 32 tokens, longer than the model context original_max_position_embeddings=32 "
                          "(generation runs longrope's short factors) allows"),
            std::string::npos)
      << r.errors;
  // Not a Llama's: longrope is read for Phi-3 only.
  Json llama = original;
  llama["model_type"] = "llama";
  file_write_atomic(tmp.file("llama.json"), llama.dump());
  try {
    hf_config_read(tmp.file("llama.json"));
    ADD_FAILURE() << "a Llama with longrope was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling \"longrope\" is supported for Phi-3 models"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace stratum
