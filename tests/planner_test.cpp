// The plan (Note [plan model]) against a real run: bytes moved per step and the prefetch depth the
// run uses; the time model on fixed inputs (wall-clock prediction vs measurement is a benchmark,
// docs/benchmarks.md, not a timed test). Also the CLI and its errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "integration_util.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/segment_store.h"
#include "stratum/error.h"
#include "train/trainer.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

GptConfig plan_config() {
  GptConfig cfg;
  cfg.n_layer = 8;
  cfg.n_head = 4;
  cfg.n_embd = 128;
  cfg.n_ctx = 64;
  cfg.vocab_size = 2048;
  return cfg;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(Plan, TrafficMatchesATrainingRunThatUsesThePlansDepth) {
  testing::TempDir tmp;
  ::setenv("STRATUM_CACHE_DIR", tmp.path().c_str(), 1);
  TrainOptions o;
  o.config = plan_config();
  o.data_path = testing::write_random_tokens(tmp.file("tokens.bin"), 20000, 2048, 3);
  o.batch = 4;
  o.seq = 64;
  o.steps = 6;
  o.threads = 2;
  o.quiet = true;
  o.log_path = tmp.file("log.jsonl");
  o.offload_dir = tmp.path();
  const std::size_t state = (o.config.vocab_size + o.config.n_ctx + 12 * 8 * 128) * std::size_t{128} * 16;
  o.mem_budget_bytes = std::max(train_min_budget_bytes(o.config, o.batch, o.seq, 2, ActivationPolicy::Recompute, o.grad_clip), state / 4);
  o.activations = ActivationPolicy::Recompute;  // the plan below is recompute's

  PlanRequest request{o.config, o.batch, o.seq, ActivationPolicy::Recompute, o.grad_clip, o.mem_budget_bytes, -1};
  request.threads = o.threads;  // the run's (its minimum and its updates' thread depend on it)
  ThreadPool pool(2);
  CalibrationOptions co;
  co.offload_dir = tmp.path();
  co.threads = 2;
  const Calibration cal = calibrate(co);
  const Plan plan = plan_make(request, plan_measure_compute(pool, request), cal.disk_read_gbps, cal.disk_write_gbps);
  ASSERT_TRUE(plan.streaming);
  EXPECT_GE(plan.prefetch, 1);
  EXPECT_GT(plan.read_bytes, 0u);
  EXPECT_LE(plan.peak_ram_bytes, o.mem_budget_bytes);
  EXPECT_EQ(plan.disk_bytes, plan.params_bytes + plan.grads_bytes + plan.moments_bytes + plan.activation_bytes);

  const TrainResult result = train_run(o);
  EXPECT_EQ(result.prefetch, plan.prefetch) << "without --prefetch the run uses the plan's depth";
  std::vector<double> ms;
  auto log = testing::read_jsonl(o.log_path);
  ASSERT_EQ(log.size(), 6u);
  for (std::size_t i = 2; i < log.size(); ++i) {  // steady state
    ms.push_back(log[i]["step_ms"].get<double>());
    EXPECT_NEAR(log[i]["predicted_step_ms"].get<double>(), result.predicted_step_ms, 1e-6);
  }
  // The time it predicts is not compared with the run's wall clock here: on a 2-core machine
  // beside other tests (ctest -j2) a disk calibrated while a neighbour writes gigabytes can be
  // many times slower than during the run, so any bound would make this a flaky timed test
  // (house rule). docs/benchmarks.md compares prediction and measurement on the benchmark configs;
  // Plan.PredictedTimeFollowsTheModel checks the time model on fixed inputs.
  EXPECT_GT(result.predicted_step_ms, 0.0);
  EXPECT_GT(median(ms), 0.0);

  // Traffic: with prefetch 0 the store loads on use (read-ahead included); the plan's store model
  // replays the same schedule through the same EvictionPolicy, write-behind included, so on a
  // quiet machine the bytes agree within a few percent (reads 0.99x, writes 1.00x the plan at
  // prefetch 0 when the policy became shared; 1.21x and 1.17x before, when the model had its own
  // rule and no write-behind). Not exactly: the optimizer worker holds a block's chunks while the
  // training thread runs ahead, and which units are resident when either evicts depends on that
  // timing. A loaded 2-core machine (ctest -j2 beside a build) read up to 1.51x the plan, CI's
  // ASan pass 1.44x, so the upper bound here is generous: it catches a plan or store that is
  // wrong, not one that is slow.
  o.prefetch = 0;
  train_run(o);
  log = testing::read_jsonl(o.log_path);
  std::vector<double> reads, writes;
  for (std::size_t i = 2; i < log.size(); ++i) {
    reads.push_back(log[i]["read_bytes"].get<double>());
    writes.push_back(log[i]["write_bytes"].get<double>());
  }
  // The plan of that run: the store's write-behind depends on the prefetch depth.
  PlanRequest at_zero = request;
  at_zero.prefetch = 0;
  const Plan plan0 = plan_make(at_zero, plan.timing, cal.disk_read_gbps, cal.disk_write_gbps);
  const double planned_reads = static_cast<double>(plan0.read_bytes);
  const double planned_writes = static_cast<double>(plan0.write_bytes);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double over = 2.5;  // sanitizers slow compute and the worker unevenly
#else
  const double over = 2.0;
#endif
  EXPECT_GE(median(reads), 0.95 * planned_reads);
  EXPECT_LE(median(reads), over * planned_reads);
  EXPECT_GE(median(writes), 0.95 * planned_writes);
  EXPECT_LE(median(writes), over * planned_writes);
  ::unsetenv("STRATUM_CACHE_DIR");
}

// A Llama under a budget, through the CLI, is planned as itself: the measuring process gets its
// config.json (before, it was given GPT-2 flags of the same width, so a Llama whose heads x
// head_dim differ from its hidden size failed and a 128k context built a huge position table).
// Its traffic check uses the GPT-2 test's bounds.
TEST(Plan, LlamaWithItsOwnHeadDimAndA128kContextTrainsUnderABudgetAsPlanned) {
  testing::TempDir tmp;
  ::setenv("STRATUM_CACHE_DIR", tmp.path().c_str(), 1);
  GptConfig cfg;
  cfg.arch = ModelArch::Llama;
  cfg.n_layer = 4;
  cfg.n_head = 3;
  cfg.n_kv_head = 1;
  cfg.n_head_dim = 16;  // 3 x 16 = 48 != 64
  cfg.n_embd = 64;
  cfg.n_inner = 160;
  cfg.n_ctx = 131072;
  cfg.vocab_size = 1024;
  cfg.rope_theta = 500000.0;
  cfg.rope_scaling.type = RopeScaling::Type::Llama3;
  cfg.rope_scaling.factor = 8.0;
  cfg.tie_word_embeddings = false;
  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, 0, UnitSet::Inference);
  RamSegmentStore store(units);
  model_init_random(cfg, layout, store, 5);
  const std::string model = tmp.file("llama");
  model_save(model, cfg, layout, store, "");

  const int batch = 2, seq = 32;
  std::size_t state = 0;  // params, grads and both moments, fp32
  for (const SegmentLayout& seg : layout.segments()) state += 4 * seg.size_floats * sizeof(float);
  const std::size_t budget = std::max(train_min_budget_bytes(cfg, batch, seq, 2, ActivationPolicy::Recompute, 1.0), state / 4);
  const std::string offload = tmp.file("offload");
  std::filesystem::create_directories(offload);
  const std::string data = testing::write_random_tokens(tmp.file("tokens.bin"), 20000, cfg.vocab_size, 4);
  const std::string log = tmp.file("log.jsonl");
  const auto r = testing::run_stratum("train --model " + model + " --data " + data + " --batch 2 --seq 32 --steps 6 " +
                                      "--threads 2 --quiet --prefetch 0 --mem-budget " +
                                      std::to_string((budget + 1023) / 1024) + "K --offload-dir " + offload +
                                      " --log " + log);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("[stratum] plan:"), std::string::npos) << r.errors;

  PlanRequest request{cfg, batch, seq, ActivationPolicy::Recompute, 1.0, (budget + 1023) / 1024 * 1024, -1};
  request.threads = 2;  // the run's (its minimum and its updates' thread depend on it)
  ThreadPool pool(2);
  const Plan plan = plan_make(request, plan_measure_compute(pool, request), 1.0, 1.0);
  ASSERT_TRUE(plan.streaming);
  std::vector<double> reads, writes;
  const auto records = testing::read_jsonl(log);
  ASSERT_EQ(records.size(), 6u);
  for (std::size_t i = 2; i < records.size(); ++i) {
    EXPECT_GT(records[i]["predicted_step_ms"].get<double>(), 0.0);
    reads.push_back(records[i]["read_bytes"].get<double>());
    writes.push_back(records[i]["write_bytes"].get<double>());
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double over = 2.5;
#else
  const double over = 2.0;
#endif
  EXPECT_GE(median(reads), 0.9 * static_cast<double>(plan.read_bytes));
  EXPECT_LE(median(reads), over * static_cast<double>(plan.read_bytes));
  EXPECT_GE(median(writes), 0.9 * static_cast<double>(plan.write_bytes));
  EXPECT_LE(median(writes), over * static_cast<double>(plan.write_bytes));
  ::unsetenv("STRATUM_CACHE_DIR");
}

// The time model on fixed inputs (no clock involved): a disk so fast it costs nothing leaves the
// step at its compute; a slow disk makes the step at least its reads at that bandwidth and names
// read as the bottleneck; the busy times add up to what the timing and the bytes say.
// A fixed measurement for the time model's tests (no clock involved).
ComputeTiming fixed_timing() {
  ComputeTiming t;
  t.layer_forward_ms = 2;
  t.layer_backward_ms = 4;
  t.vocab_forward_ms = 0.1;
  t.vocab_backward_ms = 0.2;
  t.head_lse_ms = 1;
  t.head_backward_ms = 2;
  t.other_ms = 0.5;
  t.adamw_inline_ns_per_float = 1;
  t.adamw_worker_ns_per_float = 2;
  return t;
}

TEST(Plan, PredictedTimeFollowsTheModel) {
  PlanRequest request{plan_config(), 4, 64, ActivationPolicy::Recompute, 1.0, 0, -1};
  const ComputeTiming t = fixed_timing();
  const Plan ram = plan_make(request, t, 0, 0);
  ASSERT_FALSE(ram.streaming);
  EXPECT_GE(ram.step_ms, ram.compute_ms);
  EXPECT_GT(ram.compute_ms, 8 * (2 + 4));  // eight blocks' forward and backward at least
  EXPECT_NEAR(ram.step_ms, ram.ram_step_ms, 1e-9);

  const std::size_t state = (request.config.vocab_size + request.config.n_ctx + 12 * 8 * 128) * std::size_t{128} * 16;
  request.mem_budget_bytes = std::max(ram.min_budget_bytes, state / 4);
  const Plan fast = plan_make(request, t, 1e6, 1e6);
  ASSERT_TRUE(fast.streaming);
  EXPECT_GT(fast.read_bytes, 0u);
  // Free I/O: the step is its compute, plus at most the optimizer's time where the streaming run's
  // update mode (a worker) does not overlap it all.
  EXPECT_GE(fast.step_ms, fast.compute_ms);
  EXPECT_LE(fast.step_ms, fast.compute_ms + fast.optimizer_ms + 1e-6) << "free I/O costs nothing";
  EXPECT_NEAR(fast.ram_step_ms, ram.step_ms, 0.02 * ram.step_ms);

  const double slow_gbps = 0.001;  // 1 MB/s: reads take seconds against milliseconds of compute
  const Plan slow = plan_make(request, t, slow_gbps, 1e6);
  // At one prefetch depth (the traffic depends on it: the write-behind follows the window).
  request.prefetch = slow.prefetch;
  EXPECT_EQ(slow.read_bytes, plan_make(request, t, 1e6, 1e6).read_bytes) << "bandwidth changes the time, not the traffic";
  const double read_ms = static_cast<double>(slow.read_bytes) / (slow_gbps * 1e9) * 1e3;
  EXPECT_NEAR(slow.read_ms, read_ms, 0.01 * read_ms);
  EXPECT_GE(slow.step_ms, 0.99 * read_ms);
  EXPECT_LE(slow.step_ms, read_ms + 2 * fast.step_ms);
  EXPECT_EQ(slow.bottleneck.rfind("read", 0), 0u) << slow.bottleneck;
}

// Note [update window]: with exact clipping under a budget every update waits for the norm and
// each forward for its segment's update, so the bytes of the updates fall between the backward and
// the head. A disk fast enough that its busy time stays under the compute, but slow for the
// window (its bytes take longer than the forward's compute), is named the bottleneck there; a free
// disk leaves the compute; without clipping in RAM there is no window.
TEST(Plan, NamesTheUpdateWindowWhereTheStepWaitsForIt) {
  PlanRequest request{plan_config(), 4, 64, ActivationPolicy::Recompute, 1.0, 0, -1};
  const ComputeTiming t = fixed_timing();
  const std::size_t state = (request.config.vocab_size + request.config.n_ctx + 12 * 8 * 128) * std::size_t{128} * 16;
  request.mem_budget_bytes = std::max(plan_make(request, t, 0, 0).min_budget_bytes, state / 4);
  std::size_t params = 0;  // trained floats
  const ParamLayout layout = ParamLayout::of(request.config, request.lora);
  for (int s = 0; s < layout.segment_count(); ++s)
    if (layout.trainable(s)) params += layout.segments()[s].size_floats;

  const Plan slow = plan_make(request, t, 2.0, 2.0);  // busy under the compute, slow for the window
  ASSERT_TRUE(slow.streaming);
  EXPECT_LT(slow.read_ms + slow.write_ms, slow.compute_ms);
  EXPECT_EQ(slow.bottleneck, "the update window (disk)");
  // Every update's four reads and three writes, less what the budget keeps resident.
  EXPECT_GE(static_cast<double>(slow.window.read_bytes + slow.window.write_bytes), 0.8 * 28.0 * params);
  EXPECT_NEAR(slow.window.disk_ms, static_cast<double>(slow.window.read_bytes + slow.window.write_bytes) / 2e6, 1e-6);
  EXPECT_GT(slow.window.disk_ms, slow.window.compute_ms);
  EXPECT_GE(slow.window.ms, slow.window.compute_ms);
  EXPECT_LT(slow.window.ms, slow.step_ms);

  const Plan fast = plan_make(request, t, 8.0, 8.0);  // the window's bytes within the forward's compute
  EXPECT_EQ(fast.bottleneck, "compute");
  EXPECT_GT(fast.window.ms, 0.0);
  EXPECT_LT(fast.window.disk_ms, fast.window.compute_ms);
  EXPECT_EQ(fast.window.read_bytes, slow.window.read_bytes) << "the same traffic at another rate";

  request.mem_budget_bytes = 0;  // in RAM, and without clipping (updates during the backward)
  EXPECT_EQ(plan_make(request, t, 2.0, 2.0).window.ms, 0.0);
  request.grad_clip = 0;
  EXPECT_EQ(plan_make(request, t, 2.0, 2.0).window.ms, 0.0);
}

// Note [room for the window]: a group's reads open up to `prefetch` groups back only where the
// store has room for them beside the running group's hold. GPT-2 small at 200M with offloaded
// internals (the measured case): a block's backward holds ~98 MB and reads ~70 MB against 145 MB
// of store, so its reads cannot overlap the backward before it, and the step is at least the
// backwards' compute plus their reads at the disk's rate, over and above the other groups' compute.
TEST(Plan, ReadsLeadOnlyWhereTheBudgetHasRoomForThem) {
  const GptConfig cfg = testing::gpt2_small_config();
  PlanRequest request{cfg, 4, 256, ActivationPolicy::Offload, 1.0, std::size_t{200} << 20, 2};
  request.threads = 2;
  ComputeTiming t;  // as measured on a 2-core machine (docs/benchmarks.md)
  t.layer_forward_ms = 57;
  t.layer_backward_ms = 100;
  t.vocab_forward_ms = 0.5;
  t.vocab_backward_ms = 0.5;
  t.head_lse_ms = 4.5;
  t.head_backward_ms = 11;
  t.other_ms = 4;
  t.adamw_inline_ns_per_float = 0.45;
  t.adamw_worker_ns_per_float = 0.57;
  const double gbps = 2.0;
  const Plan p = plan_make(request, t, gbps, gbps);
  ASSERT_TRUE(p.streaming);
  const std::size_t C = 768, BT = 1024;
  // a block's parameters (12 C^2 floats), its internals and its input boundary activation
  const double block_read_bytes = 12.0 * C * C * 4 + static_cast<double>(p.internals_bytes) / 12 + 4.0 * BT * C;
  const double backward_reads_ms = 12 * block_read_bytes / (gbps * 1e6);
  EXPECT_GT(backward_reads_ms, 300.0);
  EXPECT_GE(p.step_ms, p.compute_ms + 0.9 * backward_reads_ms)
      << "the backwards' reads wait for the room the backward before them holds";
  EXPECT_GT(p.groups_reading, 12);
  EXPECT_LE(p.groups_read_ahead, p.groups_reading - 12) << "no block backward's reads lead it";
  request.mem_budget_bytes = std::size_t{1500} << 20;  // still streaming, with room for every window
  const Plan roomy = plan_make(request, t, gbps, gbps);
  ASSERT_TRUE(roomy.streaming);
  EXPECT_EQ(roomy.groups_read_ahead, roomy.groups_reading);
  EXPECT_LT(roomy.step_ms, p.step_ms);
  EXPECT_NE(plan_describe(p, request).find("reads ahead: " + std::to_string(p.groups_read_ahead) + " of the " +
                                  std::to_string(p.groups_reading) + " groups"),
            std::string::npos);
}

// --activations auto (Note [activations offload]) on fixed inputs: with free I/O offloading the
// internals saves each block's recompute, so the plan takes it; on a 1 MB/s disk their bytes
// cost seconds, so it recomputes; without a budget it recomputes and makes no plan.
TEST(Plan, AutoActivationsOffloadOnAFastDiskRecomputeOnASlowOne) {
  PlanRequest request{plan_config(), 4, 64, ActivationPolicy::Auto, 1.0, 0, -1};
  const ComputeTiming t = fixed_timing();
  const ActivationChoice ram = plan_choose_activations(request, t, 1e6, 1e6);
  EXPECT_EQ(ram.policy, ActivationPolicy::Recompute) << ram.why;

  const std::size_t state = (request.config.vocab_size + request.config.n_ctx + 12 * 8 * 128) * std::size_t{128} * 16;
  PlanRequest recompute = request;
  recompute.activations = ActivationPolicy::Recompute;
  PlanRequest offload = request;
  offload.activations = ActivationPolicy::Offload;
  request.mem_budget_bytes = std::max({state / 4, plan_min_budget_bytes(recompute), plan_min_budget_bytes(offload)});
  recompute.mem_budget_bytes = request.mem_budget_bytes;
  const ActivationChoice fast = plan_choose_activations(request, t, 1e6, 1e6);
  EXPECT_EQ(fast.policy, ActivationPolicy::Offload) << fast.why;
  EXPECT_NE(fast.why.find("auto: recompute"), std::string::npos) << fast.why;
  const Plan fast_recompute = plan_make(recompute, t, 1e6, 1e6);
  const std::size_t internals = Executor::internals_unit_floats(request.config, request.batch, request.seq,
                                                                ParamLayout::of(request.config));
  EXPECT_GE(fast.plan.internals_bytes, request.config.n_layer * internals * sizeof(float));
  EXPECT_EQ(fast_recompute.internals_bytes, 0u);
  const double share = plan_recompute_share(request.config, request.seq);
  EXPECT_GT(share, 0.5);
  EXPECT_LT(share, 0.9) << "a recompute skips the down projection";
  EXPECT_NEAR(fast_recompute.compute_ms - fast.plan.compute_ms, request.config.n_layer * t.layer_forward_ms * share,
              1e-6)
      << "offload saves the recompute's share of a block forward per layer";
  EXPECT_GT(fast.plan.write_bytes, fast_recompute.write_bytes);

  const ActivationChoice slow = plan_choose_activations(request, t, 0.001, 0.001);
  EXPECT_EQ(slow.policy, ActivationPolicy::Recompute) << slow.why;
  EXPECT_GT(slow.plan.step_ms, 0.0);
}

// Note [mixed layers]: a Gemma 3 of 6 layers (5 sliding over 16 keys, 1 full) at 256 positions: the
// measurement times a full layer apart (how much slower it is, docs/benchmarks.md says: a timed
// comparison here would fail on a busy machine); a model of one kind has no such time. The plan
// gives the full layer its time: 5 of layer 0's and 1 of the other's, in RAM and streamed.
TEST(Plan, MixedSlidingAndFullLayersEachTakeTheirKindsTime) {
  GptConfig gemma3 = plan_config();
  gemma3.arch = ModelArch::Llama;
  gemma3.variant = LlamaVariant::Gemma3;
  gemma3.n_layer = 6;
  gemma3.n_kv_head = 1;
  gemma3.n_head_dim = 64;
  gemma3.n_ctx = 256;
  gemma3.sliding_window = 16;
  ASSERT_TRUE(plan_mixed_layers(gemma3));
  PlanRequest request{gemma3, 1, 256, ActivationPolicy::Keep, 1.0, 0, -1};
  ThreadPool pool(1);
  const ComputeTiming measured = plan_measure_compute(pool, request);
  EXPECT_GT(measured.other_layer_forward_ms, 0.0);
  EXPECT_GT(measured.other_layer_backward_ms, 0.0);
  PlanRequest llama = request;
  llama.config.variant = LlamaVariant::Llama;
  llama.config.sliding_window = 0;
  EXPECT_FALSE(plan_mixed_layers(llama.config));
  EXPECT_EQ(plan_measure_compute(pool, llama).other_layer_forward_ms, 0.0);

  ComputeTiming t = fixed_timing();
  const Plan one_kind = plan_make(request, t, 0, 0);
  t.other_layer_forward_ms = 12;
  t.other_layer_backward_ms = 24;
  const Plan mixed = plan_make(request, t, 0, 0);
  EXPECT_NEAR(mixed.compute_ms - one_kind.compute_ms, (12 + 24) - (2 + 4), 1e-9);
  EXPECT_NEAR(mixed.ram_step_ms - one_kind.ram_step_ms, (12 + 24) - (2 + 4), 1e-9);
  request.mem_budget_bytes = one_kind.min_budget_bytes;
  const Plan streamed = plan_make(request, t, 1e6, 1e6);
  EXPECT_TRUE(streamed.streaming);
  EXPECT_NEAR(streamed.compute_ms - plan_make(request, fixed_timing(), 1e6, 1e6).compute_ms, (12 + 24) - (2 + 4), 1e-9);
}

TEST(Plan, EverythingFitsMeansNoTrafficAndTooSmallIsRefused) {
  PlanRequest request{plan_config(), 2, 32, ActivationPolicy::Recompute, 1.0, 0, -1};
  ThreadPool pool(1);
  const ComputeTiming timing = plan_measure_compute(pool, request);
  // Every kind of compute the plan models was found by its span's GroupWork tag.
  EXPECT_GT(timing.layer_forward_ms, 0.0);
  EXPECT_GT(timing.layer_backward_ms, 0.0);
  EXPECT_GT(timing.vocab_forward_ms, 0.0);
  EXPECT_GT(timing.vocab_backward_ms, 0.0);
  EXPECT_GT(timing.head_lse_ms, 0.0);
  EXPECT_GT(timing.head_backward_ms, 0.0);
  EXPECT_GT(timing.adamw_inline_ns_per_float, 0.0);
  const Plan ram = plan_make(request, timing, 0, 0);
  EXPECT_FALSE(ram.streaming);
  EXPECT_EQ(ram.read_bytes + ram.write_bytes, 0u);
  EXPECT_GT(ram.step_ms, 0.0);
  request.mem_budget_bytes = std::size_t{64} << 30;  // a budget that holds everything
  const Plan roomy = plan_make(request, timing, 1.0, 1.0);
  EXPECT_FALSE(roomy.streaming);
  request.mem_budget_bytes = ram.min_budget_bytes - 1;
  try {
    plan_make(request, timing, 1.0, 1.0);
    ADD_FAILURE() << "a budget below the minimum must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("below the minimum"), std::string::npos) << e.what();
    // One byte short reads the same in MiB: the bytes say which is smaller.
    EXPECT_NE(std::string(e.what()).find(" (" + std::to_string(ram.min_budget_bytes) + " bytes) for this model"),
              std::string::npos) << e.what();
  }
}

TEST(Plan, CliPrintsThePlanAndRefusesBadInput) {
  testing::TempDir tmp;
  const std::string shape = " --layers 8 --heads 4 --embd 128 --ctx 64 --vocab 2048 --batch 4 --seq 64";
  const auto r = testing::run_stratum("plan" + shape + " --mem-budget 12M --offload-dir " + tmp.path());
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  for (const char* words : {"state: params", "placement", "I/O per step", "prefetch", "update window", "predicted step", "bottleneck"})
    EXPECT_NE(r.output.find(words), std::string::npos) << words << " in:\n" << r.output;
  const auto ram = testing::run_stratum("plan" + shape);
  EXPECT_EQ(ram.exit_code, 0) << ram.errors;
  EXPECT_NE(ram.output.find("everything in RAM"), std::string::npos) << ram.output;
  // bf16 products keep rounded copies of their operands: more engine memory, a larger minimum
  // (it printed fp32's minimum for bf16).
  const auto bf16 = testing::run_stratum("plan" + shape + " --precision bf16");
  EXPECT_EQ(bf16.exit_code, 0) << bf16.errors;
  const auto minimum = [](const std::string& text) {
    const auto at = text.find("minimum budget ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find(';', at) - at);
  };
  EXPECT_NE(minimum(bf16.output), minimum(ram.output)) << bf16.output;
  EXPECT_NE(testing::run_stratum("plan" + shape + " --precision fp16").errors.find("'fp32' or 'bf16'"), std::string::npos);
  // Note [bounded measurement]: a budget below the minimum is refused before anything is
  // measured (it measured first, with memory far beyond the budget, then refused): no disk
  // calibration was run to be cached.
  const std::string cache = tmp.file("cache");
  std::filesystem::create_directories(tmp.file("offload"));
  const auto small = testing::run_stratum("plan" + shape + " --mem-budget 64K --offload-dir " + tmp.file("offload"));
  {
    const testing::ScopedEnv cache_dir("STRATUM_CACHE_DIR", cache);
    const auto refused = testing::run_stratum("plan" + shape + " --mem-budget 64K --offload-dir " + tmp.file("offload"));
    EXPECT_EQ(refused.exit_code, 1);
    EXPECT_FALSE(file_exists(cache + "/calibration.json")) << "measured before refusing";
  }
  EXPECT_EQ(small.exit_code, 1);
  EXPECT_NE(small.errors.find("use --mem-budget"), std::string::npos) << small.errors;
  const auto no_dir = testing::run_stratum("plan" + shape + " --mem-budget 3M");
  EXPECT_EQ(no_dir.exit_code, 1);
  EXPECT_NE(no_dir.errors.find("--offload-dir"), std::string::npos) << no_dir.errors;
  // Note [frozen MLP rows]: sub-chunks only where the MLP trains nothing and is wide enough.
  const auto rows_range = testing::run_stratum("plan" + shape + " --mlp-rows 2048");
  EXPECT_EQ(rows_range.exit_code, 1);
  EXPECT_NE(rows_range.errors.find("--mlp-rows must be in 1..1024"), std::string::npos) << rows_range.errors;
  const auto rows_trained = testing::run_stratum("plan" + shape + " --mlp-rows 256");
  EXPECT_EQ(rows_trained.exit_code, 1);
  EXPECT_NE(rows_trained.errors.find("needs MLPs that train nothing"), std::string::npos) << rows_trained.errors;
  // --row-chunk (Note [row chunks]): named in the plan where it is not the default; it bounds --mlp-rows.
  const auto chunked = testing::run_stratum("plan" + shape + " --row-chunk 256");
  ASSERT_EQ(chunked.exit_code, 0) << chunked.errors;
  EXPECT_NE(chunked.output.find("blocks in row chunks of 256 rows"), std::string::npos) << chunked.output;
  EXPECT_NE(testing::run_stratum("plan" + shape + " --row-chunk 0").errors.find("--row-chunk must be in 1..1048576"),
            std::string::npos);
  EXPECT_NE(testing::run_stratum("plan" + shape + " --row-chunk 256 --mlp-rows 512").errors.find("--mlp-rows must be in 1..256"),
            std::string::npos);
}

// Note [frozen MLP rows]: LoRA on the attention of a GPT-2 wide enough (C = 576): the minimum is
// the 256-row sub-chunks', the plan takes them just above it and keeps whole chunks where they fit.
TEST(Plan, TakesTheLargestMlpSubChunkThatFits) {
  testing::TempDir tmp;
  const std::string shape = " --layers 2 --heads 8 --embd 576 --ctx 128 --vocab 512 --batch 4 --seq 128 --threads 2"
                            " --lora-r 4 --lora-targets c_attn";
  const auto ram = testing::run_stratum("plan" + shape + " --activations recompute");
  ASSERT_EQ(ram.exit_code, 0) << ram.errors;
  const auto at = ram.output.find("minimum budget ");
  ASSERT_NE(at, std::string::npos) << ram.output;
  const double min_mib = std::stod(ram.output.substr(at + 15));
  ASSERT_NE(ram.output.find("MiB", at), std::string::npos);
  const auto tight = testing::run_stratum("plan" + shape + " --activations recompute --mem-budget " +
                                          std::to_string(static_cast<int>(min_mib) + 1) + "M --offload-dir " + tmp.path());
  ASSERT_EQ(tight.exit_code, 0) << tight.errors;
  EXPECT_NE(tight.output.find("MLP in sub-chunks of 256 rows"), std::string::npos) << tight.output;
  const auto roomy = testing::run_stratum("plan" + shape + " --activations recompute --mem-budget 400M --offload-dir " +
                                          tmp.path());
  ASSERT_EQ(roomy.exit_code, 0) << roomy.errors;
  EXPECT_EQ(roomy.output.find("MLP in sub-chunks"), std::string::npos) << roomy.output;
}

// --row-chunk (Note [row chunks]) sizes the engine's chunk buffers: at 2048 rows a step, 256-row
// chunks need a smaller minimum budget than the default 1024, and 2048 a larger one, which no
// larger chunk raises (a chunk holds at most B*T rows); a budget below the minimum is refused
// naming the largest smaller chunk that fits it. An MLP that trains nothing takes its
// sub-chunks from the run's chunk: the chunk in RAM, kFrozenMlpRows (or the chunk, if smaller)
// at the smallest budget.
TEST(Plan, TheRowChunkSizesTheEngineAndTheMlpSubChunks) {
  GptConfig cfg = plan_config();
  cfg.n_ctx = 512;
  const PlanRequest r{cfg, 4, 512, ActivationPolicy::Recompute, 1.0, 0, -1};
  auto min_at = [&](const PlanRequest& request, int chunk) {
    PlanRequest t = request;
    t.row_chunk = chunk;
    return plan_min_budget_bytes(t);
  };
  EXPECT_LT(min_at(r, 256), min_at(r, kRowChunk));
  EXPECT_LT(min_at(r, kRowChunk), min_at(r, 2048));
  EXPECT_EQ(min_at(r, 2048), min_at(r, 8192));
  // A budget below the minimum is refused with the largest smaller chunk that fits it, if any.
  auto refusal = [&](std::size_t budget) {
    PlanRequest t = r;
    t.mem_budget_bytes = budget;
    try {
      plan_budget_check(t, plan_min_budget_bytes(t));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(min_at(r, 256)).find(", --row-chunk 256 (minimum "), std::string::npos) << refusal(min_at(r, 256));
  EXPECT_NE(refusal(min_at(r, 512)).find(", --row-chunk 512 (minimum "), std::string::npos);
  const std::string none = refusal(min_at(r, 64) - 1);
  EXPECT_NE(none.find("is below the minimum"), std::string::npos) << none;
  EXPECT_EQ(none.find("--row-chunk"), std::string::npos) << none;
  GptConfig wide = cfg;  // C x I above 2^20 (mlp_sub_chunks_exact), adapters on the attention only
  wide.n_layer = 2;
  wide.n_head = 8;
  wide.n_embd = 576;
  PlanRequest frozen{wide, 4, 512, ActivationPolicy::Recompute, 1.0, 0, -1};
  frozen.lora = lora_config_make(LoraFamily::Gpt2, 4, 8, "c_attn", false, 0);
  ASSERT_TRUE(plan_mlp_may_sub_chunk(frozen));
  for (const int chunk : {128, 512}) {
    SCOPED_TRACE(chunk);
    frozen.row_chunk = chunk;
    frozen.mem_budget_bytes = 0;
    EXPECT_EQ(plan_mlp_rows(frozen), chunk);
    frozen.mem_budget_bytes = plan_min_budget_bytes(frozen);  // the smallest sub-chunk's
    EXPECT_EQ(plan_mlp_rows(frozen), std::min(chunk, kFrozenMlpRows));
  }
}

// Note [bounded measurement]: the measuring process stays within the budget. Its one-layer model
// (params and gradients of the layer and of four vocabulary blocks) and its buffers need more
// than 70 MiB here; it streamed them from a scratch subdirectory of the offload dir, which is
// gone afterwards. It held them all in RAM beside AdamW's timing buffers: 105 MiB of RSS. The
// slack is the process itself (code, libraries, BLAS buffers: 10-12 MiB measured).
TEST(Plan, TheMeasurementStaysWithinTheBudget) {
  testing::TempDir tmp;
  [[maybe_unused]] const std::size_t budget = std::size_t{70} << 20;  // unused under the sanitizers
  const auto r = testing::run_stratum("plan --layers 2 --heads 8 --embd 512 --ctx 256 --vocab 32768 --batch 4 --seq 128"
                                      " --mem-budget 70M --offload-dir " + tmp.path() + " --measure-json --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  const std::size_t peak = j.at("peak_rss_bytes").get<std::size_t>();
  EXPECT_GT(peak, std::size_t{40} << 20) << "the measurement must have used memory";
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their shadow memory is RSS too
  EXPECT_LE(peak, budget + (std::size_t{24} << 20)) << "peak RSS " << (peak >> 20) << " MiB for a 70 MiB budget";
#endif
  EXPECT_GT(j.at("layer_forward_ms").get<double>(), 0.0);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "the scratch directory must be removed";
}

// Note [stale plan directories]: a run killed while its plan was measured leaves
// TMPDIR/stratum-plan-<pid>-XXXXXX (the measured config) and OFFLOAD/stratum-plan-<pid> (the
// measurement's offload files), and OFFLOAD/.stratum-calibrate.<pid>.tmp. The next run's plan removes those of processes that are gone and
// keeps a live process's and anything not named by a pid; its own are gone when it ends.
TEST(Plan, DirectoriesOfKilledRunsAreRemovedByTheNextPlan) {
  testing::TempDir tmp, off, work;
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string gone = std::to_string(dead), alive = std::to_string(::getpid());
  auto make = [](const std::string& dir) {
    std::filesystem::create_directories(dir);
    file_write_atomic(dir + "/config.json", "{}");
  };
  make(tmp.file("stratum-plan-" + gone + "-a1B2c3"));
  make(off.file("stratum-plan-" + gone));
  make(tmp.file("stratum-plan-" + alive + "-KeepMe"));
  make(off.file("stratum-plan-" + alive));
  make(off.file("stratum-plan-notes"));
  // The disk test file of a measurement that died of Ctrl-C (it has no handler: no destructor ran).
  file_write_atomic(off.file(".stratum-calibrate." + gone + ".tmp"), "x");
  file_write_atomic(off.file(".stratum-calibrate." + alive + ".tmp"), "x");
  file_write_atomic(off.file(".stratum-calibrate." + gone + ".tmp.mine"), "x");
  const std::string data = testing::write_random_tokens(work.file("train.bin"), 4096, 512, 3);
  testing::ScopedEnv tmpdir("TMPDIR", tmp.path());
  const auto r = testing::run_stratum("train --layers 2 --heads 2 --embd 64 --ctx 64 --vocab 512 --batch 2 --seq 16"
                                      " --steps 1 --threads 2 --data " + data + " --mem-budget 64M --offload-dir " +
                                      off.path());
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("stratum-plan-" + gone + "-a1B2c3")));
  EXPECT_FALSE(std::filesystem::exists(off.file("stratum-plan-" + gone)));
  EXPECT_TRUE(std::filesystem::exists(tmp.file("stratum-plan-" + alive + "-KeepMe")));
  EXPECT_TRUE(std::filesystem::exists(off.file("stratum-plan-" + alive)));
  EXPECT_TRUE(std::filesystem::exists(off.file("stratum-plan-notes")));
  EXPECT_FALSE(std::filesystem::exists(off.file(".stratum-calibrate." + gone + ".tmp")));
  EXPECT_TRUE(std::filesystem::exists(off.file(".stratum-calibrate." + alive + ".tmp")));
  EXPECT_TRUE(std::filesystem::exists(off.file(".stratum-calibrate." + gone + ".tmp.mine")));
  std::size_t left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) left += entry.path().filename() != "stratum-plan-" + alive + "-KeepMe";
  EXPECT_EQ(left, 0u) << "the run's own config directory must be removed";
}

// A run that does not fit in RAM is planned, and the plan says train would refuse it in RAM and
// what budget would run it (it printed an in-RAM step time and exited 0, as if it would run).
TEST(Plan, SaysWhenARunDoesNotFitInRam) {
  const auto r = testing::run_stratum("plan --layers 1024 --heads 16 --embd 2048 --ctx 64 --vocab 50257 --batch 1 "
                                      "--seq 64 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("does not fit: this run needs "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--mem-budget SIZE (at least "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace stratum
