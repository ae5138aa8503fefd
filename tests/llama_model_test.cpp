// The Llama family against PyTorch golden files (tools/make_llama_golden.py: a tiny Llama with
// grouped-query attention, llama3 rope scaling and an untied head, sharded, plus a BF16 copy):
// logits at every position, loss, every gradient, in RAM and streamed under a budget; loading
// errors (missing shard, index naming an absent tensor, wrong shape); save/load round trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "integration_util.h"
#include "kernels/cpu/matmul.h"
#include "weights/model_io.h"
#include "stratum/error.h"
#include "store/tiered_segment_store.h"
#include "exec/executor.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::source_path;

const std::string kTiny = "tests/golden/tiny_llama";
const std::string kTinyBf16 = "tests/golden/tiny_llama_bf16";
const std::string kQwen2 = "tests/golden/tiny_qwen2";
const std::string kQwen3 = "tests/golden/tiny_qwen3";

std::vector<std::int32_t> golden_i32(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsTensorInfo* t = file.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, DType::I32) << name;
  std::vector<std::int32_t> out(static_cast<std::size_t>(t->numel()));
  file.read_raw(*t, out.data());
  return out;
}

// Largest |a - b| over the logits of every prefix of every sequence (logits_last per prefix). A
// LongRoPE model past its original context turns every position by the long factors in a forward
// of T positions, a shorter prefix by the short ones (Note [longrope]): there, whole sequences only.
double max_logit_error(Executor& exec, const GptConfig& cfg, const std::vector<std::int32_t>& ids,
                       const std::vector<float>& want, int B, int T) {
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  double worst = 0.0;
  for (int b = 0; b < B; ++b)
    for (int t = cfg.rope_long_factors(T) ? T : 1; t <= T; ++t) {
      exec.logits_last(ids.data() + static_cast<std::size_t>(b) * T, t, logits.data());
      const float* ref = want.data() + (static_cast<std::size_t>(b) * T + t - 1) * cfg.vocab_size;
      for (int v = 0; v < cfg.vocab_size; ++v) worst = std::max(worst, std::abs(static_cast<double>(logits[v]) - ref[v]));
    }
  return worst;
}

struct Golden {
  std::string dir;
  GptConfig cfg;
  ParamLayout layout;
  SafetensorsFile ref;
  std::vector<std::int32_t> inputs, targets;
  int B = 2, T = 24;
  explicit Golden(const std::string& rel)
      : dir(source_path(rel)),
        cfg(model_read_config(dir)),
        layout(ParamLayout::of(cfg)),
        ref(SafetensorsFile::open(dir + "/reference.safetensors")),
        inputs(golden_i32(ref, "input_ids")),
        targets(golden_i32(ref, "targets")) {}
};

TEST(LlamaModel, ConfigIsReadAsLlama) {
  const Golden g(kTiny);
  EXPECT_TRUE(g.cfg.llama());
  EXPECT_EQ(g.cfg.n_layer, 2);
  EXPECT_EQ(g.cfg.kv_heads(), 2);
  EXPECT_EQ(g.cfg.n_head, 4);
  EXPECT_EQ(g.cfg.head_dim(), 16);
  EXPECT_EQ(g.cfg.mlp_width(), 176);
  EXPECT_FALSE(g.cfg.tie_word_embeddings);
  EXPECT_EQ(g.cfg.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_FALSE(g.layout.head_tied());
  EXPECT_GE(g.layout.vocab_block_count(), 2);
  EXPECT_EQ(g.layout.num_params(), 109248u) << "the golden model's parameter count";
}

// Logits at every position, loss and every gradient, in RAM and under a budget that streams:
// the tiny Llama, the tiny Qwen2 (tests/golden/tiny_qwen2: its q, k and v biases) and the tiny
// Qwen3 (tests/golden/tiny_qwen3: its q and k norms, Note [qk norm]; head_dim 32 over 4 heads).
void check_logits_loss_and_gradients(const std::string& dir) {
  const Golden g(dir);
  ThreadPool pool(2);
  blas_set_threads(2);
  const std::vector<float> want_logits = golden_f32(g.ref, "logits");
  const UnitTable units(g.layout, Executor::activation_unit_floats(g.cfg, g.B, g.T));

  testing::TempDir tmp;
  std::uint64_t ram_grads_hash = 0;
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed" : "in RAM");
    std::unique_ptr<SegmentStore> store;  // outlives the executor
    Executor exec(pool, g.cfg, units, g.B, g.T);
    if (streamed) {
      TieredStoreOptions so;
      so.budget_bytes = exec.min_store_bytes();  // the smallest budget: everything streams
      so.offload_dir = tmp.path();
      so.prefetch_depth = 1;
      store = std::make_unique<TieredSegmentStore>(units, so);
    } else {
      store = std::make_unique<RamSegmentStore>(units);
    }
    model_load_weights(g.dir, g.layout, *store);
    exec.attach(*store);
    EXPECT_LE(max_logit_error(exec, g.cfg, g.inputs, want_logits, g.B, g.T), 1e-4);
    const float loss = exec.forward_backward(g.inputs.data(), g.targets.data(), g.B, g.T);
    EXPECT_NEAR(loss, golden_f32(g.ref, "loss")[0], 1e-5);

    int checked = 0;
    std::uint64_t h = 1469598103934665603ull;
    for (int s = 0; s < g.layout.segment_count(); ++s) {
      SegmentChunksHold grads(*store, s, SegmentKind::Grads, Access::Read);
      for (const auto& t : g.layout.segments()[s].tensors) {
        const auto expected = golden_f32(g.ref, "grad." + g.layout.hf_name(t));
        double max_err = 0.0, max_ref = 0.0;
        for (std::size_t i = 0; i < t.numel; ++i) {
          const double want = expected[t.hf_first() + i];
          const float got = grads.tensor(t)[i];
          max_err = std::max(max_err, std::abs(static_cast<double>(got) - want));
          max_ref = std::max(max_ref, std::abs(want));
          std::uint32_t bits;
          std::memcpy(&bits, &got, sizeof bits);
          h = (h ^ bits) * 1099511628211ull;
        }
        EXPECT_LE(max_err, 1e-6 + 1e-4 * max_ref) << t.name << " max |ref| " << max_ref;
        ++checked;
      }
    }
    EXPECT_EQ(checked, (g.layout.head_tied() ? 1 : 2) * g.layout.vocab_block_count() + 1 +
                           (9 + (g.cfg.qkv_bias() ? 3 : 0) + (g.cfg.qk_norm() ? 2 : 0) + (g.cfg.post_norms() ? 2 : 0)) *
                               g.cfg.n_layer);
    if (!streamed) ram_grads_hash = h;
    else EXPECT_EQ(h, ram_grads_hash) << "streaming must not change a bit";
  }
}

TEST(LlamaModel, LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) { check_logits_loss_and_gradients(kTiny); }

TEST(LlamaModel, Qwen2LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients(kQwen2);
}

TEST(LlamaModel, Qwen3LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients(kQwen3);
}

// Phi-3 (tests/golden/tiny_phi3: q, k, v and gate, up stored fused, Note [phi3 fused]): every
// gradient of a fused tensor is its parts' rows, each checked against PyTorch's fused gradient.
TEST(LlamaModel, Phi3LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_phi3");
}
// Phi-3.5's longrope (tests/golden/tiny_phi35, Note [longrope]): the short factors and the
// attention factor scaling cos and sin.
TEST(LlamaModel, Phi35LongRopeLogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_phi35");
}
// Phi-3.5's longrope past its original context (tests/golden/tiny_phi35_long: 24 positions over
// an original 12): every position turns by the long factors, as transformers does.
TEST(LlamaModel, Phi35LongFactorsLogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_phi35_long");
}
// Phi-4-mini's partial rotary (tests/golden/tiny_phi4mini, Note [partial rotary]): the rope turns
// 12 of each head's 16 channels, with longrope's factors and a tied head.
TEST(LlamaModel, Phi4MiniPartialRotaryLogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_phi4mini");
}

// Mistral (tests/golden/tiny_mistral, Note [mistral window]): a sliding window of 6 keys in every
// layer over 24 positions, past which the CPU attention runs (Note [sliding window]).
TEST(LlamaModel, MistralPastItsWindowLogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_mistral");
}

// Gemma (tests/golden/tiny_gemma, Note [gemma]): norms by 1 + w, GeGLU, the embedding scaled by
// sqrt(64) and the tied head, whose gradient is the head's and the scaled embedding's together.
TEST(LlamaModel, GemmaLogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_gemma");
}

// Gemma 3 (tests/golden/tiny_gemma3, Note [gemma3]): Gemma's changes, q and k norms by 1 + w, the
// norms after the attention and the MLP (Note [post norms]), a sliding layer's rope and a full
// layer's linearly scaled one.
TEST(LlamaModel, Gemma3LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_gemma3");
}

// Gemma 2 (tests/golden/tiny_gemma2, Note [gemma2]): Gemma's changes, the post norms, a sliding
// layer of 8 keys over 24 positions, and the scores and logits soft-capped (Note [softcapping],
// Note [final softcapping]; caps of 4 and 5 that bend most of them).
TEST(LlamaModel, Gemma2LogitsLossAndGradientsMatchPyTorchInRamAndStreamed) {
  check_logits_loss_and_gradients("tests/golden/tiny_gemma2");
}

TEST(LlamaModel, GemmaConfigIsATiedLlamaWithItsThreeChanges) {
  const Golden g("tests/golden/tiny_gemma");
  EXPECT_TRUE(g.cfg.gemma());
  EXPECT_TRUE(g.layout.head_tied());
  EXPECT_EQ(g.cfg.head_dim(), 32);
  EXPECT_EQ(g.cfg.kv_heads(), 1);
  EXPECT_EQ(g.cfg.norm_offset(), 1.0f);
  EXPECT_EQ(g.cfg.embed_scale(), 8.0f);
  EXPECT_STREQ(g.cfg.family(), "gemma");
}

TEST(LlamaModel, Qwen3ConfigIsALlamaWithQkNorms) {
  const Golden g(kQwen3);
  EXPECT_TRUE(g.cfg.qk_norm());
  EXPECT_FALSE(g.cfg.qkv_bias());
  EXPECT_STREQ(g.cfg.family(), "qwen3");
  EXPECT_EQ(g.cfg.describe().rfind("qwen3 L2 H4 C64", 0), 0u) << g.cfg.describe();
  EXPECT_EQ(g.cfg.q_dim(), 128) << "head_dim 32 over 4 heads: wider than hidden_size";
  const SegmentLayout& layer = g.layout.segments()[g.layout.layer_segment(1)];
  ASSERT_EQ(layer.tensors.size(), 11u);
  EXPECT_EQ(g.layout.hf_name(layer.tensors[kQNormW]), "model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(g.layout.hf_name(layer.tensors[kKNormW]), "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(layer.tensors[kKNormW].numel, 32u);
  EXPECT_FALSE(layer.tensors[kQNormW].weight_decay) << "norm weights are not decayed";
  EXPECT_EQ(block_tensor_part(g.cfg, kKNormW), BlockPart::Attention);
}

TEST(LlamaModel, Qwen2ConfigIsALlamaWithQkvBiases) {
  const Golden g(kQwen2);
  EXPECT_TRUE(g.cfg.llama());
  EXPECT_TRUE(g.cfg.qkv_bias());
  EXPECT_STREQ(g.cfg.family(), "qwen2");
  EXPECT_EQ(g.cfg.describe().rfind("qwen2 L2 H4 C64", 0), 0u) << g.cfg.describe();
  EXPECT_EQ(g.cfg.rope_scaling.type, RopeScaling::Type::None);
  EXPECT_FLOAT_EQ(g.cfg.layer_norm_eps, 1e-6f);
  const SegmentLayout& layer = g.layout.segments()[g.layout.layer_segment(1)];
  ASSERT_EQ(layer.tensors.size(), 12u);
  EXPECT_EQ(g.layout.hf_name(layer.tensors[kQB]), "model.layers.1.self_attn.q_proj.bias");
  EXPECT_EQ(g.layout.hf_name(layer.tensors[kVB]), "model.layers.1.self_attn.v_proj.bias");
  EXPECT_EQ(layer.tensors[kKB].numel, static_cast<std::size_t>(g.cfg.kv_dim()));
  EXPECT_FALSE(layer.tensors[kQB].weight_decay) << "biases are not decayed (PyTorch's no-decay group)";
  EXPECT_EQ(block_tensor_part(g.cfg, kVB), BlockPart::Attention);
  // A Llama config that asks for attention biases is refused, naming Qwen2.
  testing::TempDir tmp;
  std::filesystem::copy_file(g.dir + "/config.json", tmp.file("config.json"));
  std::string text = file_read_all(tmp.file("config.json"));
  text.replace(text.find("\"qwen2\""), 7, "\"llama\"");
  text.replace(text.find("\"use_sliding_window\""), 0, "\"attention_bias\": true,\n  ");
  file_write_atomic(tmp.file("config.json"), text);
  EXPECT_THAT([&] {
    try {
      model_read_config(tmp.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), ::testing::AllOf(::testing::HasSubstr("attention_bias"), ::testing::HasSubstr("qwen2")));
}

TEST(LlamaModel, Bf16WeightsLoadExactlyAndMatchTheirReference) {
  const Golden g(kTinyBf16);
  ThreadPool pool(2);
  blas_set_threads(2);
  RamSegmentStore store(g.layout, Executor::activation_unit_floats(g.cfg, g.B, g.T));
  model_load_weights(g.dir, g.layout, store);
  Executor exec(pool, g.cfg, store, g.B, g.T);
  EXPECT_LE(max_logit_error(exec, g.cfg, g.inputs, golden_f32(g.ref, "logits"), g.B, g.T), 1e-4);
  EXPECT_NEAR(exec.loss(g.inputs.data(), g.targets.data(), g.B, g.T), golden_f32(g.ref, "loss")[0], 1e-5);
}

void check_greedy_continuation(const std::string& dir) {
  const Golden g(dir);
  ThreadPool pool(2);
  blas_set_threads(2);
  RamSegmentStore store(g.layout, Executor::activation_unit_floats(g.cfg, 1, g.cfg.n_ctx));
  model_load_weights(g.dir, g.layout, store);
  Executor exec(pool, g.cfg, store, 1, g.cfg.n_ctx);
  std::vector<std::int32_t> ids = golden_i32(g.ref, "generate_prompt");
  const std::vector<std::int32_t> want = golden_i32(g.ref, "generate_ids");
  std::vector<float> logits(static_cast<std::size_t>(g.cfg.vocab_size));
  for (std::size_t k = 0; k < want.size(); ++k) {
    exec.logits_last(ids.data(), static_cast<int>(ids.size()), logits.data());
    ids.push_back(static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  EXPECT_EQ(std::vector<std::int32_t>(ids.end() - static_cast<long>(want.size()), ids.end()), want);
}

TEST(LlamaModel, GreedyContinuationMatchesPyTorch) {
  check_greedy_continuation(kTiny);
  check_greedy_continuation(kQwen2);
  check_greedy_continuation(kQwen3);
}

// Positions beyond 8k under Llama 3.1's rope scaling (factor 8 over an original 8192): a
// one-layer model with a 131072-token context (tests/golden/long_rope, tools/make_llama_golden.py
// --only long_rope), its logits at positions 0, 8191, 8192 and 131071 against PyTorch's (computed
// there from query row p alone, self-checked against the full forward). The full 131072-token
// forward runs here: the tiled attention keeps no (T, T) matrix.
TEST(LlamaModel, LongContextLogitsMatchPyTorchTo131072) {
  const std::string dir = source_path("tests/golden/long_rope");
  const GptConfig cfg = model_read_config(dir);
  ASSERT_EQ(cfg.n_ctx, 131072);
  ASSERT_EQ(cfg.rope_scaling.type, RopeScaling::Type::Llama3);
  const ParamLayout layout = ParamLayout::of(cfg);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const std::vector<std::int32_t> positions = golden_i32(ref, "positions");
  const std::vector<float> want = golden_f32(ref, "logits");
  ASSERT_EQ(want.size(), positions.size() * static_cast<std::size_t>(cfg.vocab_size));
  std::vector<std::int32_t> ids(static_cast<std::size_t>(cfg.n_ctx));
  for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<std::int32_t>((37 * t + (t >> 7)) % 64);
  ThreadPool pool(2);
  blas_set_threads(2);
  RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, 1, cfg.n_ctx));
  model_load_weights(dir, layout, store);
  Executor exec(pool, cfg, store, 1, cfg.n_ctx);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  double worst = 0.0;
  for (std::size_t k = 0; k < positions.size(); ++k) {
    exec.logits_last(ids.data(), positions[k] + 1, logits.data());
    double err = 0.0;
    for (int v = 0; v < cfg.vocab_size; ++v)
      err = std::max(err, std::abs(static_cast<double>(logits[v]) - want[k * cfg.vocab_size + v]));
    EXPECT_LE(err, 1e-4) << "position " << positions[k];
    worst = std::max(worst, err);
  }
  std::printf("[long rope] largest |logit - PyTorch| %.2e\n", worst);
}

// The golden model loaded and saved to tmp/out; whether loading that back gives the same bits.
bool save_reloads_bit_identical(const Golden& g, const testing::TempDir& tmp) {
  RamSegmentStore a(g.layout);
  model_load_weights(g.dir, g.layout, a);
  model_save(tmp.file("out"), g.cfg, g.layout, a, "");
  RamSegmentStore b(g.layout);
  model_load_weights(tmp.file("out"), g.layout, b);
  return model_params_hash(g.layout, a) == model_params_hash(g.layout, b);
}

TEST(LlamaModel, SaveWritesHuggingFaceNamesAndReloadsBitIdentical) {
  const Golden g(kTiny);
  testing::TempDir tmp;
  EXPECT_TRUE(save_reloads_bit_identical(g, tmp));
  const SafetensorsFile saved = SafetensorsFile::open(tmp.file("out/model.safetensors"));
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                           "model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight"})
    EXPECT_NE(saved.find(name), nullptr) << name;
  EXPECT_EQ(saved.tensors().size(), 21u);
  const GptConfig back = model_read_config(tmp.file("out"));
  EXPECT_EQ(back.describe(), g.cfg.describe());
  EXPECT_EQ(back.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, g.cfg.rope_scaling.original_max_position_embeddings);
}

// A Qwen2 saves as one: model_type "qwen2", Qwen2ForCausalLM, the biases under their names.
TEST(LlamaModel, Qwen2SavesAsQwen2AndReloadsBitIdentical) {
  const Golden g(kQwen2);
  testing::TempDir tmp;
  EXPECT_TRUE(save_reloads_bit_identical(g, tmp));
  const SafetensorsFile saved = SafetensorsFile::open(tmp.file("out/model.safetensors"));
  for (const char* name : {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias",
                           "model.layers.1.self_attn.v_proj.bias"})
    EXPECT_NE(saved.find(name), nullptr) << name;
  EXPECT_EQ(saved.tensors().size(), 27u);
  const nlohmann::json config = nlohmann::json::parse(file_read_all(tmp.file("out/config.json")));
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(config["use_sliding_window"], false);
  EXPECT_FALSE(config.contains("attention_bias"));
  const GptConfig back = model_read_config(tmp.file("out"));
  EXPECT_EQ(back.describe(), g.cfg.describe());
  EXPECT_TRUE(back.qkv_bias());
  // Its sliding window switched on is refused: Stratum attends to every earlier key.
  file_write_atomic(tmp.file("out/config.json"),
                    std::regex_replace(file_read_all(tmp.file("out/config.json")),
                                       std::regex("\"use_sliding_window\": false"), "\"use_sliding_window\": true"));
  EXPECT_THROW(model_read_config(tmp.file("out")), Error);
}

// Copies the sharded golden model into tmp, applies `edit` to the copy, and returns the error
// loading it gives ("" when it loads).
std::string load_error(const std::function<void(const std::string&)>& edit) {
  const Golden g(kTiny);
  testing::TempDir tmp;
  for (const auto& e : std::filesystem::directory_iterator(g.dir))  // the model's files (not lora_init/)
    if (e.is_regular_file())
      std::filesystem::copy_file(e.path(), tmp.file(e.path().filename().string()));
  edit(tmp.path());
  try {
    const GptConfig cfg = model_read_config(tmp.path());
    const ParamLayout layout = ParamLayout::of(cfg);
    RamSegmentStore store(layout);
    model_load_weights(tmp.path(), layout, store);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void file_edit(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = file_read_all(path);
  const std::size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  file_write_atomic(path, text);
}

TEST(LlamaModel, ShardAndShapeErrorsNameWhatIsWrong) {
  EXPECT_EQ(load_error([](const std::string&) {}), "");
  EXPECT_THAT(load_error([](const std::string& d) { std::filesystem::remove(d + "/model-00002-of-00002.safetensors"); }),
              ::testing::AllOf(::testing::HasSubstr("model-00002-of-00002.safetensors"), ::testing::HasSubstr("missing")));
  EXPECT_THAT(load_error([](const std::string& d) {
                file_edit(d + "/model.safetensors.index.json", "\"weight_map\": {",
                          "\"weight_map\": {\n    \"model.layers.9.mlp.up_proj.weight\": \"model-00001-of-00002.safetensors\",");
              }),
              ::testing::AllOf(::testing::HasSubstr("model.layers.9.mlp.up_proj.weight"),
                               ::testing::HasSubstr("absent from this shard")));
  EXPECT_THAT(load_error([](const std::string& d) { file_edit(d + "/config.json", "\"intermediate_size\": 176", "\"intermediate_size\": 160"); }),
              ::testing::AllOf(::testing::HasSubstr("down_proj.weight"), ::testing::HasSubstr("[64,176]"),
                               ::testing::HasSubstr("[64,160]")));
  EXPECT_THAT(load_error([](const std::string& d) {
                std::filesystem::remove(d + "/model.safetensors.index.json");
              }),
              ::testing::HasSubstr("has no model.safetensors"));
  EXPECT_THAT(load_error([](const std::string& d) { file_edit(d + "/config.json", "\"llama3\"", "\"yarn\""); }),
              ::testing::AllOf(::testing::HasSubstr("\"yarn\""), ::testing::HasSubstr("not supported")));
  EXPECT_THAT(load_error([](const std::string& d) { file_edit(d + "/config.json", "\"model_type\": \"llama\"", "\"model_type\": \"falcon\""); }),
              ::testing::AllOf(::testing::HasSubstr("\"falcon\""), ::testing::HasSubstr("not supported")));
  // Tied, as transformers does: the file's lm_head.weight is ignored and the embedding serves.
  EXPECT_EQ(load_error([](const std::string& d) {
              file_edit(d + "/config.json", "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
            }),
            "");
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// What `model_read_config` says of the tiny Qwen3's config.json with `from` replaced by `to`
// ("" when it reads).
std::string qwen3_config_refusal(const testing::TempDir& tmp, const std::string& from, const std::string& to) {
  std::filesystem::copy_file(source_path(kQwen3) + "/config.json", tmp.file("config.json"),
                             std::filesystem::copy_options::overwrite_existing);
  std::string text = file_read_all(tmp.file("config.json"));
  text.replace(text.find(from), from.size(), to);
  file_write_atomic(tmp.file("config.json"), text);
  try {
    model_read_config(tmp.path());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A Qwen3 saves as one: model_type "qwen3", Qwen3ForCausalLM, the q and k norms under their
// names; its attention biases or its sliding window switched on are refused.
TEST(LlamaModel, Qwen3SavesAsQwen3AndReloadsBitIdentical) {
  const Golden g(kQwen3);
  testing::TempDir tmp;
  EXPECT_TRUE(save_reloads_bit_identical(g, tmp));
  const SafetensorsFile saved = SafetensorsFile::open(tmp.file("out/model.safetensors"));
  for (const char* name : {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"})
    EXPECT_NE(saved.find(name), nullptr) << name;
  EXPECT_EQ(saved.tensors().size(), 25u);
  const nlohmann::json config = nlohmann::json::parse(file_read_all(tmp.file("out/config.json")));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["use_sliding_window"], false);
  EXPECT_EQ(config["head_dim"], 32);
  EXPECT_EQ(model_read_config(tmp.file("out")).describe(), g.cfg.describe());
  testing::TempDir edit;
  EXPECT_EQ(qwen3_config_refusal(edit, "\"qwen3\"", "\"qwen3\""), "");
  EXPECT_THAT(qwen3_config_refusal(edit, "\"attention_bias\": false", "\"attention_bias\": true"),
              ::testing::HasSubstr("attention_bias"));
  EXPECT_THAT(qwen3_config_refusal(edit, "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
              ::testing::HasSubstr("use_sliding_window"));
  EXPECT_THAT(qwen3_config_refusal(edit, "\"qwen3\"", "\"qwen3_moe\""), ::testing::HasSubstr("\"qwen3\""));
}

}  // namespace
}  // namespace stratum
