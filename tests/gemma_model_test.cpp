// Gemma (model_type "gemma", Note [gemma] in model/model_config.h): its config.json, as Gemma's
// first releases wrote it (hidden_act "gelu") and as later ones do (hidden_activation
// "gelu_pytorch_tanh"), reads as a tied Llama with the Gemma variant and writes back the same;
// what Stratum does not run (exact GELU, biases, CUDA) is refused with one line; a Gemma trains,
// saves a GemmaForCausalLM without lm_head.weight and resumes to the bits of an unbroken run; a
// new `--arch gemma` model starts with norm weights 0 (GemmaRMSNorm's 1 + w = 1). Gemma 3
// (model_type "gemma3_text", Note [gemma3]): its layer types (listed, or by the older pattern),
// local rope base and window read and write back; soft-capping, another query_pre_attn_scalar
// and sequences past max_position_embeddings are refused; it trains, saves and
// resumes likewise, and `--arch gemma3` starts one. Gemma 2 (model_type "gemma2", Note [gemma2]):
// its soft-caps (given, defaulted, null), window and layer types read and write back; Gemma 2 27B's
// query_pre_attn_scalar is refused; it trains, saves and resumes, generates past its window, and
// `--arch gemma2` starts one with Gemma 2's caps. A multimodal Gemma 3 checkpoint (model_type
// "gemma3", Note [gemma3 multimodal]) trains its text model to the text model's bits. PyTorch's numbers (logits, gradients, a training
// run, greedy ids, LoRA): tests/golden/tiny_gemma, tiny_gemma2 and tiny_gemma3 in llama_model_test,
// trainer_test, generator_test and lora_train_test. Does not time anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "formats/safetensors.h"
#include "integration_util.h"
#include "model/hf_config.h"
#include "stratum/error.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using Json = nlohmann::json;
using testing::run_stratum;
using testing::source_path;

const std::string kGemma = source_path("tests/golden/tiny_gemma");
const std::string kGemma3 = source_path("tests/golden/tiny_gemma3");
const std::string kGemma2 = source_path("tests/golden/tiny_gemma2");

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

// Trains `model` (default: the golden directory itself) with checkpoints to the bits of the golden
// model's unbroken run, saves a `type` / `architecture` directory with the golden's config fields
// and no lm_head.weight, and resumes to the same bits; returns the step-3 checkpoint's model.
std::string check_trains_saves_and_resumes(const testing::TempDir& tmp, const std::string& golden, const char* type,
                                           const char* architecture, const std::string& model = "") {
  SCOPED_TRACE(type);
  const std::string five = " --data " + golden + "/tokens.bin --batch 2 --seq 16 --steps 5 --quiet --threads 2";
  auto r = run_stratum("train --model " + golden + five);
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash5 = testing::params_hash_of(r.errors);
  const std::string ckpt = tmp.file(std::string("ckpt-") + type);
  r = run_stratum("train --model " + (model.empty() ? golden : model) + five + " --save-every 3 --save " + ckpt);
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);
  const std::string step3 = ckpt + "/step-00000003";
  const Json saved = Json::parse(file_read_all(step3 + "/config.json"));
  const Json original = Json::parse(file_read_all(golden + "/config.json"));
  EXPECT_EQ(saved["model_type"], type);
  EXPECT_EQ(saved["architectures"][0], architecture);
  EXPECT_EQ(saved["tie_word_embeddings"], true);
  for (const char* key : {"layer_types", "sliding_window", "rope_local_base_freq", "rope_scaling", "rope_theta",
                          "query_pre_attn_scalar", "head_dim", "attn_logit_softcapping", "final_logit_softcapping"})
    EXPECT_EQ(saved.contains(key) ? saved[key] : Json(), original.contains(key) ? original[key] : Json()) << key;
  const SafetensorsFile model = SafetensorsFile::open(step3 + "/model.safetensors");
  bool head = false;
  for (const auto& t : model.tensors()) head = head || t.name == "lm_head.weight";
  EXPECT_FALSE(head) << "a tied Gemma saves no lm_head.weight";
  r = run_stratum("train --resume " + step3 + " --save " + ckpt + "-resumed --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), hash5);
  return step3;
}

TEST(Gemma, TrainsSavesAGemmaAndResumesToTheSameBits) {
  testing::TempDir tmp;
  check_trains_saves_and_resumes(tmp, kGemma, "gemma", "GemmaForCausalLM");
  check_trains_saves_and_resumes(tmp, kGemma3, "gemma3_text", "Gemma3ForCausalLM");
  check_trains_saves_and_resumes(tmp, kGemma2, "gemma2", "Gemma2ForCausalLM");
}

// Gemma 3 1B's config.json as released (layer types by the older sliding_window_pattern).
Json gemma3_1b() {
  return Json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": [1, 106], "final_logit_softcapping": null,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144})");
}

TEST(Gemma, Gemma3ConfigReadsItsLayerTypesAndWindowAndWritesThemBack) {
  testing::TempDir tmp;
  file_write_atomic(tmp.file("1b.json"), gemma3_1b().dump(2));
  const GptConfig cfg = hf_config_read(tmp.file("1b.json"));
  EXPECT_TRUE(cfg.gemma3());
  EXPECT_TRUE(cfg.gemma() && cfg.qk_norm() && cfg.post_norms());
  EXPECT_STREQ(cfg.family(), "gemma3_text");
  EXPECT_EQ(cfg.sliding_window, 512);
  EXPECT_EQ(cfg.context(), 32768);  // Note [gemma3]: the sliding layers attend within their window
  EXPECT_EQ(cfg.layer_scores(0).window, 512);
  EXPECT_EQ(cfg.layer_scores(5).window, 0);  // a full layer
  EXPECT_EQ(cfg.rope_theta, 1e6);
  EXPECT_EQ(cfg.rope_local_theta, 1e4);
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<std::int32_t>{1, 106}));
  for (int l = 0; l < 26; ++l) EXPECT_EQ(cfg.layer_local_rope(l), (l + 1) % 6 != 0) << l;
  EXPECT_EQ(cfg.describe(), "gemma3_text L26 H4 C1152 ctx32768 V262144 KV1 hd256 I6912 tied window512");

  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(written["layer_types"].size(), 26u);
  EXPECT_EQ(written["layer_types"][5], "full_attention");
  EXPECT_EQ(written["layer_types"][6], "sliding_attention");
  EXPECT_EQ(written["sliding_window"], 512);
  EXPECT_EQ(written["query_pre_attn_scalar"], 256);
  EXPECT_TRUE(written["final_logit_softcapping"].is_null());
  const GptConfig again = hf_config_read(tmp.file("out.json"));  // through layer_types now
  EXPECT_EQ(again.describe(), cfg.describe());
  EXPECT_EQ(again.layer_sliding, cfg.layer_sliding);

  auto refused = [&](const std::function<void(Json&)>& edit, const std::string& want) {
    Json j = gemma3_1b();
    edit(j);
    const std::string error = read_error(tmp, j);
    EXPECT_NE(error.find(want), std::string::npos) << error;
  };
  refused([](Json& j) { j["final_logit_softcapping"] = 30.0; },
          "final_logit_softcapping 30.0 is not supported; Stratum runs Gemma 3 without logit soft-capping");
  refused([](Json& j) { j["query_pre_attn_scalar"] = 168; },
          "query_pre_attn_scalar 168 is not supported; Stratum scales attention by head_dim^-1/2");
  refused([](Json& j) { j["layer_types"] = Json::array({"sliding_attention"}); },
          "layer_types must list one type per layer (26)");
  refused([](Json& j) { j["use_bidirectional_attention"] = true; }, "use_bidirectional_attention = true");
  // A hostile layer count is refused before anything is sized by it.
  refused([](Json& j) { j["num_hidden_layers"] = 2000000000; }, "num_hidden_layers must be in 1..1024, got 2000000000");
}

// Gemma 2 2B's config.json as released (no layer_types: every other layer sliding from layer 0).
Json gemma2_2b() {
  return Json::parse(R"({"architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
    "use_cache": true, "vocab_size": 256000})");
}

TEST(Gemma, Gemma2ConfigReadsItsSoftcapsWindowAndLayersAndWritesThemBack) {
  testing::TempDir tmp;
  file_write_atomic(tmp.file("2b.json"), gemma2_2b().dump(2));
  const GptConfig cfg = hf_config_read(tmp.file("2b.json"));
  EXPECT_TRUE(cfg.gemma2() && cfg.gemma() && cfg.post_norms());
  EXPECT_FALSE(cfg.gemma3() || cfg.qk_norm());
  EXPECT_STREQ(cfg.family(), "gemma2");
  EXPECT_EQ(cfg.attn_softcap, 50.0f);
  EXPECT_EQ(cfg.final_softcap, 30.0f);
  EXPECT_EQ(cfg.context(), 8192);  // the sliding layers attend within their window of 4096
  for (int l = 0; l < 26; ++l) {
    EXPECT_EQ(cfg.layer_scores(l).window, l % 2 == 0 ? 4096 : 0) << l;
    EXPECT_EQ(cfg.layer_scores(l).softcap, 50.0f) << l;
    EXPECT_FALSE(cfg.layer_local_rope(l)) << "one rope for every layer";
  }
  EXPECT_EQ(cfg.describe(), "gemma2 L26 H8 C2304 ctx8192 V256000 KV4 hd256 I9216 tied window4096");
  EXPECT_THROW(cfg.backend_check(Backend::Cuda, "train"), Error);

  hf_config_write(tmp.file("out.json"), cfg);
  const Json written = Json::parse(file_read_all(tmp.file("out.json")));
  EXPECT_EQ(written["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ(written["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(written["final_logit_softcapping"], 30.0);
  EXPECT_EQ(written["layer_types"][0], "sliding_attention");
  EXPECT_EQ(written["layer_types"][1], "full_attention");
  EXPECT_FALSE(written.contains("rope_local_base_freq"));
  const GptConfig again = hf_config_read(tmp.file("out.json"));
  EXPECT_EQ(again.describe(), cfg.describe());
  EXPECT_EQ(again.attn_softcap, 50.0f);

  auto read_with = [&](const std::function<void(Json&)>& edit) {
    Json j = gemma2_2b();
    edit(j);
    file_write_atomic(tmp.file("c.json"), j.dump(2));
    return hf_config_read(tmp.file("c.json"));
  };
  const GptConfig defaults = read_with([](Json& j) { j.erase("attn_logit_softcapping"); j.erase("final_logit_softcapping"); });
  EXPECT_EQ(defaults.attn_softcap, 50.0f) << "Gemma2Config's default";
  EXPECT_EQ(defaults.final_softcap, 30.0f);
  const GptConfig none = read_with([](Json& j) { j["attn_logit_softcapping"] = nullptr; });
  EXPECT_EQ(none.attn_softcap, 0.0f) << "null: no cap";
  EXPECT_EQ(none.layer_scores(0).softcap, 0.0f);
  auto refused = [&](const std::function<void(Json&)>& edit, const std::string& want) {
    Json j = gemma2_2b();
    edit(j);
    const std::string error = read_error(tmp, j);
    EXPECT_NE(error.find(want), std::string::npos) << error;
  };
  refused([](Json& j) { j["query_pre_attn_scalar"] = 144; },
          "query_pre_attn_scalar 144 is not supported; Stratum scales attention by head_dim^-1/2");
  refused([](Json& j) { j["final_logit_softcapping"] = -1.0; }, "final_logit_softcapping must be a number > 0 or null");
  refused([](Json& j) { j["attn_logit_softcapping"] = "fifty"; }, "attn_logit_softcapping");
}

// Gemma 2's sliding layer (8 keys in tests/golden/tiny_gemma2) past its window: a prompt of 16
// tokens continues as the cache's one-row steps do, in RAM and streamed; `--arch gemma2` starts a
// model with Gemma 2's caps, which trains and generates.
TEST(Gemma, Gemma2GeneratesPastItsWindowAndANewOneTrains) {
  testing::TempDir tmp;
  const std::string gen = " --temperature 0 --no-stop --output-ids --max-tokens 6";
  const std::string prompt = "1,5,9,17,33,7,3,90,12,44,8,61,2,77,30,19";
  const auto r = run_stratum("generate --model " + kGemma2 + " --prompt-ids " + prompt + gen);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const auto streamed = run_stratum("generate --model " + kGemma2 + " --prompt-ids " + prompt + gen +
                                    " --mem-budget 1600K --offload-dir " + tmp.path());
  ASSERT_EQ(streamed.exit_code, 0) << streamed.errors;
  EXPECT_EQ(streamed.output, r.output);
  auto t = run_stratum("train --arch gemma2 --layers 2 --heads 2 --head-dim 16 --embd 32 --vocab 131 --ctx 32 --data " +
                       kGemma2 + "/tokens.bin --batch 2 --seq 16 --steps 2 --quiet --threads 2 --save " + tmp.file("new"));
  ASSERT_EQ(t.exit_code, 0) << t.errors;
  const Json saved = Json::parse(file_read_all(tmp.file("new") + "/step-00000002/config.json"));
  EXPECT_EQ(saved["model_type"], "gemma2");
  EXPECT_EQ(saved["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(saved["final_logit_softcapping"], 30.0);
  t = run_stratum("generate --model " + tmp.file("new") + " --prompt-ids 2,5,9 --max-tokens 4 --temperature 0.8 "
                  "--seed 3 --output-ids --no-stop");
  ASSERT_EQ(t.exit_code, 0) << t.errors;
}

// Note [gemma3 multimodal]: tests/golden/tiny_gemma3 as Gemma 3 4B's checkpoint holds it (model_type
// "gemma3", its text config in text_config, its tensors under "language_model.", a vision tower and
// a projector beside them), and as transformers 4.52 and later save it ("model.language_model.",
// "model.vision_tower."), trains to the bits of the text model itself and saves that text model
// (gemma3_text, no prefix, no vision tensors), which resumes. Gemma 3 4B's released config, whose
// text_config lists only what differs from Gemma3TextConfig's defaults, reads as the 4B text model.
TEST(Gemma, Gemma3MultimodalCheckpointTrainsItsTextModel) {
  testing::TempDir tmp;
  for (const bool newer : {false, true}) {
    SCOPED_TRACE(newer ? "model.language_model." : "language_model.");
    const std::string mm = tmp.file(newer ? "mm_newer" : "mm");
    std::filesystem::create_directories(mm);
    Json text = Json::parse(file_read_all(kGemma3 + "/config.json"));
    for (const char* key : {"architectures", "torch_dtype", "bos_token_id", "eos_token_id"}) text.erase(key);
    const Json outer = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                        {"text_config", text}, {"vision_config", {{"model_type", "siglip_vision_model"}}},
                        {"bos_token_id", 2}, {"eos_token_id", Json::array({1, 106})}, {"mm_tokens_per_image", 256}};
    file_write_atomic(mm + "/config.json", outer.dump(2));
    const SafetensorsFile golden = SafetensorsFile::open(kGemma3 + "/model.safetensors");
    std::vector<std::vector<float>> data;
    std::vector<SafetensorsWriteEntry> entries;
    data.reserve(golden.tensors().size() + 2);
    for (const auto& t : golden.tensors()) {
      data.emplace_back(static_cast<std::size_t>(t.numel()));
      golden.read_f32(t, data.back().data());
      const std::string name = newer && t.name.starts_with("model.") ? "model.language_model." + t.name.substr(6)
                                                                      : (newer ? "" : "language_model.") + t.name;
      entries.push_back({name, DType::F32, t.shape, data.back().data()});
    }
    const std::string outer_model = newer ? "model." : "";  // where the vision tower sits
    data.emplace_back(12, 0.5f);
    entries.push_back({outer_model + "vision_tower.vision_model.embeddings.patch_embedding.weight", DType::F32, {3, 4},
                       data.back().data()});
    data.emplace_back(8, 0.25f);
    entries.push_back({outer_model + "multi_modal_projector.mm_input_projection_weight", DType::F32, {2, 4},
                       data.back().data()});
    safetensors_write(mm + "/model.safetensors", entries, {});

    const GptConfig cfg = model_read_config(mm);
    EXPECT_TRUE(cfg.gemma3());
    EXPECT_EQ(cfg.weights_prefix, "language_model.");
    EXPECT_EQ(cfg.describe(), model_read_config(kGemma3).describe());
    EXPECT_EQ(cfg.eos_token_ids, (std::vector<std::int32_t>{1, 106})) << "the outer config's ids";
    // The text model's bits, saved as the text model (the golden's config fields, no prefix).
    testing::TempDir run;
    const std::string step3 = check_trains_saves_and_resumes(run, kGemma3, "gemma3_text", "Gemma3ForCausalLM", mm);
    const SafetensorsFile model = SafetensorsFile::open(step3 + "/model.safetensors");
    for (const auto& t : model.tensors()) EXPECT_TRUE(t.name.starts_with("model.")) << t.name;
  }

  // Gemma 3 4B's config.json as released (the vision config cut short).
  const Json four_b = Json::parse(R"({"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
    "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": {"hidden_size": 2560,
    "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}, "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})");
  file_write_atomic(tmp.file("4b.json"), four_b.dump(2));
  const GptConfig c4 = hf_config_read(tmp.file("4b.json"));
  EXPECT_EQ(c4.describe(), "gemma3_text L34 H8 C2560 ctx131072 V262208 KV4 hd256 I10240 tied window1024");
  EXPECT_EQ(c4.rope_theta, 1e6);
  EXPECT_EQ(c4.rope_scaling.type, RopeScaling::Type::Linear);
  EXPECT_EQ(c4.eos_token_ids, (std::vector<std::int32_t>{1, 106}));
  EXPECT_TRUE(c4.layer_local_rope(0) && !c4.layer_local_rope(5));
  Json no_text = four_b;
  no_text.erase("text_config");
  EXPECT_NE(read_error(tmp, no_text).find("needs its text_config object"), std::string::npos) << read_error(tmp, no_text);
}

// Past the window (8 keys in tests/golden/tiny_gemma3) a sliding layer attends to fewer keys than
// a full one: the trainer and generator tests run 16 to 24 positions against PyTorch. Here:
// decoding past the window one token at a time gives the tokens a prompt of them continues with
// (the cache's one-row attention and a prompt's blocks over the same window), in RAM and
// streamed; --seq past max_position_embeddings is refused; `--arch gemma3` starts a model.
TEST(Gemma, Gemma3GeneratesPastItsWindowAndANewOneTrains) {
  testing::TempDir tmp;
  const std::string gen = " --temperature 0 --no-stop --output-ids";
  const std::string prompt = "1,5,9,17,33";  // the golden prompt: 33 x5, 61 x4, 2 x3
  auto r = run_stratum("generate --model " + kGemma3 + " --prompt-ids " + prompt + gen + " --max-tokens 12");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::vector<std::string> ids;
  for (std::size_t at = 0; at < r.output.size();) {
    const std::size_t end = r.output.find_first_of(", \n", at);
    if (end != at) ids.push_back(r.output.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  ASSERT_EQ(ids.size(), 12u) << r.output;
  std::string longer = prompt, rest;
  for (int i = 0; i < 6; ++i) longer += "," + ids[static_cast<std::size_t>(i)];
  for (int i = 6; i < 12; ++i) rest += (i > 6 ? "," : "") + ids[static_cast<std::size_t>(i)];
  const auto resumed = run_stratum("generate --model " + kGemma3 + " --prompt-ids " + longer + gen + " --max-tokens 6");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.errors;
  EXPECT_NE(resumed.output.find(rest), std::string::npos) << resumed.output << " vs " << rest;
  const auto streamed = run_stratum("generate --model " + kGemma3 + " --prompt-ids " + prompt + gen +
                                    " --max-tokens 12 --mem-budget 1600K --offload-dir " + tmp.path());
  ASSERT_EQ(streamed.exit_code, 0) << streamed.errors;
  EXPECT_EQ(streamed.output, r.output) << "streamed";
  r = run_stratum("train --model " + kGemma3 + " --data " + kGemma3 + "/tokens.bin --batch 1 --seq 65 --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("--seq 65 is longer than the model context n_ctx=64; use --seq <= 64"), std::string::npos)
      << r.errors;
  r = run_stratum("train --arch gemma3 --layers 2 --heads 2 --head-dim 16 --embd 32 --vocab 131 --ctx 32 --data " +
                  kGemma3 + "/tokens.bin --batch 2 --seq 16 --steps 2 --quiet --threads 2 --save " + tmp.file("new"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const Json saved = Json::parse(file_read_all(tmp.file("new") + "/step-00000002/config.json"));
  EXPECT_EQ(saved["model_type"], "gemma3_text");
  EXPECT_EQ(saved["layer_types"], Json::array({"sliding_attention", "sliding_attention"}));
  r = run_stratum("generate --model " + tmp.file("new") + " --prompt-ids 2,5,9 --max-tokens 4 --temperature 0 "
                  "--output-ids --no-stop");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
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
