// Tests for src/formats/hf_config: reading real Hugging Face GPT-2 configs, write/read round
// trips, the fields the written file must carry, and a malformed-input table.
#include "model/hf_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using testing::TempDir;

void text_write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The config.json published with the "gpt2" checkpoint on the Hugging Face hub.
const char* kHubGpt2Config = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

TEST(HfConfig, ReadsTheHubGpt2Config) {
  TempDir dir;
  text_write(dir.file("config.json"), kHubGpt2Config);
  const GptConfig cfg = hf_config_read(dir.file("config.json"));
  EXPECT_EQ(cfg.n_layer, 12);
  EXPECT_EQ(cfg.n_head, 12);
  EXPECT_EQ(cfg.n_embd, 768);
  EXPECT_EQ(cfg.n_ctx, 1024);
  EXPECT_EQ(cfg.vocab_size, 50257);
  EXPECT_EQ(cfg.layer_norm_eps, 1e-5f);
}

TEST(HfConfig, MinimalConfigUsesDefaultsAndNctxFallback) {
  TempDir dir;
  text_write(dir.file("c.json"),
             R"({"n_layer":2,"n_head":4,"n_embd":64,"vocab_size":300,"n_ctx":128,"activation_function":"gelu_pytorch_tanh"})");
  const GptConfig cfg = hf_config_read(dir.file("c.json"));
  EXPECT_EQ(cfg.n_ctx, 128);
  EXPECT_EQ(cfg.layer_norm_eps, 1e-5f);
  EXPECT_EQ(cfg.describe(), "L2 H4 C64 ctx128 V300");
}

TEST(HfConfig, WriteThenReadRoundTrips) {
  TempDir dir;
  GptConfig cfg;
  cfg.n_layer = 24;
  cfg.n_head = 16;
  cfg.n_embd = 1024;
  cfg.n_ctx = 512;
  cfg.vocab_size = 50304;
  cfg.layer_norm_eps = 3e-6f;
  const std::string path = dir.file("config.json");
  hf_config_write(path, cfg);
  const GptConfig back = hf_config_read(path);
  EXPECT_EQ(back.n_layer, cfg.n_layer);
  EXPECT_EQ(back.n_head, cfg.n_head);
  EXPECT_EQ(back.n_embd, cfg.n_embd);
  EXPECT_EQ(back.n_ctx, cfg.n_ctx);
  EXPECT_EQ(back.vocab_size, cfg.vocab_size);
  EXPECT_EQ(back.layer_norm_eps, cfg.layer_norm_eps);
}

TEST(HfConfig, WrittenFileHasWhatTransformersNeeds) {
  TempDir dir;
  const GptConfig cfg = testing::gpt2_small_config();
  const std::string path = dir.file("config.json");
  hf_config_write(path, cfg);
  const std::string text = file_read_all(path);
  EXPECT_NE(text.find("\"layer_norm_epsilon\": 1e-05"), std::string::npos) << "eps shown as the float the user set: " << text;
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j.at("model_type"), "gpt2");
  EXPECT_EQ(j.at("n_layer"), 12);
  EXPECT_EQ(j.at("n_head"), 12);
  EXPECT_EQ(j.at("n_embd"), 768);
  EXPECT_EQ(j.at("n_positions"), 1024);
  EXPECT_EQ(j.at("n_ctx"), 1024);
  EXPECT_EQ(j.at("vocab_size"), 50257);
  EXPECT_EQ(j.at("activation_function"), "gelu_new");
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) EXPECT_EQ(j.at(key), 0.0) << key;
  EXPECT_EQ(j.at("initializer_range"), 0.02);
  EXPECT_EQ(j.at("bos_token_id"), 50256);
  EXPECT_EQ(j.at("eos_token_id"), 50256);
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
  EXPECT_EQ(j.at("torch_dtype"), "float32");
  EXPECT_TRUE(j.at("stratum_version").is_string());
}

TEST(HfConfig, WriteRefusesInvalidConfigAndLeavesOldFile) {
  TempDir dir;
  GptConfig good;
  good.n_layer = 1;
  good.n_head = 2;
  good.n_embd = 8;
  good.n_ctx = 16;
  good.vocab_size = 10;
  const std::string path = dir.file("config.json");
  hf_config_write(path, good);
  const std::string before = file_read_all(path);
  GptConfig bad = good;
  bad.n_embd = 9;  // not divisible by n_head
  try {
    hf_config_write(path, bad);
    ADD_FAILURE() << "expected stratum::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[hf_config] ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("divisible"), std::string::npos) << e.what();
  }
  EXPECT_EQ(file_read_all(path), before);
  EXPECT_THROW(hf_config_write(dir.file("missing_dir/config.json"), good), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("missing_dir")));
}

struct MalformedCase {
  const char* name;
  std::string text;  // file contents; "<none>" means the file is not created
  std::vector<std::string> message_parts;
};

TEST(HfConfig, MalformedInputTable) {
  const std::string sizes = R"("n_layer":2,"n_head":4,"n_embd":64,"vocab_size":300,"n_positions":128)";
  const std::string llama = R"("model_type":"llama","num_attention_heads":4,"hidden_size":64,"intermediate_size":128,)"
                            R"("vocab_size":300,"max_position_embeddings":128)";
  const std::vector<MalformedCase> cases = {
      {"missing_file", "<none>", {"not found"}},
      {"not_json", "{\"n_layer\": 2,", {"not valid JSON"}},
      {"json_array", "[1, 2]", {"must be a JSON object"}},
      {"wrong_model_type", "{\"model_type\":\"bert\"," + sizes + "}", {"\"bert\"", "Llama (\"llama\")", "Qwen2 (\"qwen2\")"}},
      {"model_type_not_string", "{\"model_type\":2," + sizes + "}", {"model_type must be a string"}},
      {"missing_n_layer", R"({"n_head":4,"n_embd":64,"vocab_size":300,"n_positions":128})", {"'n_layer'"}},
      {"missing_n_head", R"({"n_layer":2,"n_embd":64,"vocab_size":300,"n_positions":128})", {"'n_head'"}},
      {"missing_n_embd", R"({"n_layer":2,"n_head":4,"vocab_size":300,"n_positions":128})", {"'n_embd'"}},
      {"missing_vocab", R"({"n_layer":2,"n_head":4,"n_embd":64,"n_positions":128})", {"'vocab_size'"}},
      {"missing_positions", R"({"n_layer":2,"n_head":4,"n_embd":64,"vocab_size":300})", {"'n_positions'", "n_ctx"}},
      {"string_n_head", R"({"n_layer":2,"n_head":"4","n_embd":64,"vocab_size":300,"n_positions":128})", {"'n_head'", "integer"}},
      {"float_n_embd", R"({"n_layer":2,"n_head":4,"n_embd":64.5,"vocab_size":300,"n_positions":128})", {"'n_embd'", "integer"}},
      {"huge_vocab", R"({"n_layer":2,"n_head":4,"n_embd":64,"vocab_size":99999999999,"n_positions":128})", {"'vocab_size'", "outside"}},
      {"eps_string", "{" + sizes + R"(,"layer_norm_epsilon":"1e-5"})", {"layer_norm_epsilon"}},
      {"relu", "{" + sizes + R"(,"activation_function":"relu"})", {"\"relu\"", "gelu_new"}},
      {"untied", "{" + sizes + R"(,"tie_word_embeddings":false})", {"tie_word_embeddings"}},
      {"wide_mlp", "{" + sizes + R"(,"n_inner":512})", {"n_inner"}},
      {"indivisible_heads", R"({"n_layer":2,"n_head":5,"n_embd":64,"vocab_size":300,"n_positions":128})", {"divisible"}},
      {"zero_layers", R"({"n_layer":0,"n_head":4,"n_embd":64,"vocab_size":300,"n_positions":128})", {"n_layer"}},
      // A Llama's fields by the names its config.json gives them, not GPT-2's.
      {"llama_zero_eps", "{" + llama + R"(,"num_hidden_layers":2,"rms_norm_eps":0})", {"rms_norm_eps must be"}},
      {"llama_zero_layers", "{" + llama + R"(,"num_hidden_layers":0})", {"num_hidden_layers must be"}},
      {"llama_zero_inner", R"({"model_type":"llama","num_attention_heads":4,"hidden_size":64,"intermediate_size":0,)"
                           R"("vocab_size":300,"max_position_embeddings":128,"num_hidden_layers":2})",
       {"intermediate_size must be >= 1, got 0"}},
      {"eos_negative", "{" + sizes + R"(,"eos_token_id":-1})", {"'eos_token_id'", "token ids"}},
      {"eos_string", "{" + sizes + R"(,"eos_token_id":"x"})", {"'eos_token_id'", "token ids"}},
  };
  TempDir dir;
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".json");
    if (c.text != "<none>") text_write(path, c.text);
    try {
      hf_config_read(path);
      ADD_FAILURE() << "expected stratum::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[hf_config] ", 0), 0u) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& part : c.message_parts) EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
    }
  }
}

// GPT-2's eos_token_id is kept (generation stops there) and written back; GPT2Config's 50256 is
// the default, and stands even above a small vocabulary as Hugging Face writes it: ignored there.
TEST(HfConfig, Gpt2EosTokenIdsAreReadAndWrittenBack) {
  TempDir dir;
  const std::string sizes = R"("n_layer":2,"n_head":4,"n_embd":64,"vocab_size":300,"n_positions":128)";
  text_write(dir.file("a.json"), "{" + sizes + R"(,"eos_token_id":7})");
  GptConfig cfg = hf_config_read(dir.file("a.json"));
  EXPECT_EQ(cfg.eos_token_ids, std::vector<std::int32_t>{7});
  hf_config_write(dir.file("b.json"), cfg);
  EXPECT_EQ(nlohmann::json::parse(file_read_all(dir.file("b.json"))).at("eos_token_id"), 7);
  // Outside a vocabulary of 300: dropped (generation then stops at the tokenizer's <|endoftext|>).
  text_write(dir.file("c.json"), "{" + sizes + R"(,"eos_token_id":50256})");
  EXPECT_TRUE(hf_config_read(dir.file("c.json")).eos_token_ids.empty());
  text_write(dir.file("d.json"), "{" + sizes + "}");
  cfg = hf_config_read(dir.file("d.json"));
  EXPECT_TRUE(cfg.eos_token_ids.empty());
  hf_config_write(dir.file("e.json"), cfg);
  EXPECT_EQ(nlohmann::json::parse(file_read_all(dir.file("e.json"))).at("eos_token_id"), 50256);
}

TEST(HfConfig, NullNinnerAndDefaultOptionsAreAccepted) {
  TempDir dir;
  text_write(dir.file("c.json"), R"({"n_layer":1,"n_head":1,"n_embd":8,"vocab_size":5,"n_positions":4,"n_inner":null,)"
                                 R"("tie_word_embeddings":true,"scale_attn_weights":true,"layer_norm_epsilon":1e-6})");
  EXPECT_EQ(hf_config_read(dir.file("c.json")).layer_norm_eps, 1e-6f);
}

}  // namespace
}  // namespace stratum
