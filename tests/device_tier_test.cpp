// The device tier under a budget (Note [device tier], store/device_segment_store.h), run on the
// CPU backend through the trainer's test knob (mirror_store: the executor computes on a
// DeviceSegmentStore whose "device" memory is the CPU Ops' RAM), so CI checks the tier's logic:
// for every --gpu-mem-budget, over the RAM store and over the RAM-over-NVMe store, with the
// optimizer worker acquiring beside the training thread, the bits are the in-memory run's, the
// units do stream (copies in and out), and the device never holds more than its budget. The same
// runs on a GPU are in cuda_train_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/byte_size.h"
#include "core/thread_pool.h"
#include "model/param_layout.h"
#include "store/device_segment_store.h"
#include "store/step_schedule.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "tiny_run_options.h"

namespace stratum::testing {
namespace {

TrainOptions tiny(bool llama) {
  TrainOptions o = tiny_train_options(llama);
  o.config.n_layer = 3;  // more units than the smallest budget holds
  o.batch = 2;
  o.steps = 4;
  o.lr.warmup_steps = 1;
  return o;
}

std::string message(const GenerateOptions& o) {
  try {
    generate_run(o, [](int, std::int32_t, const std::string&) {});
  } catch (const BugError& e) {
    return std::string("internal error: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string message(const TrainOptions& o) {
  try {
    train_run(o);
  } catch (const BugError& e) {
    return std::string("internal error: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Runs `o` on the device tier at its smallest budget and at a middle one, over RAM and (the
// smallest) over a RAM budget with an offload dir: each gives `want`'s bits. The smallest budget
// is the one a run with the same options reports (the optimizer's order under a RAM budget
// changes the working set).
void expect_budgets_keep_bits(const TrainOptions& o, const char* what) {
  const TrainResult want = train_run(o);
  ASSERT_TRUE(std::isfinite(want.final_loss)) << what;
  testing::TempDir tmp;
  for (const bool host_budget : {false, true}) {
    TrainOptions d = o;
    d.mirror_store = true;
    d.gpu_mem_budget_bytes = std::size_t{1} << 30;
    if (host_budget) {
      d.mem_budget_bytes = std::size_t{1} << 30;
      d.offload_dir = tmp.path();
    }
    const TrainResult roomy = train_run(d);  // a budget that holds everything: each unit copied in once
    EXPECT_EQ(roomy.params_hash, want.params_hash);
    EXPECT_EQ(roomy.device_write_bytes, 0u) << "nothing to evict or write behind";
    const std::size_t smallest = roomy.min_budget_bytes;
    ASSERT_GT(smallest, 0u);
    if (host_budget) d.mem_budget_bytes = smallest;  // the RAM tier's own minimum is below it
    for (const std::size_t budget : {smallest, smallest + (smallest >> 1)}) {
      if (host_budget && budget != smallest) continue;
      SCOPED_TRACE(std::string(what) + " gpu budget " + std::to_string(budget) + (host_budget ? " over NVMe" : ""));
      d.gpu_mem_budget_bytes = budget;
      const TrainResult got = train_run(d);
      EXPECT_EQ(got.params_hash, want.params_hash);
      EXPECT_EQ(got.final_loss, want.final_loss);
      EXPECT_GT(got.device_read_bytes, 0u) << "the units must stream through the device tier";
      EXPECT_GT(got.device_write_bytes, 0u) << "dirty units must be written back";
      EXPECT_LE(got.device_peak_bytes, budget);
      if (host_budget) {
        EXPECT_GT(got.read_bytes, 0u) << "the host tier must stream from the offload dir too";
      }
    }
  }
}

// Note [no upload of dead data]: a unit the window reads after a group that overwrites it (a
// layer's output, read by the next layer) is not uploaded: what the host holds of it is dead.
TEST(DeviceTier, NothingIsUploadedThatItsNextUseOverwrites) {
  ThreadPool pool(1);
  const std::shared_ptr<const Ops> ops = ops_make(pool);
  GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.n_ctx = 16;
  cfg.vocab_size = 64;
  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, 256);
  RamSegmentStore host(units);
  const int a = units.find(layout.layer_segment(0), SegmentKind::Activations);
  const int b = units.find(layout.layer_segment(1), SegmentKind::Activations);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  DeviceSegmentStore device(host, ops, units.bytes(a), 2);  // room for one of them
  static_cast<float*>(device.acquire_unit(a, Access::Overwrite))[0] = 1.0f;
  device.release_unit(a);
  device.acquire_unit(b, Access::Overwrite);  // evicts a: written back, the host holds it
  device.release_unit(b);
  ASSERT_EQ(device.stats().read_bytes, 0u);
  StepSchedule schedule(units.count());
  schedule.group_add({{a, Access::Overwrite}});
  schedule.group_add({{a, Access::Read}});
  device.schedule_set(&schedule);
  device.schedule_at(0);  // the window holds both groups: a is overwritten before it is read
  EXPECT_EQ(device.stats().read_bytes, 0u);
  device.schedule_at(1);  // now it is read next
  EXPECT_EQ(device.stats().read_bytes, units.bytes(a));
  device.schedule_set(nullptr);
}

TEST(DeviceTier, EveryGpuBudgetGivesTheInMemoryBits) {
  for (const bool llama : {false, true}) {
    TrainOptions o = tiny(llama);
    o.grad_clip = 1.0;  // exact clipping: updates after the global norm
    expect_budgets_keep_bits(o, llama ? "llama clipped" : "gpt2 clipped");
    o.grad_clip = 0.0;  // the overlapped update: the optimizer worker acquires beside the training thread
    o.activations = ActivationPolicy::Keep;
    o.grad_accum = 2;
    expect_budgets_keep_bits(o, llama ? "llama overlapped keep accum" : "gpt2 overlapped keep accum");
  }
}

// Note [host optimizer]: AdamW on the host store on the worker thread while the "device"
// computes (ZeRO-Offload), with the whole state on the device and at the smallest and a middle
// budget, over RAM and over NVMe, clipped (updates pipelined into the next forward) and
// overlapped with accumulation: the in-memory bits; the moments never cross (fewer bytes copied
// in than with AdamW on the device at the same budget) and the smallest budget is lower;
// --adamw-on auto puts AdamW on the host exactly when the state does not fit the budget.
TEST(DeviceTier, AdamWOnTheHostGivesTheInMemoryBits) {
  testing::TempDir tmp;
  for (const bool llama : {false, true}) {
    for (const bool clipped : {true, false}) {
      TrainOptions o = tiny(llama);
      o.grad_clip = clipped ? 1.0 : 0.0;
      if (!clipped) o.grad_accum = 2;
      const std::string what = std::string(llama ? "llama" : "gpt2") + (clipped ? " clipped" : " overlapped accum");
      const TrainResult want = train_run(o);
      TrainOptions d = o;
      d.mirror_store = true;
      d.adamw_on = AdamWOn::Host;
      const TrainResult whole = train_run(d);
      EXPECT_TRUE(whole.adamw_on_host) << what;
      EXPECT_EQ(whole.params_hash, want.params_hash) << what << " whole state on the device";
      const std::size_t smallest = whole.min_budget_bytes;
      d.adamw_on = AdamWOn::Device;
      const std::size_t device_smallest = train_run(d).min_budget_bytes;
      EXPECT_LT(smallest, device_smallest) << what << ": the updates need no device memory";
      for (const bool host_budget : {false, true}) {
        for (const std::size_t budget : {smallest, smallest + (smallest >> 1)}) {
          if (host_budget && budget != smallest) continue;
          SCOPED_TRACE(what + " gpu budget " + std::to_string(budget) + (host_budget ? " over NVMe" : ""));
          d.gpu_mem_budget_bytes = budget;
          d.mem_budget_bytes = host_budget ? 2 * smallest : 0;  // the host's own minimum holds the updates too
          d.offload_dir = host_budget ? tmp.path() : "";
          d.adamw_on = AdamWOn::Host;
          const TrainResult got = train_run(d);
          EXPECT_EQ(got.params_hash, want.params_hash);
          EXPECT_EQ(got.final_loss, want.final_loss);
          EXPECT_LE(got.device_peak_bytes, budget);
          if (host_budget) {
            EXPECT_GT(got.read_bytes, 0u) << "the host tier must stream from the offload dir too";
          }
          d.adamw_on = AdamWOn::Auto;  // the state does not fit: the host
          const TrainResult automatic = train_run(d);
          EXPECT_TRUE(automatic.adamw_on_host);
          EXPECT_EQ(automatic.params_hash, want.params_hash);
          if (budget < device_smallest) continue;
          d.adamw_on = AdamWOn::Device;
          const TrainResult on_device = train_run(d);
          EXPECT_FALSE(on_device.adamw_on_host);
          EXPECT_EQ(on_device.params_hash, want.params_hash);
          EXPECT_LT(got.device_read_bytes, on_device.device_read_bytes) << "the moments must stay on the host";
        }
      }
      d.gpu_mem_budget_bytes = 0;
      d.mem_budget_bytes = 0;
      d.offload_dir.clear();
      d.adamw_on = AdamWOn::Auto;  // everything fits: the device
      EXPECT_FALSE(train_run(d).adamw_on_host) << what;
    }
  }
}

TEST(DeviceTier, LoraAndZerothOrderUnderAGpuBudget) {
  TrainOptions lora = tiny(true);
  lora.lora_r = 4;
  lora.lora_alpha = 8;
  lora.lora_targets = "q_proj,v_proj,down_proj";
  lora.lora_dropout = 0.1;
  expect_budgets_keep_bits(lora, "llama lora");
  TrainOptions zo = tiny(false);
  zo.optimizer = TrainOptimizer::ZoSgd;
  zo.lr.max_lr = 1e-4;
  expect_budgets_keep_bits(zo, "gpt2 zo-sgd");
}

// A checkpoint written under a device budget holds the device's state (pulled first), and a
// resume under another budget continues with the straight run's bits.
TEST(DeviceTier, CheckpointsUnderAGpuBudgetResume) {
  testing::TempDir tmp;
  TrainOptions o = tiny(false);
  o.steps = 6;
  const TrainResult straight = train_run(o);
  o.mirror_store = true;
  o.gpu_mem_budget_bytes = straight.min_budget_bytes;
  o.save_dir = tmp.file("ckpt");
  o.save_every = 3;
  EXPECT_EQ(train_run(o).params_hash, straight.params_hash);
  o.gpu_mem_budget_bytes = straight.min_budget_bytes * 2;
  o.save_dir = tmp.file("ckpt2");
  o.save_every = 0;
  o.resume_path = tmp.file("ckpt") + "/step-00000003";
  EXPECT_EQ(train_run(o).params_hash, straight.params_hash);
}

// Generation through the device tier under a budget: the weights and KV caches that do not fit
// are copied in by the decode schedule, and greedy decoding gives the in-RAM tokens (the same
// bits: the kernels read the same bytes), batched, fp32 and kept-bf16 weights, over RAM and over
// a RAM budget on NVMe.
TEST(DeviceTier, GenerateUnderAGpuBudgetGivesTheSameTokens) {
  testing::TempDir tmp;
  for (const char* dir : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama_bf16"}) {
    const GenerateOptions o = greedy_generate_options(dir);
    auto run = [](const GenerateOptions& opts, GenerateResult* result = nullptr) { return generated_ids(opts, result); };
    const auto want = run(o);
    GenerateOptions d = o;
    d.device_tier_on_cpu = true;
    d.gpu_mem_budget_bytes = std::size_t{1} << 30;
    GenerateResult roomy;
    EXPECT_EQ(run(d, &roomy), want) << dir;
    ASSERT_GT(roomy.device_min_bytes, 0u);
    EXPECT_EQ(roomy.device_write_bytes, 0u);
    for (const std::size_t budget : {roomy.device_min_bytes, roomy.device_min_bytes * 3 / 2}) {
      for (const bool host_budget : {false, true}) {
        SCOPED_TRACE(std::string(dir) + " budget " + std::to_string(budget) + (host_budget ? " over NVMe" : ""));
        d.gpu_mem_budget_bytes = budget;
        d.mem_budget_bytes = host_budget ? std::size_t{64} << 20 : 0;
        d.offload_dir = host_budget ? tmp.path() : "";
        GenerateResult r;
        EXPECT_EQ(run(d, &r), want);
        if (budget == roomy.device_min_bytes) {
          EXPECT_GT(r.device_read_bytes, roomy.device_read_bytes) << "the weights must stream";
        }
        EXPECT_LE(r.device_peak_bytes, budget);
      }
    }
    d.gpu_mem_budget_bytes = 4096;
    d.mem_budget_bytes = 0;
    d.offload_dir = "";
    EXPECT_NE(message(d).find("use --gpu-mem-budget"), std::string::npos) << message(d);
  }
}

TEST(DeviceTier, BadGpuBudgetsAreOneLine) {
  TrainOptions o = tiny(false);
  o.gpu_mem_budget_bytes = 1 << 30;
  EXPECT_NE(message(o).find("add --backend cuda"), std::string::npos) << message(o);
  o.mirror_store = true;
  o.gpu_mem_budget_bytes = 4096;
  const std::string m = message(o);
  EXPECT_NE(m.find("--gpu-mem-budget 4.0 KiB is below the minimum"), std::string::npos) << m;
  EXPECT_NE(m.find("use --gpu-mem-budget"), std::string::npos) << m;
  // A budget that a smaller --row-chunk fits names it and its minimum (the GPU's default chunk is
  // 4096 rows: Note [device row chunk]). B*T = 96 rows: one chunk of 96, or chunks of 64.
  o.steps = 1;
  o.batch = 3;
  o.adamw_on = AdamWOn::Device;  // one optimizer placement for every budget below, so one minimum each
  o.row_chunk = 64;
  o.gpu_mem_budget_bytes = std::size_t{1} << 30;
  const std::size_t min64 = train_run(o).min_budget_bytes;
  o.row_chunk = 128;
  const std::size_t min128 = train_run(o).min_budget_bytes;
  ASSERT_LT(min64, min128);
  o.gpu_mem_budget_bytes = min64;
  const std::string advice = message(o);
  EXPECT_NE(advice.find(", --row-chunk 64 (minimum " + bytes_text(min64) + ")"), std::string::npos) << advice;
  o.gpu_mem_budget_bytes = min64 - 1;
  EXPECT_EQ(message(o).find("--row-chunk"), std::string::npos) << message(o);
  o.gpu_mem_budget_bytes = 0;
  o.adamw_on = AdamWOn::Auto;
  o.optimizer = TrainOptimizer::ZoSgd;
  o.adamw_on = AdamWOn::Host;
  EXPECT_NE(message(o).find("--optimizer zo-sgd has none: drop --adamw-on"), std::string::npos) << message(o);
}

}  // namespace
}  // namespace stratum::testing
