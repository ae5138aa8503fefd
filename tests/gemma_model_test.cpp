// Gemma (model_type "gemma", Note [gemma] in model/model_config.h): its config.json, as Gemma's
// first releases wrote it (hidden_act "gelu") and as later ones do (hidden_activation
// "gelu_pytorch_tanh"), reads as a tied Llama with the Gemma variant and writes back the same;
// what Stratum does not run (exact GELU, biases, CUDA) is refused with one line; a Gemma trains,
// saves a GemmaForCausalLM without lm_head.weight and resumes to the bits of an unbroken run; a
// new `--arch gemma` model starts with norm weights 0 (GemmaRMSNorm's 1 + w = 1). PyTorch's
// numbers (logits, gradients, a training run, greedy ids, LoRA): tests/golden/tiny_gemma in
// llama_model_test, trainer_test, generator_test and lora_train_test. Does not time anything.
#include <gtest/gtest.h>

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

const std::string kGemma = source_path("tests/golden/tiny_gemma");

// Gemma 2B's config.json as first released (no tie_word_embeddings: GemmaConfig ties).
Json gemma_2b() {
  return Json::parse(R"({"architectures": ["GemmaForCausalLM"], "attention_bias": false, "bos_token_id": 2,
    "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "vocab_size": 256000})");
}

std::string read_error(const testing::TempDir& tmp, const Json& config) {
  const std::string path = tmp.file("config.json");
  file_write_atomic(path, config.dump(2));
  try {
    hf_config_read(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Gemma, ConfigReadsAsATiedLlamaAndWritesBackTheSame) {
  testing::TempDir tmp;
  file_write_atomic(tmp.file("2b.json"), gemma_2b().dump(2));
  const GptConfig cfg = hf_config_read(tmp.file("2b.json"));
  EXPECT_TRUE(cfg.gemma());
  EXPECT_STREQ(cfg.family(), "gemma");
  EXPECT_STREQ(cfg.family_title(), "Gemma");
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_EQ(cfg.head_dim(), 256);
  EXPECT_EQ(cfg.q_dim(), 2048);
  EXPECT_EQ(cfg.kv_heads(), 1);
  EXPECT_EQ(cfg.bos_token_id, 2);
  EXPECT_EQ(cfg.embed_scale(), static_cast<float>(std::sqrt(2048.0)));
  EXPECT_EQ(cfg.describe(), "gemma L18 H8 C2048 ctx8192 V256000 KV1 hd256 I16384 tied");

  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["model_type"], "gemma");
  EXPECT_EQ(written["architectures"][0], "GemmaForCausalLM");
  EXPECT_EQ(written["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(written["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(written["tie_word_embeddings"], true);
  EXPECT_EQ(written["head_dim"], 256);
  EXPECT_EQ(hf_config_read(tmp.file("out.json")).describe(), cfg.describe());

  // Later configs name the activation hidden_activation, which decides over hidden_act.
  Json later = gemma_2b();
  later["hidden_activation"] = "gelu_pytorch_tanh";
  later["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_EQ(read_error(tmp, later), "accepted");
  later["tie_word_embeddings"] = false;  // an untied Gemma reads as one (lm_head.weight of its own)
  file_write_atomic(tmp.file("untied.json"), later.dump(2));
  EXPECT_FALSE(hf_config_read(tmp.file("untied.json")).tie_word_embeddings);
}

TEST(Gemma, WhatItDoesNotRunIsRefusedWithOneLine) {
  testing::TempDir tmp;
  Json exact = gemma_2b();
  exact["hidden_activation"] = "gelu";  // erf GELU: not Gemma's activation
  EXPECT_NE(read_error(tmp, exact).find("hidden_activation \"gelu\" is not supported; Gemma's MLP is GeGLU with "
                                        "GELU's tanh form (\"gelu_pytorch_tanh\")"),
            std::string::npos)
      << read_error(tmp, exact);
  Json silu = gemma_2b();
  silu["hidden_act"] = "silu";
  EXPECT_NE(read_error(tmp, silu).find("hidden_act \"silu\" is not supported"), std::string::npos);
  Json biased = gemma_2b();
  biased["attention_bias"] = true;
  EXPECT_NE(read_error(tmp, biased).find("attention_bias = true is not supported"), std::string::npos);

  const GptConfig cfg = hf_config_read(kGemma + "/config.json");
  try {
    cfg.backend_check(Backend::Cuda, "train");
    ADD_FAILURE() << "Gemma on CUDA was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] Gemma models (GeGLU MLP, RMSNorm by 1 + w, scaled embedding) "
                                         "have no cuda kernels yet: use --backend cpu"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(cfg.backend_check(Backend::Cpu, "train"));
}

TEST(Gemma, TrainsSavesAGemmaAndResumesToTheSameBits) {
  testing::TempDir tmp;
  const std::string five = " --data " + kGemma + "/tokens.bin --batch 2 --seq 16 --steps 5 --quiet --threads 2";
  auto r = run_stratum("train --model " + kGemma + five);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash5 = testing::params_hash_of(r.errors);
  r = run_stratum("train --model " + kGemma + five + " --save-every 3 --save " + tmp.file("ckpt"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);
  const std::string step3 = tmp.file("ckpt") + "/step-00000003";
  const Json saved = Json::parse(file_read_all(step3 + "/config.json"));
  EXPECT_EQ(saved["model_type"], "gemma");
  EXPECT_EQ(saved["architectures"][0], "GemmaForCausalLM");
  EXPECT_EQ(saved["tie_word_embeddings"], true);
  const SafetensorsFile model = SafetensorsFile::open(step3 + "/model.safetensors");
  bool head = false;
  for (const auto& t : model.tensors()) head = head || t.name == "lm_head.weight";
  EXPECT_FALSE(head) << "a tied Gemma saves no lm_head.weight";
  r = run_stratum("train --resume " + step3 + " --save " + tmp.file("ckpt2") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);
}

TEST(Gemma, ANewGemmaStartsWithNormWeightsZero) {
  testing::TempDir tmp;
  const auto r = run_stratum("train --arch gemma --layers 1 --heads 2 --head-dim 32 --embd 32 --vocab 131 --ctx 32 "
                             "--data " + kGemma + "/tokens.bin --batch 2 --seq 16 --steps 1 --lr 1e-4 --quiet "
                             "--threads 2 --save " + tmp.file("new"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string dir = tmp.file("new") + "/step-00000001";
  EXPECT_EQ(Json::parse(file_read_all(dir + "/config.json"))["model_type"], "gemma");
  const SafetensorsFile model = SafetensorsFile::open(dir + "/model.safetensors");
  int norms = 0;
  for (const auto& t : model.tensors()) {
    if (t.shape.size() != 1) continue;
    std::vector<float> w(static_cast<std::size_t>(t.numel()));
    model.read_f32(t, w.data());
    for (float v : w) ASSERT_LT(std::abs(v), 1e-3f) << t.name << ": one AdamW step of 1e-4 from 0";
    ++norms;
  }
  EXPECT_EQ(norms, 3) << "input_layernorm, post_attention_layernorm and model.norm";
}

}  // namespace
}  // namespace stratum
