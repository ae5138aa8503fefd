// Gradient accumulation (--grad-accum N, Note [gradient accumulation] in exec/executor.h): the
// gradients of N micro-batches are the global batch's mean gradient (checked against PyTorch's
// for the golden GPT-2's batch of 4 cut into 2 x 2 and 4 x 1, and against one batch for a Llama);
// training with it gives the same bits under any budget, prefetch depth, I/O backend and optimizer
// placement as in RAM, resumes bit-identically, follows one batch of N*B's loss curve, and is
// refused where it has no meaning.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/hash.h"
#include "exec/executor.h"
#include "integration_util.h"
#include "kernels/cpu/matmul.h"
#include "plan/planner.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"
#include "train/trainer.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::source_path;

// Every gradient of `store` against `want(tensor name)` within 1e-6 + 1e-4 * max|want|.
template <typename Want>
int check_grads(SegmentStore& store, const ParamLayout& layout, Want want) {
  int checked = 0;
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentChunksHold grads(store, s, SegmentKind::Grads, Access::Read);
    for (const TensorSlot& t : layout.segments()[s].tensors) {
      const std::vector<float> expected = want(s, t);
      double max_err = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < t.numel; ++i) {
        const double w = expected[i];
        max_err = std::max(max_err, std::abs(static_cast<double>(grads.tensor(t)[i]) - w));
        max_ref = std::max(max_ref, std::abs(w));
      }
      EXPECT_LE(max_err, 1e-6 + 1e-4 * max_ref) << t.name << " max |ref| " << max_ref;
      ++checked;
    }
  }
  return checked;
}

// The golden GPT-2's batch (B = 4, T = 32) as N micro-batches of 4 / N sequences: the same tokens
// in the same order, so the loss and every gradient are PyTorch's for the whole batch; in RAM and
// streamed through the smallest budget, with the same gradient bits.
TEST(GradAccum, MicroBatchGradientsAreTheGlobalBatchMeanOfPyTorch) {
  const std::string dir = source_path("tests/golden/tiny_gpt2");
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  const testing::GoldenBatch batch = testing::golden_batch(dir, 4, 32);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  ThreadPool pool(2);
  blas_set_threads(2);
  testing::TempDir tmp;
  for (const int N : {2, 4}) {
    const int B = 4 / N, T = 32;
    const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T), UnitSet::Training, false, 0, true);
    std::vector<std::uint64_t> hashes;
    for (const bool streamed : {false, true}) {
      SCOPED_TRACE("N=" + std::to_string(N) + (streamed ? " streamed" : " in RAM"));
      std::unique_ptr<SegmentStore> store;
      Executor exec(pool, cfg, units, B, T, ActivationPolicy::Recompute, OptimizerMode::Inline, Precision::Fp32,
                    Backend::Cpu, N);
      if (streamed) {
        TieredStoreOptions so;
        so.budget_bytes = exec.min_store_bytes();
        so.offload_dir = tmp.path();
        so.prefetch_depth = 1;
        store = std::make_unique<TieredSegmentStore>(units, so);
      } else {
        store = std::make_unique<RamSegmentStore>(units);
      }
      model_load_weights(dir, layout, *store);
      exec.attach(*store);
      const float loss = exec.forward_backward(batch.inputs.data(), batch.targets.data(), B, T);
      EXPECT_NEAR(loss, golden_f32(ref, "loss")[0], 1e-5);
      const int checked = check_grads(*store, layout, [&](int, const TensorSlot& t) {
        const std::vector<float> all = golden_f32(ref, "grad.transformer." + t.name);
        return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(t.hf_first()),
                                  all.begin() + static_cast<std::ptrdiff_t>(t.hf_first() + t.numel));
      });
      EXPECT_EQ(checked, layout.vocab_block_count() + 1 + 12 * cfg.n_layer + 2);
      exec.sync();
      std::uint64_t h = 0;
      for (int s = 0; s < layout.segment_count(); ++s) {
        SegmentChunksHold grads(*store, s, SegmentKind::Grads, Access::Read);
        for (const TensorSlot& t : layout.segments()[s].tensors)  // not the padding between tensors
          h = h * 31 + hash64(grads.tensor(t), t.numel * sizeof(float));
      }
      hashes.push_back(h);
    }
    EXPECT_EQ(hashes[0], hashes[1]) << "streaming must not change a bit";
  }
}

// An untied Llama (its own LM-head blocks, no positions, grouped-query attention): the golden
// batch of 2 x 24 as 2 micro-batches of 1 gives PyTorch's loss and gradients of the whole batch.
TEST(GradAccum, LlamaMicroBatchesMatchPyTorch) {
  const std::string dir = source_path("tests/golden/tiny_llama");
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg, {});
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  auto ids = [&](const char* name) {
    const SafetensorsTensorInfo* t = ref.find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<std::int32_t> out(t != nullptr ? static_cast<std::size_t>(t->numel()) : 0);
    if (t != nullptr) ref.read_raw(*t, out.data());
    return out;
  };
  const std::vector<std::int32_t> inputs = ids("input_ids"), targets = ids("targets");
  const int T = 24;
  ASSERT_EQ(inputs.size(), 2u * T);
  ThreadPool pool(2);
  blas_set_threads(2);
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, 1, T), UnitSet::Training, false, 0, true);
  RamSegmentStore store(units);
  model_load_weights(dir, layout, store);
  Executor exec(pool, cfg, units, 1, T, ActivationPolicy::Recompute, OptimizerMode::Inline, Precision::Fp32,
                Backend::Cpu, 2);
  exec.attach(store);
  EXPECT_NEAR(exec.forward_backward(inputs.data(), targets.data(), 1, T), golden_f32(ref, "loss")[0], 1e-5);
  const int checked = check_grads(store, layout, [&](int, const TensorSlot& t) {
    const std::vector<float> all = golden_f32(ref, "grad." + layout.hf_name(t));
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(t.hf_first()),
                              all.begin() + static_cast<std::ptrdiff_t>(t.hf_first() + t.numel));
  });
  EXPECT_EQ(checked, 2 * layout.vocab_block_count() + 1 + 9 * cfg.n_layer);
}

GptConfig small_config() {
  GptConfig cfg;
  cfg.n_layer = 6;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.n_ctx = 32;
  cfg.vocab_size = 1024;
  return cfg;
}

TrainOptions small_options(const std::string& data, int grad_accum) {
  TrainOptions o;
  o.config = small_config();
  o.data_path = data;
  o.batch = 2;
  o.seq = 32;
  o.grad_accum = grad_accum;
  o.steps = 4;
  o.lr.max_lr = 1e-3;
  o.threads = 2;
  o.quiet = true;
  o.shuffle = true;
  o.eval_every = 2;
  o.eval_batches = 2;
  return o;
}

std::string write_tokens(const testing::TempDir& dir) {
  return testing::write_random_tokens(dir.file("tokens.bin"), 4000, 1024, 9);
}

std::size_t min_budget(const TrainOptions& o, const LoraConfig& lora = {}) {
  return train_min_budget_bytes(o.config, o.batch, o.seq, o.threads, ActivationPolicy::Recompute, o.grad_clip,
                                Precision::Fp32, TrainOptimizer::AdamW, lora, false, o.grad_accum);
}

// Invariant 1 with accumulation: the smallest budget, a middle one with both I/O backends and
// prefetch depths, the optimizer pipelined (clipping) and overlapped (no clipping), activations
// offloaded, and the device-tier mirror store all give the bits of the run in RAM.
TEST(GradAccum, SameBitsUnderEveryBudgetAndPlacement) {
  testing::TempDir tmp;
  const std::string data = write_tokens(tmp);
  for (const double clip : {1.0, 0.0}) {
    SCOPED_TRACE("grad_clip " + std::to_string(clip));
    TrainOptions ram = small_options(data, 3);
    ram.grad_clip = clip;
    const TrainResult want = train_run(ram);
    EXPECT_TRUE(std::isfinite(want.final_loss));
    const std::size_t smallest = min_budget(ram);
    struct Case {
      std::size_t budget;
      int prefetch;
      IoBackend io;
      ActivationPolicy activations;
    };
    const Case cases[] = {{smallest, 1, IoBackend::Auto, ActivationPolicy::Recompute},
                          {smallest * 2, 3, IoBackend::Threads, ActivationPolicy::Recompute},
                          {smallest * 3, 2, IoBackend::Auto, ActivationPolicy::Offload}};
    for (const Case& c : cases) {
      TrainOptions o = ram;
      o.mem_budget_bytes = c.budget;
      o.offload_dir = tmp.path();
      o.prefetch = c.prefetch;
      o.io_backend = c.io;
      o.activations = c.activations;
      const TrainResult got = train_run(o);
      EXPECT_EQ(got.params_hash, want.params_hash) << "budget " << c.budget;
      EXPECT_EQ(got.final_val_loss, want.final_val_loss);
      EXPECT_GT(got.read_bytes, 0u);
      EXPECT_LE(got.peak_mem_bytes, c.budget);
    }
    TrainOptions mirror = ram;
    mirror.mirror_store = true;
    EXPECT_EQ(train_run(mirror).params_hash, want.params_hash);
  }
}

// LoRA with dropout: each micro-batch draws its own masks (pass index step * N + k), the same in
// RAM and streamed; accumulating differs from one micro-batch's run.
TEST(GradAccum, LoraWithDropoutSameBitsStreamed) {
  testing::TempDir tmp;
  const std::string data = write_tokens(tmp);
  TrainOptions o = small_options(data, 2);
  o.lora_r = 4;
  o.lora_alpha = 8;
  o.lora_dropout = 0.1;
  const TrainResult ram = train_run(o);
  TrainOptions streamed = o;
  streamed.mem_budget_bytes = min_budget(o, lora_config_make(lora_family(o.config), 4, 8, "", false, 0.1));
  streamed.offload_dir = tmp.path();
  EXPECT_EQ(train_run(streamed).params_hash, ram.params_hash);
  TrainOptions single = o;
  single.grad_accum = 1;
  EXPECT_NE(train_run(single).params_hash, ram.params_hash);
}

// Two micro-batches of 2 follow one batch of 4 over the same sequences (the data order is the
// single batch's): the same loss curve to float rounding.
TEST(GradAccum, FollowsTheLossCurveOfOneBatch) {
  testing::TempDir tmp;
  const std::string data = write_tokens(tmp);
  auto curve = [&](int batch, int grad_accum) {
    TrainOptions o = small_options(data, grad_accum);
    o.batch = batch;
    o.shuffle = false;
    o.eval_every = 0;
    o.steps = 6;
    o.log_path = tmp.file("log_" + std::to_string(grad_accum) + ".jsonl");
    train_run(o);
    std::vector<double> losses;
    for (const nlohmann::json& record : testing::read_jsonl(o.log_path)) losses.push_back(record["loss"].get<double>());
    return losses;
  };
  const std::vector<double> one = curve(4, 1), accumulated = curve(2, 2), four = curve(1, 4);
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(accumulated.size(), 6u);
  ASSERT_EQ(four.size(), 6u);
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(accumulated[i], one[i], 2e-5) << "step " << i + 1;
    EXPECT_NEAR(four[i], one[i], 2e-5) << "step " << i + 1;
  }
}

// A checkpoint mid-run resumes to the uninterrupted run's bits; a resume with another
// --grad-accum is refused (it changes the math), naming the flag.
TEST(GradAccum, ResumesBitIdenticallyAndRefusesAnotherCount) {
  testing::TempDir tmp;
  const std::string data = write_tokens(tmp);
  const TrainResult straight = train_run(small_options(data, 2));
  TrainOptions first = small_options(data, 2);
  first.steps = 4;
  first.save_dir = tmp.file("ckpt");
  first.save_every = 2;
  train_run(first);
  TrainOptions resumed = small_options(data, 2);
  resumed.resume_path = tmp.file("ckpt") + "/step-00000002";
  resumed.save_dir = tmp.file("ckpt2");
  EXPECT_EQ(train_run(resumed).params_hash, straight.params_hash);
  TrainOptions other = resumed;
  other.grad_accum = 3;
  try {
    train_run(other);
    FAIL() << "a resume with another --grad-accum must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--grad-accum"), std::string::npos) << e.what();
  }
}

TEST(GradAccum, RefusedWhereItHasNoMeaning) {
  testing::TempDir tmp;
  const std::string data = write_tokens(tmp);
  auto refused = [&](const std::string& args, const std::string& says) {
    const testing::CommandResult r = testing::run_stratum(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.errors.find(says), std::string::npos) << args << ": " << r.errors;
  };
  const std::string model = " --layers 1 --heads 2 --embd 32 --ctx 16 --vocab 1024 --seq 16 --batch 1 --steps 1 ";
  refused("train --data " + data + model + "--grad-accum 0", "--grad-accum");
  refused("train --data " + data + model + "--grad-accum 2 --optimizer zo-sgd", "zo-sgd has none");
  refused("plan" + std::string(model).replace(model.find("--steps 1"), 9, "") + "--grad-accum 2 --optimizer zo-sgd",
          "zo-sgd has none");
}

// A request for small_config() and made-up compute times, for the plan's arithmetic alone.
PlanRequest plan_request() {
  PlanRequest r;
  r.config = small_config();
  r.batch = 2;
  r.seq = 32;
  r.threads = 2;
  return r;
}

ComputeTiming plan_timing() {
  ComputeTiming t;
  t.layer_forward_ms = 2;
  t.layer_backward_ms = 4;
  t.vocab_forward_ms = t.vocab_backward_ms = 0.1;
  t.head_lse_ms = t.head_backward_ms = 0.5;
  t.other_ms = 1;
  t.adamw_inline_ns_per_float = t.adamw_worker_ns_per_float = 1;
  return t;
}

// The plan runs the micro-batches' groups N times: twice the compute of one micro-batch (plus
// the accumulation), more gradient memory, and a minimum budget no smaller than one batch's.
TEST(GradAccum, PlanCountsEveryMicroBatch) {
  PlanRequest r = plan_request();
  const ComputeTiming t = plan_timing();
  const Plan one = plan_make(r, t, 1, 1);
  r.grad_accum = 2;
  const Plan two = plan_make(r, t, 1, 1);
  EXPECT_GT(two.compute_ms, 1.99 * one.compute_ms);
  EXPECT_LT(two.compute_ms, 2.2 * one.compute_ms);
  EXPECT_EQ(two.grads_bytes, 2 * one.grads_bytes) << "the running sum beside the gradients";
  EXPECT_GE(plan_min_budget_bytes(r), two.min_budget_bytes);
  EXPECT_NEAR(two.ram_step_ms, two.step_ms, 1e-6 * two.step_ms);
}

// Note [plan ranks]: a rank's plan is its own executor's: its N / P micro-batches, the running
// sums it receives, only the segments it owns updated (their moments and AdamW time), updates
// after the backward (the owners send their parameters at the end of the step). `stratum plan`
// keeps the slowest kind of rank and the largest minimum; the network adds one gradient copy per
// micro-batch the rank runs and its owned parameters to the P-1 others, overlapped, and after
// the backward only the chain's tail; a slow enough network becomes the bottleneck.
TEST(GradAccum, PlanOfRanksIsTheSlowestRanksStepPlusTheNetwork) {
  PlanRequest r = plan_request();
  r.grad_accum = 8;
  const ComputeTiming t = plan_timing();
  PlanRequest two = r;
  two.grad_accum = 2;
  const Plan local = plan_make(two, t, 1, 1);  // one process, the 2 micro-batches a rank runs
  r.ranks = 4;
  EXPECT_EQ(plan_mode(r, true), OptimizerMode::Inline);
  EXPECT_EQ(plan_mode(two, true), OptimizerMode::Pipelined);
  std::vector<Plan> each;  // every rank's own plan, as train makes it (no network)
  std::size_t owned = 0, moments = 0, min_bytes = 0;
  double slowest = 0;
  for (int k = 0; k < 4; ++k) {
    PlanRequest one = r;
    one.rank = k;
    each.push_back(plan_make(one, t, 1, 1));
    const Plan& p = each.back();
    EXPECT_EQ(p.rank, k);
    EXPECT_EQ(p.net_sent_bytes, 0u) << "no --net-gbps: the network is not planned";
    EXPECT_EQ(p.grads_bytes, local.grads_bytes) << "the gradients and the running sum";
    EXPECT_LT(p.moments_bytes, local.moments_bytes) << "only its own segments' moments";
    EXPECT_NEAR(p.compute_ms, local.compute_ms, 0.05 * local.compute_ms) << "2 micro-batches";
    owned += p.owned_params;
    moments += p.moments_bytes;
    min_bytes = std::max(min_bytes, plan_min_budget_bytes(one));
    slowest = std::max(slowest, p.step_ms);
  }
  EXPECT_EQ(owned, ParamLayout::of(r.config).num_trainable_params()) << "every segment has one owner";
  EXPECT_EQ(moments, local.moments_bytes);
  EXPECT_EQ(plan_min_budget_bytes(r), min_bytes);
  EXPECT_GT(each[0].params_bytes, 0u);

  const std::uint64_t grads = local.grads_bytes / 2;  // without the running sum
  r.net_gbps = 1000;
  const Plan fast = plan_make(r, t, 1, 1);
  EXPECT_EQ(fast.ranks, 4);
  const Plan& mine = each[static_cast<std::size_t>(fast.rank)];
  EXPECT_EQ(mine.step_ms, slowest) << "the slowest rank's";
  EXPECT_EQ(fast.min_budget_bytes, min_bytes);
  // 2 micro-batches' sums (rank 3's last one: the final gradients, none of its own) and its own
  // parameters (as held: at least their count) to 3 ranks.
  const std::uint64_t own_bytes = sizeof(float) * mine.owned_params;
  const std::uint64_t expected = 2 * grads + 3 * own_bytes - (fast.rank == 3 ? own_bytes : 0);
  EXPECT_GE(fast.net_sent_bytes + (fast.rank == 3 ? grads / 8 : 0), expected);
  EXPECT_LT(fast.net_sent_bytes, expected + grads / 8);
  const double bytes_per_ms = 1000 * 1e9 / 8 / 1e3;  // 1000 Gb/s
  EXPECT_LT(fast.net_tail_ms, static_cast<double>(grads * 3 / 4) / bytes_per_ms)
      << "the parameters overlap the next forward";
  EXPECT_GT(fast.net_tail_ms, 0.0);
  EXPECT_NEAR(fast.net_ms, static_cast<double>(fast.net_sent_bytes) / bytes_per_ms, 1e-9);
  EXPECT_NEAR(fast.step_ms, mine.step_ms + fast.net_tail_ms, 1e-9);
  EXPECT_EQ(fast.bottleneck, mine.bottleneck);
  r.net_gbps = 0.001;
  const Plan slow = plan_make(r, t, 1, 1);
  EXPECT_EQ(slow.bottleneck, "network");
  EXPECT_NEAR(slow.step_ms, slow.net_ms + slow.net_tail_ms, 1e-6 * slow.step_ms);
  EXPECT_GT(slow.net_ms, 100 * local.step_ms);
  r.grad_accum = 6;
  EXPECT_THROW(plan_make(r, t, 1, 1), Error);

  // A rank neither holds nor files the other ranks' moments: a budget that holds what it touches
  // holds everything (the store sized itself by every unit, and streamed there).
  PlanRequest one = r;
  one.grad_accum = 8;
  one.rank = 0;
  one.net_gbps = 0;
  const Plan ram = plan_make(one, t, 1, 1);
  const std::size_t own = ram.peak_ram_bytes - ram.engine_bytes;
  PlanRequest whole = one;  // every unit: one process's files
  whole.ranks = 1;
  whole.rank = -1;
  whole.mem_budget_bytes = plan_min_budget_bytes(whole);
  const std::size_t all = plan_make(whole, t, 1, 1).disk_bytes;
  ASSERT_LT(own, all);
  one.mem_budget_bytes = ram.engine_bytes + (own + all) / 2;
  const Plan gap = plan_make(one, t, 1, 1);
  EXPECT_EQ(gap.engine_bytes, ram.engine_bytes);
  EXPECT_FALSE(gap.streaming);
  EXPECT_EQ(gap.read_bytes, 0u);
  EXPECT_EQ(gap.disk_bytes, all - (local.moments_bytes - ram.moments_bytes)) << "its own moments' files only";
  EXPECT_EQ(plan_offload_floor_bytes(one), gap.disk_bytes);
  // Ranks on one machine share its disk: every rank's files when all are there, else the largest's
  // times their number.
  std::size_t every = 0, largest = 0;
  for (int k = 0; k < 4; ++k) {
    PlanRequest at = one;
    at.rank = k;
    every += plan_offload_floor_bytes(at);
    largest = std::max(largest, plan_offload_floor_bytes(at));
  }
  EXPECT_EQ(plan_offload_shared_bytes(one, 4), every);
  EXPECT_EQ(plan_offload_shared_bytes(one, 2), 2 * largest);
  EXPECT_EQ(plan_offload_shared_bytes(one, 1), gap.disk_bytes);
  EXPECT_LT(every, 4 * all) << "not every unit four times";
}

}  // namespace
}  // namespace stratum
