// LoRA training (--lora-*, Note [lora segments], Note [lora math]): the PEFT-semantics reference of
// tools/torch_lora.py for a tiny GPT-2 and a tiny Llama (loss and adapter gradients of one batch,
// then 8 AdamW steps), the same bits in RAM, under the smallest budget and across a resume, the
// PEFT adapter directory (names, shapes, config keys) and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>

#include "core/thread_pool.h"
#include "exec/executor.h"
#include "infer/decoder.h"
#include "store/tiered_segment_store.h"
#include "integration_util.h"
#include "store/segment_store.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::read_jsonl;
using testing::source_path;


// Largest |value - reference| over every adapter tensor of adapter_model.safetensors in `dir`
// against the reference's "<prefix><PEFT name>" (less "base_model.model." with `strip`); also
// checks both hold the same names.
double adapters_vs_reference(const std::string& dir, const SafetensorsFile& ref, const std::string& prefix,
                             bool strip = false) {
  const SafetensorsFile saved = SafetensorsFile::open(dir + "/" + kAdapterWeightsFile);
  const std::size_t cut = strip ? std::string(kAdapterPrefix).size() : 0;
  std::set<std::string> names, ref_names;
  for (const auto& info : saved.tensors()) names.insert(info.name.substr(cut));
  for (const auto& info : ref.tensors())
    if (info.name.rfind(prefix, 0) == 0) ref_names.insert(info.name.substr(prefix.size()));
  EXPECT_EQ(names, ref_names);
  double worst = 0.0;
  for (const auto& info : saved.tensors()) {
    std::vector<float> got(static_cast<std::size_t>(info.numel()));
    saved.read_f32(info, got.data());
    const auto want = golden_f32(ref, prefix + info.name.substr(cut));
    EXPECT_EQ(got.size(), want.size()) << info.name;
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return worst;
}

// The reference of a LoRA run without dropout, or with (reference_lora_dropout.safetensors: the
// same run with lora_dropout p under --seed S, its metadata "dropout" {p, seed}).
std::string reference_file(const std::string& dir, bool dropout) {
  return dir + (dropout ? "/reference_lora_dropout.safetensors" : "/reference_lora.safetensors");
}

// One batch through the executor with the reference's initial adapters: the loss and every
// adapter gradient against PyTorch; the base has no gradient units at all. With dropout: step
// 0's masks (Note [lora dropout]), and the gradients differ from the run without dropout.
void check_gradients(const std::string& golden, bool dropout) {
  const std::string dir = source_path(golden);
  const nlohmann::json a = nlohmann::json::parse(std::ifstream(dir + "/lora_args.json"));
  const int B = a["batch"].get<int>(), T = a["seq"].get<int>();
  const GptConfig cfg = model_read_config(dir);
  const SafetensorsFile ref = SafetensorsFile::open(reference_file(dir, dropout));
  const SafetensorsFile plain = SafetensorsFile::open(reference_file(dir, false));
  LoraConfig lora = adapter_config_read(dir + "/lora_init", lora_family(cfg));
  nlohmann::json drop;
  if (dropout) {
    drop = nlohmann::json::parse(ref.metadata().at("dropout"));
    lora.dropout = drop["p"].get<double>();
  }
  const ParamLayout layout = ParamLayout::of(cfg, lora);
  RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, B, T));
  model_load_weights(dir, layout, store);
  adapter_load_weights(dir + "/lora_init", layout, store);
  ThreadPool pool(2);
  Executor exec(pool, cfg, store, B, T);
  if (dropout) exec.lora_dropout_step(drop["seed"].get<std::uint64_t>(), 0);
  const testing::GoldenBatch batch = testing::golden_batch(dir, B, T);
  double largest_dropout_effect = 0.0;
  EXPECT_NEAR(exec.forward_backward(batch.inputs.data(), batch.targets.data(), B, T),
              golden_f32(ref, "train_losses")[0], 1e-5);
  int checked = 0;
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (layout.segments()[s].role != SegmentRole::Lora) {
      EXPECT_EQ(store.units().find(s, SegmentKind::Grads), -1) << "a frozen base keeps no gradients";
      EXPECT_EQ(store.units().find(s, SegmentKind::AdamM), -1);
      continue;
    }
    SegmentChunksHold grads(store, s, SegmentKind::Grads, Access::Read);
    for (const auto& t : layout.segments()[s].tensors) {
      const auto want = golden_f32(ref, "grad." + std::string(kAdapterPrefix) + layout.hf_name(t));
      ASSERT_EQ(want.size(), t.numel) << t.name;
      double max_err = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < t.numel; ++i) {
        max_err = std::max(max_err, std::abs(static_cast<double>(grads.tensor(t)[i]) - want[i]));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
      }
      EXPECT_GT(max_ref, 0.0) << t.name << ": the reference's B is nonzero, so every adapter gets a gradient";
      EXPECT_LE(max_err, 1e-6 + 1e-4 * max_ref) << t.name << " max |ref| " << max_ref;
      const auto without = golden_f32(plain, "grad." + std::string(kAdapterPrefix) + layout.hf_name(t));
      for (std::size_t i = 0; i < t.numel; ++i)
        largest_dropout_effect = std::max(largest_dropout_effect, std::abs(static_cast<double>(without[i]) - want[i]) / max_ref);
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
  if (dropout) {
    EXPECT_GT(largest_dropout_effect, 0.05) << "the masks change the gradients well beyond the tolerance";
  }
}

TEST(LoraTrain, Gpt2LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_gpt2", false); }
TEST(LoraTrain, LlamaLossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_llama", false); }
TEST(LoraTrain, Gpt2DropoutGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_gpt2", true); }
TEST(LoraTrain, LlamaDropoutGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_llama", true); }

// The reference's 8 AdamW steps through the CLI from its initial adapters (--lora-init): losses,
// gradient norms and the saved adapters; then the same bits under the smallest budget (with and
// without prefetch) and across a resume from step 3. Tolerances as the full-training golden runs
// (Trainer.LossCurveMatchesPyTorch): losses 1e-4, final weights 2e-5.
void check_run(const std::string& golden, bool dropout) {
  const std::string dir = source_path(golden);
  const nlohmann::json a = nlohmann::json::parse(std::ifstream(dir + "/lora_args.json"));
  const SafetensorsFile ref = SafetensorsFile::open(reference_file(dir, dropout));
  std::string base = "train --model " + dir + " --data " + dir + "/tokens.bin" + testing::train_flags(a) +
                     " --threads 2 --quiet --lora-init " + dir + "/lora_init";
  LoraConfig lora = adapter_config_read(dir + "/lora_init", lora_family(model_read_config(dir)));
  if (dropout) {  // --lora-dropout overrides the initial adapter's lora_dropout (0)
    const nlohmann::json drop = nlohmann::json::parse(ref.metadata().at("dropout"));
    lora.dropout = drop["p"].get<double>();
    base += " --lora-dropout " + std::to_string(lora.dropout) + " --seed " + std::to_string(drop["seed"].get<long>());
  }
  testing::TempDir tmp;
  const auto ram = testing::run_stratum(base + " --log " + tmp.file("log.jsonl") + " --save " + tmp.file("out") +
                                        " --save-every 3 --keep 5");
  ASSERT_EQ(ram.exit_code, 0) << ram.errors;
  EXPECT_NE(ram.errors.find("base frozen"), std::string::npos) << ram.errors;

  const auto losses = golden_f32(ref, "train_losses");
  const auto norms = golden_f32(ref, "train_grad_norms");
  const auto log = read_jsonl(tmp.file("log.jsonl"));
  ASSERT_EQ(log.size(), losses.size());
  for (std::size_t i = 0; i < log.size(); ++i) {
    EXPECT_NEAR(log[i]["loss"].get<double>(), losses[i], 1e-4) << "step " << i + 1;
    EXPECT_NEAR(log[i]["grad_norm"].get<double>(), norms[i], 1e-4 * (1 + norms[i])) << "step " << i + 1;
  }
  const std::string saved = checkpoint_model_dir(tmp.file("out"));
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "config.json"})
    EXPECT_TRUE(file_exists(saved + "/" + f)) << f;
  EXPECT_FALSE(file_exists(saved + "/model.safetensors")) << "the base is not copied into a LoRA checkpoint";
  const double err = adapters_vs_reference(saved, ref, "final.");
  EXPECT_LE(err, 2e-5);
  std::printf("[lora] %s: largest |adapter - reference| after %zu steps %.2e\n", golden.c_str(), losses.size(), err);

  const nlohmann::json config = nlohmann::json::parse(std::ifstream(saved + "/adapter_config.json"));
  EXPECT_EQ(config["lora_dropout"].get<double>(), lora.dropout);
  const GptConfig cfg = model_read_config(dir);
  const std::size_t min_budget =
      train_min_budget_bytes(cfg, a["batch"].get<int>(), a["seq"].get<int>(), 2, ActivationPolicy::Recompute, a["grad_clip"].get<double>(),
                             Precision::Fp32, TrainOptimizer::AdamW, lora);
  EXPECT_LT(min_budget, train_min_budget_bytes(cfg, a["batch"].get<int>(), a["seq"].get<int>(), 2, ActivationPolicy::Recompute,
                                               a["grad_clip"].get<double>()))
      << "no base gradients or moments: a smaller minimum than full training's";
  EXPECT_EQ(testing::streamed_runs_mismatch(base, min_budget, tmp.path(), testing::params_hash_of(ram.errors), {0, 2}),
            "");
  // Internals offloaded (Note [activations offload]): the adapters' x A^T rows travel in the
  // Internals units with the block's; the same bits at offload's own minimum.
  const std::size_t offload_min =
      train_min_budget_bytes(cfg, a["batch"].get<int>(), a["seq"].get<int>(), 2, ActivationPolicy::Offload,
                             a["grad_clip"].get<double>(), Precision::Fp32, TrainOptimizer::AdamW, lora);
  EXPECT_EQ(testing::streamed_runs_mismatch(base + " --activations offload", offload_min, tmp.path(),
                                            testing::params_hash_of(ram.errors), {1}),
            "");
  // Resumed from step 3 with the same base: the same bits; without --model, the base its
  // adapter_config.json names (the same one): the same bits.
  const auto resumed = testing::run_stratum("train --model " + dir + " --resume " + tmp.file("out") +
                                            "/step-00000003 --save " + tmp.file("again") + " --threads 2 --quiet");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.errors;
  EXPECT_EQ(testing::params_hash_of(resumed.errors), testing::params_hash_of(ram.errors));
  EXPECT_EQ(testing::params_hash_of(ram.errors).size(), 16u);
  const auto no_base = testing::run_stratum("train --resume " + tmp.file("out") + "/step-00000003 --save " +
                                            tmp.file("again2") + " --threads 2 --quiet");
  ASSERT_EQ(no_base.exit_code, 0) << no_base.errors;
  EXPECT_EQ(testing::params_hash_of(no_base.errors), testing::params_hash_of(ram.errors));
}

TEST(LoraTrain, Gpt2FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_gpt2", false); }
// Over a Qwen2 base (tests/golden/tiny_qwen2): the frozen q, k and v biases in every forward.
TEST(LoraTrain, Qwen2LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_qwen2", false); }
TEST(LoraTrain, Qwen2FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_qwen2", false); }
// Over a Qwen3 base (tests/golden/tiny_qwen3): q_proj's and k_proj's adapters add before the
// frozen per-head norms (Note [qk norm]), whose backward the adapters' gradients pass through.
TEST(LoraTrain, Qwen3LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_qwen3", false); }
TEST(LoraTrain, Qwen3FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_qwen3", false); }
TEST(LoraTrain, LlamaFollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_llama", false); }
// Over a Mistral base (tests/golden/tiny_mistral): the adapters' gradients through windowed layers.
TEST(LoraTrain, MistralLossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_mistral", false); }
TEST(LoraTrain, MistralFollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_mistral", false); }
// Over a Gemma base (tests/golden/tiny_gemma, Note [gemma]): adapters under GeGLU, norms by 1 + w
// and the scaled embedding, all frozen.
TEST(LoraTrain, GemmaLossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_gemma", false); }
TEST(LoraTrain, GemmaFollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_gemma", false); }
// Over a Gemma 3 base (tests/golden/tiny_gemma3): o_proj's and down_proj's adapters add before the
// frozen norms after them (Note [post norms]), whose backward recomputes them.
TEST(LoraTrain, Gemma3LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_gemma3", false); }
TEST(LoraTrain, Gemma3FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_gemma3", false); }
// Over a Gemma 2 base (tests/golden/tiny_gemma2): the adapters' gradients through both soft-caps.
TEST(LoraTrain, Gemma2LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_gemma2", false); }
TEST(LoraTrain, Gemma2FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_gemma2", false); }
// Over a Phi-3 base (tests/golden/tiny_phi3, Note [fused lora]): PEFT's default targets, among
// them the fused qkv_proj (one lora_A over q, k and v) and gate_up_proj; with dropout, one mask
// per fused module.
TEST(LoraTrain, Phi3LossAndAdapterGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_phi3", false); }
TEST(LoraTrain, Phi3DropoutGradientsMatchPyTorch) { check_gradients("tests/golden/tiny_phi3", true); }
TEST(LoraTrain, Phi3FollowsThePeftReferenceStreamedAndResumed) { check_run("tests/golden/tiny_phi3", false); }
TEST(LoraTrain, Phi3DropoutFollowsTheReferenceStreamedAndResumed) { check_run("tests/golden/tiny_phi3", true); }
// --lora-dropout: the reference's masks (Note [lora dropout]) drawn again in the recompute, at the
// smallest budget and after the resume.
TEST(LoraTrain, Gpt2DropoutFollowsTheReferenceStreamedAndResumed) { check_run("tests/golden/tiny_gpt2", true); }
TEST(LoraTrain, LlamaDropoutFollowsTheReferenceStreamedAndResumed) { check_run("tests/golden/tiny_llama", true); }

// A fresh adapter (PEFT's init from --seed): the directory PeftModel.from_pretrained reads, with
// PEFT's names and config keys; lora_A within kaiming-uniform(a=sqrt(5))'s bound, lora_B zero
// (--lr 0 leaves the initial adapters as they were).
TEST(LoraTrain, AdapterDirectoryHasPeftNamesConfigAndInit) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  testing::TempDir tmp;
  const auto r = testing::run_stratum("train --model " + dir + " --data " + dir +
                                      "/tokens.bin --batch 2 --seq 16 --steps 1 --lr 0 --lora-r 2 --lora-alpha 4 "
                                      "--lora-targets c_proj --threads 2 --quiet --save " + tmp.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string saved = checkpoint_model_dir(tmp.file("out"));
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(saved + "/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 4.0);
  EXPECT_EQ(config["lora_dropout"], 0.0);
  EXPECT_EQ(config["target_modules"], nlohmann::json::array({"c_proj"}));
  EXPECT_EQ(config["fan_in_fan_out"], true);
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["use_rslora"], false);
  EXPECT_EQ(config["base_model_name_or_path"].get<std::string>().back(), '2') << config.dump();  // .../tiny_gpt2
  const GptConfig cfg = model_read_config(dir);
  const SafetensorsFile adapter = SafetensorsFile::open(saved + "/adapter_model.safetensors");
  const int C = cfg.n_embd;
  std::set<std::string> names;
  for (const auto& info : adapter.tensors()) names.insert(info.name);
  std::set<std::string> expected;
  for (int i = 0; i < cfg.n_layer; ++i)
    for (const char* m : {"attn.c_proj", "mlp.c_proj"})
      for (const char* ab : {"lora_A", "lora_B"})
        expected.insert("base_model.model.transformer.h." + std::to_string(i) + "." + m + "." + ab + ".weight");
  EXPECT_EQ(names, expected);
  const auto* a = adapter.find("base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight");
  const auto* b = adapter.find("base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 4 * C}));  // (r, in)
  EXPECT_EQ(b->shape, (std::vector<std::int64_t>{C, 2}));      // (out, r)
  std::vector<float> av(static_cast<std::size_t>(a->numel())), bv(static_cast<std::size_t>(b->numel()));
  adapter.read_f32(*a, av.data());
  adapter.read_f32(*b, bv.data());
  const double bound = 1.0 / std::sqrt(4.0 * C);
  double largest = 0.0;
  for (float v : av) largest = std::max(largest, std::abs(static_cast<double>(v)));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.5 * bound);
  for (float v : bv) EXPECT_EQ(v, 0.0f);
  // The adapted model starts as the base: the first loss is the base's.
  const auto base_run = testing::run_stratum("train --model " + dir + " --data " + dir +
                                             "/tokens.bin --batch 2 --seq 16 --steps 1 --lr 0 --threads 2 --quiet");
  const auto loss_of = [](const std::string& e) {
    const auto at = e.find("final loss ");
    return at == std::string::npos ? std::string() : e.substr(at, e.find(',', at) - at);
  };
  EXPECT_EQ(loss_of(r.errors), loss_of(base_run.errors));
}

// --optimizer zo-sgd with adapters: only the adapters are perturbed and updated (the base is
// read), following tools/torch_zo.py's MeZO run of the same initial adapters over the frozen base
// (reference_lora_zo.safetensors; z named by the adapters' slot names); the same bits at the
// smallest budget. Tolerances as ZoTrain's (tests/zo_train_test.cpp).
void check_zo_run(const std::string& golden) {
  const std::string dir = source_path(golden);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference_lora_zo.safetensors");
  const nlohmann::json a = nlohmann::json::parse(ref.metadata().at("zo_args"));
  const std::string flags = testing::zo_flags(a);
  const std::string base =
      "train --model " + dir + " --data " + dir + "/tokens.bin --lora-init " + dir + "/lora_init" + flags;
  testing::TempDir tmp;
  const auto ram = testing::run_stratum(base + " --log " + tmp.file("log.jsonl") + " --save " + tmp.file("out"));
  ASSERT_EQ(ram.exit_code, 0) << ram.errors;
  double largest_dg = 0.0;
  EXPECT_EQ(testing::zo_log_mismatch(ref, read_jsonl(tmp.file("log.jsonl")), &largest_dg), "");
  const std::string saved = checkpoint_model_dir(tmp.file("out"));
  EXPECT_FALSE(file_exists(saved + "/optimizer.safetensors")) << "zo-sgd keeps no optimizer state";
  const double err = adapters_vs_reference(saved, ref, "final.", /*strip=*/true);
  EXPECT_LE(err, 1e-5);
  std::printf("[lora zo] %s: largest |adapter - reference| %.2e\n", golden.c_str(), err);
  const GptConfig cfg = model_read_config(dir);
  const std::size_t min_budget =
      train_min_budget_bytes(cfg, a["batch"].get<int>(), a["seq"].get<int>(), 2, ActivationPolicy::Recompute, 1.0, Precision::Fp32,
                             TrainOptimizer::ZoSgd, adapter_config_read(dir + "/lora_init", lora_family(cfg)));
  EXPECT_EQ(testing::streamed_runs_mismatch(base, min_budget, tmp.path(), testing::params_hash_of(ram.errors), {0, 2}),
            "");
}

TEST(LoraTrain, Gpt2ZoSgdOverAdaptersFollowsTheMeZoReference) { check_zo_run("tests/golden/tiny_gpt2"); }
TEST(LoraTrain, LlamaZoSgdOverAdaptersFollowsTheMeZoReference) { check_zo_run("tests/golden/tiny_llama"); }

// stratum merge: the merged model's loss on batch 0 is the adapted model's (the reference's first
// loss, computed with the adapters unmerged), for both families and Phi-3's fused modules (each part
// into its rows of the fused weight); bad input gets one line.
TEST(LoraTrain, MergeFoldsTheAdapterIntoTheBase) {
  for (const char* golden : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama", "tests/golden/tiny_phi3"}) {
    const std::string dir = source_path(golden);
    testing::TempDir tmp;
    const auto r = testing::run_stratum("merge --model " + dir + " --adapter " + dir + "/lora_init --out " +
                                        tmp.file("merged") + " --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    const nlohmann::json a = nlohmann::json::parse(std::ifstream(dir + "/lora_args.json"));
    const int B = a["batch"].get<int>(), T = a["seq"].get<int>();
    const GptConfig cfg = model_read_config(tmp.file("merged"));
    const ParamLayout layout = ParamLayout::of(cfg);
    RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, B, T));
    model_load_weights(tmp.file("merged"), layout, store);
    ThreadPool pool(2);
    Executor exec(pool, cfg, store, B, T);
    const testing::GoldenBatch batch = testing::golden_batch(dir, B, T);
    const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference_lora.safetensors");
    EXPECT_NEAR(exec.loss(batch.inputs.data(), batch.targets.data(), B, T), golden_f32(ref, "train_losses")[0], 1e-5)
        << golden;
  }
  const std::string gpt2 = source_path("tests/golden/tiny_gpt2");
  testing::TempDir tmp;
  const auto wrong = testing::run_stratum("merge --model " + gpt2 + " --adapter " +
                                          source_path("tests/golden/tiny_llama") + "/lora_init --out " + tmp.file("m"));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.errors.find("is not a linear layer of a gpt2 block"), std::string::npos) << wrong.errors;
  EXPECT_FALSE(file_exists(tmp.file("m") + "/config.json"));
  const auto missing = testing::run_stratum("merge --model " + gpt2 + " --out " + tmp.file("m"));
  EXPECT_NE(missing.errors.find("--adapter DIR is required"), std::string::npos) << missing.errors;
}

// A bf16 base merges into bf16 weights (PEFT's merge into bf16 weights: w + s B A rounded once):
// every tensor BF16, torch_dtype bfloat16, the tensors no adapter touches bit-identical to the
// base's, and the merged model's loss that of the adapters over the bf16 base within bf16 rounding.
TEST(LoraTrain, MergeKeepsABf16BaseBf16) {
  const std::string dir = source_path("tests/golden/tiny_llama");
  testing::TempDir tmp;
  const std::string base = tmp.file("bf16");
  testing::bf16_model_copy(dir, base);
  const auto r = testing::run_stratum("merge --model " + base + " --adapter " + dir + "/lora_init --out " +
                                      tmp.file("merged") + " --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("(bf16, as the base)"), std::string::npos) << r.errors;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(tmp.file("merged/config.json")))["torch_dtype"], "bfloat16");
  const SafetensorsFile merged = SafetensorsFile::open(tmp.file("merged/model.safetensors"));
  const SafetensorsFile original = SafetensorsFile::open(base + "/model.safetensors");
  int same = 0, changed = 0;
  for (const auto& info : merged.tensors()) {
    EXPECT_EQ(info.dtype, DType::BF16) << info.name;
    const auto* o = original.find(info.name);
    ASSERT_NE(o, nullptr) << info.name;
    std::vector<float> a(static_cast<std::size_t>(info.numel())), b(a.size());
    merged.read_f32(info, a.data());
    original.read_f32(*o, b.data());
    const bool adapted =
        info.name.find("_proj.weight") != std::string::npos && info.name.find("layers.") != std::string::npos;
    if (adapted) changed += a != b;
    else same += a == b;
    if (!adapted) {
      EXPECT_EQ(a, b) << info.name;
    }
  }
  EXPECT_EQ(changed, 2 * 7) << "every adapted projection of both layers moved";
  EXPECT_GT(same, 0);
  const nlohmann::json args = nlohmann::json::parse(std::ifstream(dir + "/lora_args.json"));
  const int B = args["batch"].get<int>(), T = args["seq"].get<int>();
  const testing::GoldenBatch batch = testing::golden_batch(dir, B, T);
  const auto loss_of = [&](const std::string& model, const std::string& adapter) {
    const GptConfig cfg = model_read_config(model);
    const ParamLayout layout =
        adapter.empty() ? ParamLayout::of(cfg) : ParamLayout::of(cfg, adapter_config_read(adapter, lora_family(cfg)));
    RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, B, T));
    model_load_weights(model, layout, store);
    if (!adapter.empty()) adapter_load_weights(adapter, layout, store);
    ThreadPool pool(2);
    Executor exec(pool, cfg, store, B, T);
    return exec.loss(batch.inputs.data(), batch.targets.data(), B, T);
  };
  const float adapted = loss_of(base, dir + "/lora_init"), folded = loss_of(tmp.file("merged"), "");
  EXPECT_NEAR(folded, adapted, 1e-2);
  std::printf("[lora merge bf16] adapted loss %.6f, merged bf16 %.6f\n", adapted, folded);
}

// generate --adapter: the decoder's logits with the adapters unmerged (row dot products for the
// base, GEMMs for the adapters) against the training forward's with the same adapters
// (Executor::logits_last), GPT-2 and Llama, in RAM and streamed at the smallest budget; a bf16
// base keeps its adapters fp32; and the CLI's greedy continuation equals the merged model's.
std::vector<float> decode_logits(const std::string& dir, const std::string& adapter, bool bf16, const std::string& offload,
                                 const std::vector<std::int32_t>& ids) {
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg, adapter_config_read(adapter, lora_family(cfg)));
  const int ctx = static_cast<int>(ids.size());
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, 1, ctx), bf16);
  std::unique_ptr<SegmentStore> store;
  if (!offload.empty()) {
    TieredStoreOptions so;
    so.budget_bytes = Decoder::min_store_bytes(units);
    so.offload_dir = offload;
    store = std::make_unique<TieredSegmentStore>(units, so);
  } else {
    store = std::make_unique<RamSegmentStore>(units);
  }
  model_load_weights(dir, layout, *store);
  adapter_load_weights(adapter, layout, *store);
  ThreadPool pool(2);
  Decoder decoder(pool, cfg, *store, 1, ctx);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  const int past = 0;
  decoder.step(ids.data(), 1, ctx, &past, logits.data());
  return logits;
}

TEST(LoraTrain, GenerateWithAdapterMatchesTheAdaptedForward) {
  const std::vector<std::int32_t> ids = {3, 17, 42, 5, 9, 1, 7};
  for (const char* golden : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama", "tests/golden/tiny_phi3"}) {
    const std::string dir = source_path(golden), adapter = dir + "/lora_init";
    const GptConfig cfg = model_read_config(dir);
    const ParamLayout layout = ParamLayout::of(cfg, adapter_config_read(adapter, lora_family(cfg)));
    const int T = static_cast<int>(ids.size());
    RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, 1, T));
    model_load_weights(dir, layout, store);
    adapter_load_weights(adapter, layout, store);
    ThreadPool pool(2);
    Executor exec(pool, cfg, store, 1, T);
    std::vector<float> want(static_cast<std::size_t>(cfg.vocab_size));
    exec.logits_last(ids.data(), T, want.data());
    testing::TempDir tmp;
    const std::vector<float> ram = decode_logits(dir, adapter, false, "", ids);
    const std::vector<float> streamed = decode_logits(dir, adapter, false, tmp.path(), ids);
    double worst = 0.0, spread = 0.0;
    for (std::size_t v = 0; v < want.size(); ++v) {
      worst = std::max(worst, std::abs(static_cast<double>(ram[v]) - want[v]));
      spread = std::max(spread, std::abs(static_cast<double>(want[v])));
    }
    EXPECT_LE(worst, 1e-5 * (1 + spread)) << golden;
    EXPECT_EQ(ram, streamed) << golden << ": the budget must not change the bits";
  }
  // A bf16 base (Note [bf16 weights]) with an fp32 adapter: the adapter still moves the logits.
  const std::string llama = source_path("tests/golden/tiny_llama");
  const std::string bf16 = source_path("tests/golden/tiny_llama_bf16");
  const std::vector<float> with = decode_logits(bf16, llama + "/lora_init", true, "", ids);
  const std::vector<float> fp32 = decode_logits(llama, llama + "/lora_init", false, "", ids);
  double gap = 0.0;
  for (std::size_t v = 0; v < with.size(); ++v) gap = std::max(gap, std::abs(static_cast<double>(with[v]) - fp32[v]));
  EXPECT_LT(gap, 0.1) << "bf16 rounding of the base only";
  // The CLI: greedy ids with the adapter unmerged equal the merged model's.
  testing::TempDir tmp;
  ASSERT_EQ(testing::run_stratum("merge --model " + llama + " --adapter " + llama + "/lora_init --out " +
                                 tmp.file("merged")).exit_code, 0);
  const std::string gen = " --temperature 0 --max-tokens 8 --no-stop --output-ids --prompt-ids 4,8,15,16";
  const auto unmerged = testing::run_stratum("generate --model " + llama + " --adapter " + llama + "/lora_init" + gen);
  const auto merged = testing::run_stratum("generate --model " + tmp.file("merged") + gen);
  ASSERT_EQ(unmerged.exit_code, 0) << unmerged.errors;
  ASSERT_EQ(merged.exit_code, 0) << merged.errors;
  EXPECT_EQ(unmerged.output, merged.output);
  const auto base = testing::run_stratum("generate --model " + llama + gen);
  EXPECT_NE(unmerged.output, base.output) << "the adapter changes the continuation";
}

// Note [frozen bf16 base]: LoRA over a bf16 checkpoint keeps the frozen layers bf16 in the
// training store and gives the bits of the fp32 widening (losses and params hash over 3 AdamW
// steps, with dropout), in RAM and streamed at the smallest budget, for both families (and
// Qwen2, whose bf16 biases are widened beside the norm weights) and both precisions; its layer
// units and its minimum budget are smaller; the CLI keeps it bf16 and streams it with the same bits.
TEST(LoraTrain, Bf16BaseKeptAsStoredGivesTheWidenedBits) {
  for (const char* golden :
       {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama", "tests/golden/tiny_qwen2", "tests/golden/tiny_qwen3",
        "tests/golden/tiny_phi3", "tests/golden/tiny_gemma", "tests/golden/tiny_gemma3"}) {
    const std::string dir = source_path(golden);
    testing::TempDir tmp;
    const std::string base = tmp.file("bf16");
    testing::bf16_model_copy(dir, base);
    ASSERT_TRUE(model_weights_bf16(base));
    const nlohmann::json a = nlohmann::json::parse(std::ifstream(dir + "/lora_args.json"));
    const int B = a["batch"].get<int>(), T = a["seq"].get<int>();
    const GptConfig cfg = model_read_config(base);
    LoraConfig lora = adapter_config_read(dir + "/lora_init", lora_family(cfg));
    lora.dropout = 0.1;
    const ParamLayout layout = ParamLayout::of(cfg, lora);
    const testing::GoldenBatch batch = testing::golden_batch(dir, B, T);
    struct Run {
      std::vector<float> losses;
      std::uint64_t hash = 0;
      std::size_t layer_param_bytes = 0, min_store = 0;
    };
    auto run = [&](bool bf16, bool streamed, Precision precision = Precision::Fp32) {
      const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T), UnitSet::Training, bf16);
      ThreadPool pool(2);
      std::unique_ptr<SegmentStore> store;  // outlives the executor
      Executor exec(pool, cfg, units, B, T, ActivationPolicy::Recompute, OptimizerMode::Inline, precision);
      if (streamed) {
        TieredStoreOptions so;
        so.budget_bytes = exec.min_store_bytes();
        so.offload_dir = tmp.file("offload");
        std::filesystem::create_directories(so.offload_dir);
        store = std::make_unique<TieredSegmentStore>(units, so);
      } else {
        store = std::make_unique<RamSegmentStore>(units);
      }
      exec.attach(*store);
      model_load_weights(base, layout, *store);
      adapter_load_weights(dir + "/lora_init", layout, *store);
      Run r;
      for (long step = 0; step < 3; ++step) {
        exec.lora_dropout_step(7, step);
        r.losses.push_back(exec.train_step(batch.inputs.data(), batch.targets.data(), B, T,
                                           AdamWHyper{1e-2, 0.9, 0.95, 1e-8, step + 1}, 0.1, 1.0)
                               .loss);
      }
      exec.sync();
      r.hash = model_params_hash(layout, *store);
      r.layer_param_bytes = units.bytes(units.index(layout.layer_segment(0), SegmentKind::Params));
      r.min_store = exec.min_store_bytes();
      return r;
    };
    const Run wide = run(false, false), kept = run(true, false), streamed = run(true, true);
    EXPECT_EQ(kept.losses, wide.losses) << golden;
    EXPECT_EQ(kept.hash, wide.hash) << golden << ": the bf16 base must give its fp32 widening's bits";
    EXPECT_EQ(streamed.losses, wide.losses) << golden;
    EXPECT_EQ(streamed.hash, wide.hash) << golden;
    EXPECT_LT(kept.layer_param_bytes, wide.layer_param_bytes) << golden;
    EXPECT_LT(kept.min_store, wide.min_store) << golden;
    // --precision bf16: the bf16 weights go to the bf16 products as they are (Ops::sgemm_b16).
    const Run wide16 = run(false, false, Precision::Bf16), kept16 = run(true, true, Precision::Bf16);
    EXPECT_EQ(kept16.losses, wide16.losses) << golden;
    EXPECT_EQ(kept16.hash, wide16.hash) << golden;
    EXPECT_NE(wide16.hash, wide.hash) << golden << ": bf16 products are not fp32 ones";

    // The CLI: a bf16 --model keeps its layers bf16 (the memory line counts them at 2 bytes) and
    // gives the same bits in RAM and at its smallest budget.
    const std::string train = "train --model " + base + " --data " + dir + "/tokens.bin --lora-init " + dir +
                              "/lora_init --batch 2 --seq 16 --steps 3 --lr 1e-2 --lora-dropout 0.1 --threads 2";
    const auto ram = testing::run_stratum(train);
    ASSERT_EQ(ram.exit_code, 0) << ram.errors;
    const auto wide_run = testing::run_stratum("train --model " + dir + " --data " + dir + "/tokens.bin --lora-init " +
                                               dir + "/lora_init --batch 2 --seq 16 --steps 1 --threads 2");
    const auto params_text = [](const std::string& e) {
      const auto at = e.find("state: params ");
      return at == std::string::npos ? std::string() : e.substr(at, e.find(',', at) - at);
    };
    EXPECT_NE(params_text(ram.errors), "");
    EXPECT_NE(params_text(ram.errors), params_text(wide_run.errors)) << ram.errors;
    const std::size_t min_budget = train_min_budget_bytes(cfg, 2, 16, 2, ActivationPolicy::Recompute, 1.0, Precision::Fp32,
                                                          TrainOptimizer::AdamW, lora, true);
    EXPECT_LT(min_budget, train_min_budget_bytes(cfg, 2, 16, 2, ActivationPolicy::Recompute, 1.0, Precision::Fp32, TrainOptimizer::AdamW, lora));
    EXPECT_EQ(testing::streamed_runs_mismatch(train + " --quiet", min_budget, tmp.path(),
                                              testing::params_hash_of(ram.errors), {0, 2}),
              "")
        << golden;
  }
}

// Crash safety of LoRA checkpoints (the adapter directory, its optimizer and trainer state): a
// run with dropout saving every step, SIGKILLed at random moments (many mid-save) and resumed
// over the same --model base, alternating in RAM and at the smallest budget, ends with the
// uninterrupted run's bits (testing::crash_rounds, as CheckpointCrash for full training).
TEST(LoraTrain, KilledMidCheckpointResumesToTheUninterruptedBits) {
  const std::string dir = source_path("tests/golden/tiny_llama");
  testing::TempDir tmp;
  const std::string train = "train --model " + dir + " --data " + dir + "/tokens.bin --lora-init " + dir +
                            "/lora_init --lora-dropout 0.1 --batch 2 --seq 16 --steps 30 --lr 1e-2 --threads 2 --quiet";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ref = testing::run_stratum(train + " --save " + tmp.file("ref") + " --save-every 1");
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(ref.exit_code, 0) << ref.errors;
  const GptConfig cfg = model_read_config(dir);
  LoraConfig lora = adapter_config_read(dir + "/lora_init", lora_family(cfg));
  lora.dropout = 0.1;
  const std::size_t min_budget =
      train_min_budget_bytes(cfg, 2, 16, 2, ActivationPolicy::Recompute, 1.0, Precision::Fp32, TrainOptimizer::AdamW, lora);
  std::filesystem::create_directories(tmp.file("off"));
  const testing::CrashRounds c = testing::crash_rounds(
      tmp.path(), run_ms, testing::params_hash_of(ref.errors), 6, [&](const std::string& root, int run) {
        // A kill between a checkpoint's rename and `latest`: resume (CheckpointCrash says why).
        std::string args = !checkpoint_list(root).empty()
                               ? "train --model " + dir + " --resume " + root + " --quiet --threads 2"
                               : train + " --save " + root + " --save-every 1";
        if (run % 2 == 0)
          args += " --mem-budget " + std::to_string(min_budget) + " --offload-dir " + tmp.file("off") + " --prefetch " +
                  std::to_string(run % 3);
        return args;
      });
  EXPECT_EQ(c.problem, "");
  std::printf("[lora crash test] %d kills, %d runs, %d rounds, every round exact\n", c.kills, c.runs, c.rounds);
}

// A LoRA checkpoint names its base (adapter_config.json's base_model_name_or_path, the first
// run's --model): --resume without --model takes it (it failed on a params hash that did not
// match), and info describes an adapter directory (it failed: no model.safetensors).
TEST(LoraTrain, AResumeFindsItsBaseAndInfoDescribesTheAdapter) {
  const std::string gpt2 = source_path("tests/golden/tiny_gpt2");
  testing::TempDir tmp;
  const std::string root = tmp.file("ck");
  const auto full = testing::run_stratum("train --model " + gpt2 + " --data " + gpt2 + "/tokens.bin --lora-r 4 --batch 2 "
                                         "--seq 16 --steps 4 --threads 2 --quiet --save-every 2 --keep 5 --save " + root);
  ASSERT_EQ(full.exit_code, 0) << full.errors;
  auto r = testing::run_stratum("train --resume " + root + "/step-00000002 --save " + tmp.file("again") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(testing::params_hash_of(r.errors), testing::params_hash_of(full.errors)) << r.errors;
  r = testing::run_stratum("info " + root + "/step-00000004");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  for (const char* words : {"LoRA adapter", "r=4, alpha 16", "on c_attn (GPT-2)", "every one matches manifest.json",
                            "over a GPT-2 base", "adapter_model.safetensors"})
    EXPECT_NE(r.output.find(words), std::string::npos) << words << "\n" << r.output;
  r = testing::run_stratum("info " + gpt2 + "/lora_init");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("no manifest.json (a PEFT directory)"), std::string::npos) << r.output;
  // A base that is not there any more: said, with the flag to give.
  const std::string base = tmp.file("base");
  std::filesystem::copy(gpt2, base, std::filesystem::copy_options::recursive);
  r = testing::run_stratum("train --model " + base + " --data " + gpt2 + "/tokens.bin --lora-r 4 --batch 2 --seq 16 "
                           "--steps 2 --save-every 1 --quiet --save " + tmp.file("ck2"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::filesystem::remove_all(base);
  r = testing::run_stratum("train --resume " + tmp.file("ck2") + "/step-00000001 --quiet");
  EXPECT_EQ(r.exit_code, 1) << r.errors;
  EXPECT_NE(r.errors.find("give it with --model BASE (adapter_config.json names '"), std::string::npos) << r.errors;
}

// One line each, non-zero exit, nothing saved.
TEST(LoraTrain, BadInputGetsOneLine) {
  const std::string gpt2 = source_path("tests/golden/tiny_gpt2");
  const std::string llama = source_path("tests/golden/tiny_llama");
  testing::TempDir tmp;
  // An adapter directory of another PEFT type.
  const std::string ia3 = tmp.file("ia3");
  std::filesystem::create_directories(ia3);
  std::ofstream(ia3 + "/adapter_config.json") << R"({"peft_type": "IA3", "target_modules": ["c_attn"]})";
  const std::string train = "train --data " + gpt2 + "/tokens.bin --batch 2 --seq 16 --steps 1 --quiet --save " +
                            tmp.file("out") + " --model ";
  const std::pair<std::string, std::string> cases[] = {
      {train + gpt2 + " --lora-r 4 --lora-targets q_proj", "'q_proj' is not a linear layer of a gpt2 block; valid:"},
      {train + llama + " --lora-r 4 --lora-targets c_attn", "valid: self_attn.q_proj (q_proj)"},
      {train + gpt2 + " --lora-r -1", "--lora-r"},
      {train + gpt2 + " --lora-r 4 --lora-alpha 0", "--lora-alpha"},
      {train + gpt2 + " --lora-r 4 --lora-dropout 1", "--lora-dropout"},
      {train + gpt2 + " --lora-r 4 --lora-targets c_attn,,c_fc", "has an empty name"},
      {train + gpt2 + " --lora-init " + ia3, "peft_type is 'IA3'; only LORA adapters"},
      {train + gpt2 + " --lora-init " + llama + "/lora_init", "is not a linear layer of a gpt2 block"},
      {train + gpt2 + " --lora-init " + tmp.file("nowhere"), "does not exist"},
      {train + gpt2 + " --lora-init " + gpt2 + "/lora_init --lora-r 8", "differs from r=4"},
      {train + gpt2 + " --lora-init " + gpt2 + "/lora_init --lora-alpha 3", "differs from lora_alpha"},
      {train + gpt2 + " --lora-init " + gpt2 + "/lora_init --lora-rslora", "differs from use_rslora false"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = testing::run_stratum(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.errors.find(expected), std::string::npos) << args << "\n" << r.errors;
    EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << args << "\n" << r.errors;
    EXPECT_FALSE(file_exists(tmp.file("out") + "/latest")) << args;
  }
  // A shape mismatch: the GPT-2 adapter over a GPT-2 of another width.
  ASSERT_EQ(testing::run_stratum("train --data " + gpt2 + "/tokens.bin --layers 2 --heads 4 --embd 64 --ctx 64 "
                                 "--vocab 101 --batch 2 --seq 16 --steps 1 --quiet --save " + tmp.file("wide")).exit_code,
            0);
  const auto wide = testing::run_stratum("train --data " + gpt2 + "/tokens.bin --model " + tmp.file("wide") +
                                         " --batch 2 --seq 16 --steps 1 --quiet --lora-init " + gpt2 + "/lora_init");
  EXPECT_NE(wide.exit_code, 0);
  EXPECT_NE(wide.errors.find("has shape"), std::string::npos) << wide.errors;
  EXPECT_NE(wide.errors.find("was the adapter made for another base model?"), std::string::npos) << wide.errors;
}

// adapter_config.json's reader: one line naming the field for each malformed input.
TEST(AdapterConfig, MalformedInputTable) {
  const std::string ok = R"("peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"])";
  EXPECT_EQ(adapter_config_parse("{" + ok + "}", "a.json", LoraFamily::Llama).r, 8);
  EXPECT_EQ(adapter_config_parse("{" + ok + R"(, "use_rslora": true, "lora_dropout": 0.05, "rank_pattern": {},
             "modules_to_save": null, "fan_in_fan_out": false, "bias": "none"})", "a.json", LoraFamily::Llama)
                .scale(),
            16.0f / std::sqrt(8.0f));
  // As PEFT: names the model lacks are allowed beside one that matches (a list shared across
  // families), and adapt nothing; only when none matches is the adapter refused.
  const LoraConfig shared = adapter_config_parse(
      R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "c_attn", "v_proj"]})", "a.json",
      LoraFamily::Llama);
  EXPECT_EQ(lora_targets_text(shared), "q_proj,v_proj");
  EXPECT_EQ(lora_targets_text(adapter_config_parse(
                R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "c_attn"]})",
                "a.json", LoraFamily::Gpt2)),
            "c_attn");
  const std::pair<std::string, std::string> cases[] = {
      {"", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {R"({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})", "field 'peft_type' is missing"},
      {R"({"peft_type": "PREFIX_TUNING"})", "peft_type is 'PREFIX_TUNING'"},
      {R"({"peft_type": "LORA", "lora_alpha": 16, "target_modules": ["q_proj"]})", "field 'r' is missing"},
      {R"({"peft_type": "LORA", "r": 0, "lora_alpha": 16, "target_modules": ["q_proj"]})", "field 'r' is 0"},
      {R"({"peft_type": "LORA", "r": 8.5, "lora_alpha": 16, "target_modules": ["q_proj"]})", "must be an integer"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": -1, "target_modules": ["q_proj"]})", "'lora_alpha' is -1"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": "q_proj|v_proj"})",
       "a regular expression is not supported"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": []})", "non-empty list"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": [3]})", "must list strings"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]})",
       "'c_attn' is not a linear layer of a llama block"},
      {"{" + ok + R"(, "bias": "all"})", "trained biases are not supported"},
      {"{" + ok + R"(, "lora_dropout": 1.5})", "'lora_dropout' must be in [0, 1)"},
      {"{" + ok + R"(, "modules_to_save": ["lm_head"]})", "'modules_to_save' is set"},
      {"{" + ok + R"(, "rank_pattern": {"q_proj": 4}})", "'rank_pattern' is set"},
      {"{" + ok + R"(, "use_dora": true})", "'use_dora' is set"},
      {"{" + ok + R"(, "use_rslora": "yes"})", "'use_rslora' must be true or false"},
  };
  for (const auto& [text, expected] : cases) {
    try {
      adapter_config_parse(text, "a.json", LoraFamily::Llama);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(expected), std::string::npos) << text << "\n" << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace stratum

// A target named twice is one target, written once (PEFT keeps target_modules as a set; Stratum
// wrote the duplicate into adapter_config.json).
TEST(LoraTrain, ATargetNamedTwiceIsOneTarget) {
  const stratum::LoraConfig lora =
      stratum::lora_config_make(stratum::LoraFamily::Llama, 4, 8, "q_proj,v_proj,q_proj", false, 0.0);
  EXPECT_EQ(stratum::lora_targets_text(lora), "q_proj,v_proj");
}
