// Training on the CUDA backend (`--backend cuda`: the whole state in GPU memory on a
// DeviceSegmentStore, every op on the GPU): runs are bit-identical run to run on one GPU (Note
// [cuda determinism]), follow the CPU reference's losses, and save what the CPU would load. GPT-2
// and Llama, AdamW with clipping and the overlapped update, LoRA, zeroth-order. Skipped without a
// GPU; the mirror store itself is tested on the CPU (MirrorStore.* in trainer terms, below), and
// the refusals everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cross_backend_util.h"
#include "tiny_run_options.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "train/trainer.h"

namespace stratum::testing {
namespace {

TrainOptions tiny(bool llama, const std::string& log) { return tiny_train_options(llama, log); }

std::vector<double> losses(const std::string& log) {
  std::vector<double> out;
  for (const auto& j : read_jsonl(log)) out.push_back(j["loss"].get<double>());
  return out;
}

// The GPU run against the CPU run of the same options: the same step count, each loss within
// `tol` (scaled), and two GPU runs with the same bits.
void expect_gpu_follows_cpu(TrainOptions o, double tol, const char* what) {
  testing::TempDir tmp;
  o.log_path = tmp.file("cpu.jsonl");
  o.backend = Backend::Cpu;
  const TrainResult cpu = train_run(o);
  o.log_path = tmp.file("gpu.jsonl");
  o.backend = Backend::Cuda;
  const TrainResult gpu = train_run(o);
  o.log_path = tmp.file("gpu2.jsonl");
  const TrainResult again = train_run(o);
  EXPECT_EQ(gpu.params_hash, again.params_hash) << what << ": two GPU runs must give the same bits";
  const auto lc = losses(tmp.file("cpu.jsonl")), lg = losses(tmp.file("gpu.jsonl"));
  ASSERT_EQ(lc.size(), lg.size()) << what;
  ASSERT_FALSE(lc.empty()) << what;
  double worst = 0.0;
  for (std::size_t i = 0; i < lc.size(); ++i) worst = std::max(worst, std::fabs(lg[i] - lc[i]) / (1.0 + std::fabs(lc[i])));
  test::record_measured(std::string(what) + " loss error", worst);
  EXPECT_LE(worst, tol) << what << ": GPU losses drift from the CPU's (first " << lg[0] << " vs " << lc[0] << ")";
  EXPECT_LT(lg.back(), lg.front()) << what << ": the loss must go down";
}

TEST(CudaTrain, Gpt2AndLlamaFollowTheCpuWithGpuBitsThatRepeat) {
  STRATUM_REQUIRE_CUDA();
  // fp32 on both, different summation orders: 8 steps stay within ~1e-5 (measured on an H100).
  for (bool llama : {false, true}) {
    TrainOptions o = tiny(llama, "");
    o.grad_clip = 1.0;  // exact clipping: the update after the global norm
    expect_gpu_follows_cpu(o, 1e-4, llama ? "llama clipped" : "gpt2 clipped");
    o.grad_clip = 0.0;  // the overlapped update, here in schedule order on the GPU
    o.activations = ActivationPolicy::Keep;
    expect_gpu_follows_cpu(o, 1e-4, llama ? "llama overlapped keep" : "gpt2 overlapped keep");
  }
}

TEST(CudaTrain, LoraAndZerothOrderRunOnTheGpu) {
  STRATUM_REQUIRE_CUDA();
  TrainOptions lora = tiny(true, "");
  lora.lora_r = 4;
  lora.lora_alpha = 8;
  lora.lora_targets = "q_proj,v_proj,down_proj";
  lora.lora_dropout = 0.1;
  expect_gpu_follows_cpu(lora, 1e-4, "llama lora");
  TrainOptions zo = tiny(false, "");
  zo.optimizer = TrainOptimizer::ZoSgd;
  zo.lr.max_lr = 1e-4;
  expect_gpu_follows_cpu(zo, 1e-4, "gpt2 zo-sgd");
}

TEST(CudaTrain, CheckpointsFromTheGpuResumeOnTheGpu) {
  STRATUM_REQUIRE_CUDA();
  testing::TempDir tmp;
  TrainOptions o = tiny(false, "");
  o.backend = Backend::Cuda;
  const std::uint64_t straight = train_run(o).params_hash;
  o.steps = 8;
  o.save_dir = tmp.file("ckpt");
  o.save_every = 4;
  const TrainResult saved = train_run(o);
  EXPECT_EQ(saved.params_hash, straight) << "saving must not change the run";
  // Resume from step 4 on the GPU: the uninterrupted run's bits.
  o.save_dir = tmp.file("ckpt2");
  o.save_every = 0;
  o.resume_path = tmp.file("ckpt") + "/step-00000004";
  EXPECT_EQ(train_run(o).params_hash, straight);
}

// Note [device tier] on the GPU: --gpu-mem-budget at the smallest budget and a middle one, over
// RAM and over a RAM budget with an offload dir, gives the bits of the whole state on the GPU
// (the copies move bytes, the kernels are the same), streams, and stays within the budget.
// Clipped (AdamW in the update groups after the norm) and the overlapped order with kept
// activations and --grad-accum 2, AdamW on the GPU and on the CPU beside it (Note [host
// optimizer]: the CUDA AdamW is the CPU's arithmetic, so the same bits); the accumulated run also
// follows the CPU's.
TEST(CudaTrain, GpuMemoryBudgetsGiveTheWholeStatesBits) {
  STRATUM_REQUIRE_CUDA();
  for (bool llama : {false, true}) {
    for (const bool accum : {false, true}) {
      TrainOptions o = tiny(llama, "");
      o.grad_clip = accum ? 0.0 : 1.0;
      if (accum) {
        o.activations = ActivationPolicy::Keep;
        o.grad_accum = 2;
        expect_gpu_follows_cpu(o, 1e-4, llama ? "llama accum 2" : "gpt2 accum 2");
      }
      o.backend = Backend::Cuda;
      const TrainResult whole = train_run(o);
      testing::TempDir tmp;
      for (const AdamWOn place : {AdamWOn::Device, AdamWOn::Host}) {  // Note [host optimizer]
        for (const bool host_budget : {false, true}) {
          TrainOptions d = o;
          d.adamw_on = place;
          d.gpu_mem_budget_bytes = std::size_t{1} << 30;
          if (host_budget) {
            d.mem_budget_bytes = std::size_t{1} << 30;
            d.offload_dir = tmp.path();
          }
          const std::size_t smallest = train_run(d).min_budget_bytes;  // for these options
          if (host_budget) d.mem_budget_bytes = 2 * smallest;  // with AdamW on the CPU the host holds the updates too
          for (const std::size_t budget : {smallest, smallest + (smallest >> 1)}) {
            if (host_budget && budget != smallest) continue;
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + (accum ? " accum" : " clipped") + " budget " +
                         std::to_string(budget) + (host_budget ? " over NVMe" : "") +
                         (place == AdamWOn::Host ? " adamw on the cpu" : " adamw on the gpu"));
            d.gpu_mem_budget_bytes = budget;
            const TrainResult got = train_run(d);
            EXPECT_EQ(got.params_hash, whole.params_hash);
            EXPECT_EQ(got.adamw_on_host, place == AdamWOn::Host);
            EXPECT_GT(got.device_read_bytes, 0u);
            EXPECT_LE(got.device_peak_bytes, budget);
          }
        }
      }
    }
  }
}

// Everywhere (CI too): what --backend cuda refuses, in one line; without a GPU, why not.
TEST(CudaTrain, RefusalsAreOneLine) {
  TrainOptions o = tiny(false, "");
  o.backend = Backend::Cuda;
  std::string why;
  const bool gpu = backend_available(Backend::Cuda, &why);
  auto message = [&](const TrainOptions& opts) {
    try {
      train_run(opts);
    } catch (const BugError& e) {
      return std::string("internal error: ") + e.what();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  if (!gpu) {
    EXPECT_EQ(message(o), why);
  }
  TrainOptions bf16 = o;
  bf16.precision = Precision::Bf16;
  EXPECT_NE(message(bf16).find("--precision bf16"), std::string::npos) << message(bf16);
}

// The mirror store on the CPU backend (the trainer's test knob): a run computed on a
// DeviceSegmentStore, its state pushed after loading and pulled for the checkpoint, gives the
// bits of the plain run: push/pull move every parameter and moment.
TEST(CudaTrain, TheMirrorStoreKeepsTheCpuBits) {
  testing::TempDir tmp;
  TrainOptions o = tiny(true, "");
  o.steps = 6;
  const std::uint64_t plain = train_run(o).params_hash;
  o.mirror_store = true;
  o.save_dir = tmp.file("ckpt");
  o.save_every = 3;
  EXPECT_EQ(train_run(o).params_hash, plain);
  o.save_dir = tmp.file("ckpt2");
  o.save_every = 0;
  o.resume_path = tmp.file("ckpt") + "/step-00000003";
  EXPECT_EQ(train_run(o).params_hash, plain) << "resumed from a mirrored run's checkpoint";
}

}  // namespace
}  // namespace stratum::testing
