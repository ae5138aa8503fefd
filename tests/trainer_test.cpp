// Whole training runs: the PyTorch loss curve (through the CLI, as a user runs it), the final
// parameters after AdamW, run-to-run bit-exactness, validation and saving.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "integration_util.h"
#include "weights/model_io.h"
#include "train/checkpoint.h"
#include "store/segment_store.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::read_jsonl;
using testing::source_path;


// Trains a golden tiny model (GPT-2 or Llama) with the exact PyTorch hyper-parameters through the
// CLI and checks the logged loss / grad-norm / lr curves and the final parameters; returns the
// final parameters' hash.
// loose: tensors (by name suffix) checked to another bound than 2e-5 (Qwen2's k biases, below).
// data: the golden directory's token file.
std::uint64_t check_golden_run(const std::string& args_file, const std::string& reference_file,
                               const std::string& golden = "tests/golden/tiny_gpt2", const std::string& extra = "",
                               const std::pair<std::string, double>& loose = {},
                               const std::string& data = "tokens.bin") {
  const std::string dir = source_path(golden);
  std::ifstream in(dir + "/" + args_file);
  const nlohmann::json args = nlohmann::json::parse(in);
  testing::TempDir tmp;
  const auto r = testing::run_stratum("train --model " + dir + " --data " + dir + "/" + data +
                                      testing::train_flags(args) + " --threads 2 --quiet --log " + tmp.file("log.jsonl") +
                                      " --save " + tmp.file("out") + extra);
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  if (r.exit_code != 0) return 0;
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/" + reference_file);
  const auto losses = golden_f32(ref, "train_losses");
  const auto norms = golden_f32(ref, "train_grad_norms");
  const auto lrs = golden_f32(ref, "train_lrs");
  const auto log = read_jsonl(tmp.file("log.jsonl"));
  EXPECT_EQ(log.size(), losses.size());
  if (log.size() != losses.size()) return 0;
  for (std::size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i]["step"].get<long>(), static_cast<long>(i + 1));
    EXPECT_NEAR(log[i]["loss"].get<double>(), losses[i], 1e-4) << "step " << i + 1;
    EXPECT_NEAR(log[i]["grad_norm"].get<double>(), norms[i], 1e-4 * (1 + norms[i])) << "step " << i + 1;
    EXPECT_NEAR(log[i]["lr"].get<double>(), lrs[i], 1e-9) << "step " << i + 1;
    for (const char* key : {"step_ms", "tokens_per_s"}) EXPECT_GT(log[i][key].get<double>(), 0.0) << key;
  }
  if (ref.find("val_loss") != nullptr) {  // the last evaluation (Note [masked loss])
    EXPECT_NEAR(log.back()["val_loss"].get<double>(), golden_f32(ref, "val_loss")[0], 1e-4);
  }
  // Final parameters after the AdamW steps, read back from the saved HF directory.
  const testing::SavedVsReference saved = testing::saved_vs_reference(checkpoint_model_dir(tmp.file("out")), ref);
  for (const auto& [name, max_err] : saved.max_error)
    EXPECT_LE(max_err, !loose.first.empty() && name.ends_with(loose.first) ? loose.second : 2e-5) << name;
  return saved.params_hash;
}

// Note [bf16 products]: --precision bf16 follows PyTorch's CPU-autocast run of the tiny GPT-2
// (tools/make_golden.py --only autocast; make_llama_golden.py for the Llama), gives the same bits
// under a memory budget (streaming) as in RAM, and other bits than fp32 (the products really are
// rounded). The tolerance: autocast's own bf16 run
// differs from its fp32 run by at most 9.3e-5 on this model (its logits are near-uniform, so the
// rounding of ~2^-9 per operand moves the loss little); Stratum keeps each product's result in
// fp32 where autocast rounds it to bf16 again, so its curve may sit a like distance on the other
// side: 3e-4 allows three times that gap, and is 20x below the loss's own step-to-step movement.
void check_bf16_run(const std::string& golden, double tolerance, const std::string& budget_flag) {
  const std::string dir = source_path(golden);
  std::ifstream in(dir + "/train_args.json");
  const nlohmann::json args = nlohmann::json::parse(in);
  testing::TempDir tmp;
  const std::string base = "train --model " + dir + " --data " + dir + "/tokens.bin" + testing::train_flags(args) +
                           " --threads 2 --quiet --precision bf16";
  const auto ram = testing::run_stratum(base + " --log " + tmp.file("log.jsonl"));
  ASSERT_EQ(ram.exit_code, 0) << ram.errors;
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference_bf16.safetensors");
  const auto losses = golden_f32(ref, "train_losses");
  const auto log = read_jsonl(tmp.file("log.jsonl"));
  ASSERT_EQ(log.size(), losses.size());
  for (std::size_t i = 0; i < log.size(); ++i)
    EXPECT_NEAR(log[i]["loss"].get<double>(), losses[i], tolerance) << "step " << i + 1;
  const auto hash = testing::params_hash_of;
  const auto budget = testing::run_stratum(base + budget_flag + " --offload-dir " + tmp.path() + " --prefetch 2");
  ASSERT_EQ(budget.exit_code, 0) << budget.errors;
  EXPECT_EQ(hash(budget.errors), hash(ram.errors)) << "streaming must not change a bit";
  const auto fp32 = testing::run_stratum("train --model " + dir + " --data " + dir + "/tokens.bin" +
                                         testing::train_flags(args) + " --threads 2 --quiet");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.errors;
  EXPECT_NE(hash(fp32.errors), hash(ram.errors)) << "bf16 products must change the bits";
  EXPECT_EQ(hash(ram.errors).size(), 16u);
}

TEST(Trainer, Bf16FollowsPyTorchAutocastAndKeepsItsBitsUnderABudget) {
  check_bf16_run("tests/golden/tiny_gpt2", 3e-4, " --mem-budget 1000K");
}

// A CPU where oneDNN has no bf16 matmul (here: its ISA capped at AVX2, as on a machine without
// AVX-512): --precision bf16 still trains, multiplying the rounded operands in fp32 through
// OpenBLAS (it stopped with "no bf16 matrix product"), says once that there is no speed-up, and
// still follows autocast and keeps its bits under a budget.
TEST(Trainer, Bf16WithoutOneDnnBf16StillTrainsAndSaysSo) {
  const testing::ScopedEnv isa("ONEDNN_MAX_CPU_ISA", "AVX2");
  check_bf16_run("tests/golden/tiny_gpt2", 3e-4, " --mem-budget 1100K");  // fp32 copies: a larger minimum
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  const auto r = testing::run_stratum("train --model " + dir + " --data " + dir +
                                      "/tokens.bin --steps 1 --batch 4 --seq 32 --quiet --precision bf16");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("no native bf16"), std::string::npos) << r.errors;
}

// The tiny Llama (GQA, SwiGLU, RoPE, untied head), 8 steps: autocast's own bf16 and fp32 runs
// differ by up to 2.2e-3 here, Stratum's bf16 run sits within 3.0e-3 of autocast's (its products'
// results stay fp32, and its attention is fp32 where autocast's matmuls are bf16): 5e-3 allows
// about twice autocast's own bf16 effect, and is 30x below the loss's step-to-step movement.
TEST(Trainer, Bf16LlamaFollowsPyTorchAutocastAndKeepsItsBitsUnderABudget) {
  check_bf16_run("tests/golden/tiny_llama", 5e-3, " --mem-budget 1500K");
}

TEST(Trainer, LossCurveMatchesPyTorchCosineSchedule) { check_golden_run("train_args.json", "reference.safetensors"); }

TEST(Trainer, LossCurveMatchesPyTorchWithClippingAndWrap) {
  check_golden_run("train_args_clip.json", "reference_clip.safetensors");
}

// Note [masked loss]: a masked shard of prompt/answer documents (tools/make_golden.py --only
// masked), 2 micro-batches a step, one of them with no target that counts, follows PyTorch's
// cross-entropy with ignore_index over the step's counted targets, and the validation loss over
// the file's batches, in RAM and streamed through the smallest budget with the same bits.
TEST(Trainer, MaskedLossFollowsPyTorchIgnoreIndexOverTheStep) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  const std::string flags = " --grad-accum 2 --val-data " + dir + "/tokens_masked.bin --eval-every 8 --eval-batches 16";
  const std::uint64_t ram = check_golden_run("train_args_masked.json", "reference_masked.safetensors",
                                             "tests/golden/tiny_gpt2", flags, {}, "tokens_masked.bin");
  testing::TempDir offload;
  const std::uint64_t budget = check_golden_run(
      "train_args_masked.json", "reference_masked.safetensors", "tests/golden/tiny_gpt2",
      flags + " --mem-budget 1000K --offload-dir " + offload.path() + " --prefetch 2", {}, "tokens_masked.bin");
  EXPECT_NE(ram, 0u);
  EXPECT_EQ(budget, ram) << "streaming must not change a bit";
}

// The tiny Llama (GQA, llama3 rope, untied head, sharded) trained by the CLI matches PyTorch's
// AdamW run, in RAM and streamed through the smallest budget, with the same bits in both.
// A golden Llama-family model's AdamW run in RAM and streamed through the smallest budget: both
// follow PyTorch (`loose`: one tensor held to another bound) with the same bits.
void check_ram_and_budget(const char* golden, const std::pair<std::string, double>& loose = {}) {
  const std::uint64_t ram = check_golden_run("train_args.json", "reference.safetensors", golden, "", loose);
  testing::TempDir offload;
  const std::uint64_t budget = check_golden_run("train_args.json", "reference.safetensors", golden,
                                                " --mem-budget 1300K --offload-dir " + offload.path() + " --prefetch 2",
                                                loose);
  EXPECT_NE(ram, 0u);
  EXPECT_EQ(budget, ram) << "streaming must not change a bit";
}

TEST(Trainer, LlamaLossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_llama"); }

// The tiny Qwen2 (a Llama with q, k and v biases; tests/golden/tiny_qwen2) likewise: its biases'
// gradients and AdamW updates (not decayed) follow PyTorch, in RAM and streamed, with one bits.
// The k biases are held to 1e-4: in the head dimensions RoPE barely turns over 16 positions
// (rope_theta 1e6), a k bias shifts every score of a query alike, which the softmax cancels, so
// their gradients there are differences of nearly equal sums, and AdamW's normalised step turns
// the rounding into up to lr a step. PyTorch's own fp32 run ends 3.8e-5 from its fp64 run there
// (every other tensor within 8e-6); Stratum's ends 6.3e-5 from PyTorch's fp32 run.
TEST(Trainer, Qwen2LossCurveMatchesPyTorchInRamAndUnderABudget) {
  check_ram_and_budget("tests/golden/tiny_qwen2", {"k_proj.bias", 1e-4});
}

// The tiny Qwen3 (per-head q and k RMSNorms, Note [qk norm]; tests/golden/tiny_qwen3) likewise:
// its norms' gradients (through the backward's recompute of the raw q and k) and AdamW updates
// follow PyTorch, in RAM and streamed, with one bits.
TEST(Trainer, Qwen3LossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_qwen3"); }
// The tiny Gemma (Note [gemma]; tests/golden/tiny_gemma): its norms' gradients through 1 + w,
// GeGLU's and the scaled embedding's, the tied head's sum of both, and AdamW on the stored w.
TEST(Trainer, GemmaLossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_gemma"); }
// The tiny Gemma 3 (Note [gemma3]; tests/golden/tiny_gemma3): its post-norms' gradients through
// the backward's recomputed outputs (Note [post norms]), its q and k norms, both ropes, and its
// sliding layer's window of 8 keys over 16 positions (Note [sliding window]).
TEST(Trainer, Gemma3LossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_gemma3"); }
// The tiny Gemma 2 (Note [gemma2]; tests/golden/tiny_gemma2): its soft-capped scores and logits
// (Note [softcapping], Note [final softcapping]), the post norms and the sliding layer.
TEST(Trainer, Gemma2LossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_gemma2"); }
// The tiny Mistral (Note [mistral window]; tests/golden/tiny_mistral): 16 positions over a window
// of 6 keys in both layers, saved back with its window.
TEST(Trainer, MistralLossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_mistral"); }
// The tiny Phi-3 (Note [phi3 fused]; tests/golden/tiny_phi3): its fused tensors saved as PyTorch's.
TEST(Trainer, Phi3LossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_phi3"); }
// The tiny Phi-3.5 (Note [longrope]; tests/golden/tiny_phi35): saved back with its long factors.
TEST(Trainer, Phi35LossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_phi35"); }
// The tiny Phi-3.5 trained at 16 positions over an original context of 12 (Note [longrope];
// tests/golden/tiny_phi35_long): the long factors' rope in every step.
TEST(Trainer, Phi35LongFactorsLossCurveMatchesPyTorchInRamAndUnderABudget) {
  check_ram_and_budget("tests/golden/tiny_phi35_long");
}
// The tiny Phi-4-mini (Note [partial rotary]; tests/golden/tiny_phi4mini): the rope's pass-through
// channels' gradients, saved back with its partial_rotary_factor.
TEST(Trainer, Phi4MiniLossCurveMatchesPyTorchInRamAndUnderABudget) { check_ram_and_budget("tests/golden/tiny_phi4mini"); }

// --row-chunk (Note [row chunks]): the tiny GPT-2's 128 rows a step in chunks of 48 and the tiny
// Llama's 32 in chunks of 12 (the last chunk shorter; boundaries inside sequences) follow
// PyTorch's curve and final weights as the default's one chunk does, with other bits than it
// (a chunk of at least B*T rows would give the default's); the same bits under a budget; and a
// resume keeps the checkpoint's chunk (continuing to the uninterrupted run's bits) and refuses
// another one with one line.
TEST(Trainer, RowChunkFollowsPyTorchAndKeepsItsBitsUnderABudgetAndAcrossAResume) {
  // Budgets that stream (the GPT-2's minimum at --row-chunk 48 is 647 KiB).
  for (const auto& [golden, rows, budget] : {std::tuple{"tests/golden/tiny_gpt2", "48", "800K"},
                                             {"tests/golden/tiny_llama", "12", "1300K"}}) {
    SCOPED_TRACE(golden);
    const std::string flag = std::string(" --row-chunk ") + rows;
    const std::uint64_t chunked = check_golden_run("train_args.json", "reference.safetensors", golden, flag);
    testing::TempDir offload;
    EXPECT_EQ(check_golden_run("train_args.json", "reference.safetensors", golden,
                               flag + " --mem-budget " + budget + " --offload-dir " + offload.path() + " --prefetch 2"),
              chunked)
        << "streaming must not change a bit";
    EXPECT_NE(check_golden_run("train_args.json", "reference.safetensors", golden), chunked)
        << "--row-chunk must change the partition";
  }
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  std::ifstream in(dir + "/train_args.json");
  const nlohmann::json args = nlohmann::json::parse(in);
  testing::TempDir tmp;
  const auto hash = testing::params_hash_of;
  const auto whole = testing::run_stratum("train --model " + dir + " --data " + dir + "/tokens.bin" +
                                          testing::train_flags(args) + " --threads 2 --quiet --row-chunk 48 --save " +
                                          tmp.file("ck") + " --save-every 10 --keep 5");
  ASSERT_EQ(whole.exit_code, 0) << whole.errors;
  EXPECT_NE(whole.errors.find("B=4 T=32, row chunks of 48 |"), std::string::npos) << whole.errors;
  const std::string from = tmp.file("ck") + "/step-00000010";
  const auto resumed = testing::run_stratum("train --resume " + from + " --threads 2 --quiet");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.errors;
  EXPECT_EQ(hash(resumed.errors), hash(whole.errors));
  const auto other = testing::run_stratum("train --resume " + from + " --threads 2 --quiet --row-chunk 64");
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.errors.find("--row-chunk"), std::string::npos) << other.errors;
  EXPECT_NE(other.errors.find("48"), std::string::npos) << other.errors;
}

TrainOptions small_run(const std::string& data) {
  TrainOptions o;
  o.config.n_layer = 2;
  o.config.n_head = 2;
  o.config.n_embd = 32;
  o.config.n_ctx = 32;
  o.config.vocab_size = 101;
  o.data_path = data;
  o.batch = 2;
  o.seq = 16;
  o.steps = 6;
  o.lr.max_lr = 1e-2;
  o.lr.warmup_steps = 2;
  o.quiet = true;
  o.threads = 2;
  return o;
}

TEST(Trainer, SameSeedSameBitsDifferentSeedDifferentBits) {
  const std::string data = source_path("tests/golden/tiny_gpt2/tokens.bin");
  TrainOptions o = small_run(data);
  const auto a = train_run(o);
  const auto b = train_run(o);
  EXPECT_EQ(a.params_hash, b.params_hash);
  EXPECT_EQ(a.final_loss, b.final_loss);
  o.shuffle = true;
  const auto c = train_run(o);
  const auto d = train_run(o);
  EXPECT_EQ(c.params_hash, d.params_hash);
  EXPECT_NE(a.params_hash, c.params_hash) << "shuffled order must differ from sequential";
  o.activations = ActivationPolicy::Keep;
  EXPECT_EQ(train_run(o).params_hash, c.params_hash) << "keeping activations must give the recompute bits";
  o.activations = ActivationPolicy::Offload;  // in RAM: the internals units stay in the RAM store
  EXPECT_EQ(train_run(o).params_hash, c.params_hash) << "offloaded activations must give the recompute bits";
  o.activations = ActivationPolicy::Auto;
  o.seed = 99;
  EXPECT_NE(train_run(o).params_hash, c.params_hash);
}

TEST(Trainer, LossDecreasesAndValidationRuns) {
  TrainOptions o = small_run(source_path("tests/golden/tiny_gpt2/tokens.bin"));
  // A corpus with structure: repeat a short pattern so the model can learn it.
  testing::TempDir tmp;
  std::vector<std::int32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back((i * 7) % 13);
  token_file_write_raw_u16(tmp.file("pattern.bin"), tokens);
  o.data_path = tmp.file("pattern.bin");
  o.steps = 40;
  o.eval_every = 20;
  o.log_path = tmp.file("log.jsonl");
  const auto r = train_run(o);
  const auto log = read_jsonl(o.log_path);
  ASSERT_EQ(log.size(), 40u);
  EXPECT_LT(r.final_loss, 0.5 * log[0]["loss"].get<double>());
  EXPECT_TRUE(log[19].contains("val_loss"));
  EXPECT_TRUE(log[39].contains("val_loss"));
  EXPECT_FALSE(log[10].contains("val_loss"));
  EXPECT_GE(r.final_val_loss, 0.0f);
  EXPECT_LT(r.final_val_loss, log[0]["loss"].get<double>());
}

// --eval-batches beyond what the held-out set holds is capped to it (it evaluated wrapped-around
// batches again, a different average): the same validation loss as asking for exactly those.
TEST(Trainer, EvalBatchesAreCappedToTheHeldOutSet) {
  testing::TempDir tmp;
  std::vector<std::int32_t> val;
  for (int i = 0; i < 3 * 2 * 16 + 5; ++i) val.push_back((i * 5) % 101);  // 3 batches of 2x16
  token_file_write_raw_u16(tmp.file("val.bin"), val);
  TrainOptions o = small_run(source_path("tests/golden/tiny_gpt2/tokens.bin"));
  o.val_data_path = tmp.file("val.bin");
  o.eval_every = 3;
  o.eval_batches = 3;
  const float exact = train_run(o).final_val_loss;
  o.eval_batches = 50;
  EXPECT_EQ(train_run(o).final_val_loss, exact);
}


// A stop request (SIGINT/SIGTERM) that arrives while the run evaluates is honoured between
// evaluation batches (it waited for the whole evaluation): here it is already set, so the first
// evaluation is abandoned before its first batch, the step is checkpointed and the run stops.
TEST(Trainer, StopRequestAbandonsAnEvaluationBetweenBatches) {
  testing::TempDir tmp;
  TrainOptions o = small_run(source_path("tests/golden/tiny_gpt2/tokens.bin"));
  o.eval_every = 1;
  o.eval_batches = 4;
  o.log_path = tmp.file("log.jsonl");
  o.save_dir = tmp.file("out");
  volatile std::sig_atomic_t stop = 1;
  o.stop_requested = &stop;
  const auto r = train_run(o);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps_done, 1);
  EXPECT_LT(r.final_val_loss, 0.0f) << "no evaluation may have completed";
  const auto log = read_jsonl(o.log_path);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_FALSE(log[0].contains("val_loss"));
  EXPECT_FALSE(r.checkpoint_dir.empty());
}

}  // namespace
}  // namespace stratum
