// Executor + GPT-2 model vs PyTorch golden files: loss and every gradient for one batch of the
// tiny model, loading HF files with and without the "transformer." prefix.
#include "exec/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data/token_file.h"
#include "integration_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/matmul.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "store/tiered_segment_store.h"
#include "weights/model_io.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using testing::golden_f32;
using testing::source_path;

const std::string kTiny = "tests/golden/tiny_gpt2";

TEST(Executor, LossAndGradientsMatchPyTorch) {
  const std::string dir = source_path(kTiny);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  const int B = 4, T = 32;
  RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, B, T));
  model_load_weights(dir, layout, store);
  ThreadPool pool(2);
  blas_set_threads(2);
  Executor exec(pool, cfg, store, B, T);
  const testing::GoldenBatch batch = testing::golden_batch(dir, B, T);
  const std::vector<std::int32_t>& inputs = batch.inputs;
  const std::vector<std::int32_t>& targets = batch.targets;

  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const float loss = exec.forward_backward(inputs.data(), targets.data(), B, T);
  EXPECT_NEAR(loss, golden_f32(ref, "loss")[0], 1e-5);
  EXPECT_NEAR(exec.loss(inputs.data(), targets.data(), B, T), loss, 0.0) << "eval loss must equal training loss";

  int checked = 0;
  double squares = 0.0;  // the gradient norm's sum, tensor by tensor in segment order
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentChunksHold grads(store, s, SegmentKind::Grads, Access::Read);
    for (const auto& t : layout.segments()[s].tensors) {
      squares += exec.ops().sum_squares(grads.tensor(t), t.numel);
      const auto expected = golden_f32(ref, "grad.transformer." + t.name);
      std::size_t hf_numel = 1;
      for (auto d : t.hf_shape) hf_numel *= static_cast<std::size_t>(d);
      ASSERT_EQ(expected.size(), hf_numel) << t.name;
      const std::size_t base = t.hf_first();  // a vocabulary block holds some rows of wte
      double max_err = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < t.numel; ++i) {
        const double want = expected[base + i];
        max_err = std::max(max_err, std::abs(static_cast<double>(grads.tensor(t)[i]) - want));
        max_ref = std::max(max_ref, std::abs(want));
      }
      EXPECT_LE(max_err, 1e-6 + 1e-4 * max_ref) << t.name << " max |ref| " << max_ref;
      ++checked;
    }
  }
  EXPECT_EQ(checked, layout.vocab_block_count() + 1 + 12 * cfg.n_layer + 2);
  EXPECT_GE(layout.vocab_block_count(), 2) << "the golden model should exercise the vocabulary blocks";
  // In RAM every buffer stays in place, so the norm's sums were taken in one pass at the
  // backward's end (Note [norm in one pass]): every tensor's, of its final gradient.
  EXPECT_EQ(exec.grad_sum_squares(), squares);
}

TEST(Executor, LoadsNamesWithoutPrefixAndIgnoresBuffers) {
  const std::string dir = source_path(kTiny);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  RamSegmentStore a(layout), b(layout);
  model_load_weights(dir, layout, a);
  testing::TempDir tmp;
  std::filesystem::copy_file(dir + "/config.json", tmp.file("config.json"));
  std::filesystem::copy_file(dir + "/model_with_buffers.safetensors", tmp.file("model.safetensors"));
  model_load_weights(tmp.path(), layout, b);
  EXPECT_EQ(model_params_hash(layout, a), model_params_hash(layout, b));
}

TEST(Executor, SaveThenLoadIsBitIdentical) {
  const std::string dir = source_path(kTiny);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  RamSegmentStore a(layout), b(layout);
  model_init_random(cfg, layout, a, 42);
  testing::TempDir tmp;
  const std::string out = tmp.file("saved");
  model_save(out, cfg, layout, a, "");
  EXPECT_EQ(model_read_config(out).n_embd, cfg.n_embd);
  model_load_weights(out, layout, b);
  EXPECT_EQ(model_params_hash(layout, a), model_params_hash(layout, b));
  // HF layout: every name carries "transformer.", no lm_head (tied).
  const SafetensorsFile file = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_NE(file.find("transformer.wte.weight"), nullptr);
  EXPECT_NE(file.find("transformer.h.1.mlp.c_proj.weight"), nullptr);
  EXPECT_EQ(file.find("lm_head.weight"), nullptr);
  // Saving again over an existing model replaces it whole and leaves no temporaries.
  model_init_random(cfg, layout, a, 43);
  model_save(out, cfg, layout, a, "");
  model_load_weights(out, layout, b);
  EXPECT_EQ(model_params_hash(layout, a), model_params_hash(layout, b));
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(Executor, SaveFailureKeepsPreviousModel) {
  const std::string dir = source_path(kTiny);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  RamSegmentStore a(layout);
  model_init_random(cfg, layout, a, 1);
  testing::TempDir tmp;
  // Target is an existing regular file: the swap must fail and leave the file untouched.
  const std::string target = tmp.file("model");
  file_write_atomic(target, std::string("precious"));
  EXPECT_THROW(model_save(target, cfg, layout, a, ""), Error);
  EXPECT_EQ(file_read_all(target), "precious");
  // Missing parent directory: clear error, nothing created.
  EXPECT_THROW(model_save(tmp.file("no/such/dir"), cfg, layout, a, ""), Error);
  EXPECT_FALSE(dir_exists(tmp.file("no")));
}

TEST(Executor, RandomInitIsSeeded) {
  GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.n_ctx = 8;
  cfg.vocab_size = 50;
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  RamSegmentStore a(layout), b(layout), c(layout);
  model_init_random(cfg, layout, a, 7);
  model_init_random(cfg, layout, b, 7);
  model_init_random(cfg, layout, c, 8);
  EXPECT_EQ(model_params_hash(layout, a), model_params_hash(layout, b));
  EXPECT_NE(model_params_hash(layout, a), model_params_hash(layout, c));
}

// The pool makes the values in 64Ki pieces (Rng::skip): the same bits as one thread taking the
// stream in order, for GPT-2 and Llama, with tensors of several pieces.
TEST(Executor, RandomInitOnAPoolIsTheSequentialStream) {
  Rng r(5), s(5);
  for (int i = 0; i < 7; ++i) r.next_u64();
  s.skip(7);
  EXPECT_EQ(r.next_u64(), s.next_u64());
  for (const bool llama : {false, true}) {
    GptConfig cfg;
    cfg.arch = llama ? ModelArch::Llama : ModelArch::Gpt2;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_kv_head = llama ? 2 : 0;
    cfg.n_embd = 512;
    cfg.n_inner = llama ? 1376 : 0;  // GPT-2's c_fc and Llama's MLP matrices: 11-16 pieces
    cfg.n_ctx = 16;
    cfg.vocab_size = 301;
    const ParamLayout layout = ParamLayout::of(cfg);
    RamSegmentStore a(layout), b(layout);
    ThreadPool pool(3);
    model_init_random(cfg, layout, a, 11);
    model_init_random(cfg, layout, b, 11, &pool);
    EXPECT_EQ(model_params_hash(layout, a), model_params_hash(layout, b)) << (llama ? "llama" : "gpt2");
    // ... and those are the stream's values: the first tensor's first and last
    // The largest N(0, 0.02) matrix against the stream at its place: matrices take values in
    // segment and tensor order, vectors none.
    int seg = -1;
    std::size_t slot = 0, offset = 0, before = 0, best = 0;
    for (int g = 0; g < layout.segment_count(); ++g) {
      const auto& ts = layout.segments()[g].tensors;
      for (std::size_t i = 0; i < ts.size(); ++i) {
        if (ts[i].shape.size() != 2) continue;
        if (ts[i].numel > best && ts[i].name.find("c_proj") == std::string::npos) {
          seg = g, slot = i, offset = before, best = ts[i].numel;
        }
        before += ts[i].numel;
      }
    }
    ASSERT_GT(best, 3u << 16);  // several pieces
    const TensorSlot& t = layout.segments()[seg].tensors[slot];
    SegmentChunksHold held(b, seg, SegmentKind::Params, Access::Read);
    const float* w = held.tensor_view(t).f32();
    Rng seq(11);
    seq.skip(2 * offset);
    EXPECT_EQ(w[0], static_cast<float>(seq.normal() * 0.02)) << t.name;
    seq.skip(2 * (t.numel - 2));
    EXPECT_EQ(w[t.numel - 1], static_cast<float>(seq.normal() * 0.02)) << t.name;
  }
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// Note [optimizer overlap], Note [update thread]: Overlapped (no clipping) and Pipelined updates
// give the bits of Inline ones, on the optimizer worker and on the training thread at their
// Optimizer groups (Overlapped right after each backward, Pipelined kept for the next step's
// forward), in RAM and streamed through a tiered store at its minimum budget, whatever the
// machine's CPU count (optimizer_worker_set overrides the constructor's choice); a loss pass after
// each step runs or waits for what is owed. Without a worker the training thread never waits for
// one, and the minimum budget holds no update beside the other groups.
TEST(Executor, UpdatesOnTheWorkerOrAtTheirGroupsGiveTheSameBits) {
  const std::string dir = source_path(kTiny);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  const int B = 4, T = 32;
  const auto tokens = token_file_read(dir + "/tokens.bin").tokens;
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T));
  ThreadPool pool(2);
  blas_set_threads(1);  // OpenBLAS's own threads are invisible to ThreadSanitizer (tools/sanitize.sh)
  testing::TempDir tmp;
  struct Run {
    std::uint64_t hash;
    std::vector<float> losses;
    double waited_ms = 0.0;
    std::size_t min_bytes = 0;
  };
  auto run = [&](OptimizerMode mode, double clip, int worker, bool streamed) {  // worker -1: Inline
    std::unique_ptr<SegmentStore> store;  // outlives the executor, which detaches from it
    Executor exec(pool, cfg, units, B, T, ActivationPolicy::Recompute, mode);
    if (worker >= 0) exec.optimizer_worker_set(worker == 1);
    EXPECT_EQ(exec.optimizer_worker(), worker == 1);
    Run r;
    r.min_bytes = exec.min_store_bytes();
    if (streamed) {
      TieredStoreOptions so;
      so.budget_bytes = r.min_bytes;
      so.offload_dir = tmp.path();
      store = std::make_unique<TieredSegmentStore>(units, so);
    } else {
      store = std::make_unique<RamSegmentStore>(units);
    }
    model_load_weights(dir, layout, *store);
    exec.attach(*store);
    for (int step = 0; step < 3; ++step) {
      std::vector<std::int32_t> inputs(tokens.begin() + step, tokens.begin() + step + B * T);
      std::vector<std::int32_t> targets(tokens.begin() + step + 1, tokens.begin() + step + B * T + 1);
      const StepResult s = exec.train_step(inputs.data(), targets.data(), B, T,
                                           AdamWHyper{1e-3, 0.9, 0.95, 1e-8, step + 1}, 0.1, clip);
      r.losses.push_back(s.loss);
      r.waited_ms += s.optimizer_wait_ms;
      r.losses.push_back(exec.loss(inputs.data(), targets.data(), B, T));
    }
    exec.sync();
    r.hash = model_params_hash(layout, *store);
    return r;
  };
  std::vector<std::uint64_t> inline_hashes;
  for (const double clip : {0.0, 0.5}) {
    const Run want = run(OptimizerMode::Inline, clip, -1, false);
    inline_hashes.push_back(want.hash);
    for (const bool streamed : {false, true}) {
      // Streamed runs pipeline their updates with or without clipping (optimizer_mode_for).
      const OptimizerMode mode = clip > 0 || streamed ? OptimizerMode::Pipelined : OptimizerMode::Overlapped;
      const Run on = run(mode, clip, 1, streamed), at_groups = run(mode, clip, 0, streamed);
      for (const Run* got : {&on, &at_groups}) {
        SCOPED_TRACE(std::string(optimizer_mode_name(mode)) + (streamed ? " streamed" : " in RAM") + " clip " +
                     std::to_string(clip) + (got == &on ? " worker" : " at groups"));
        EXPECT_EQ(got->hash, want.hash);
        EXPECT_EQ(got->losses, want.losses);
      }
      EXPECT_EQ(at_groups.waited_ms, 0.0);
      EXPECT_LE(at_groups.min_bytes, on.min_bytes);
    }
  }
  EXPECT_NE(inline_hashes[0], inline_hashes[1]) << "the clipping takes part";
}

// Note [embedding rows ahead]: a pipelined step's lookup from the rows gathered ahead gives the
// bits of the lookup from the updated blocks, tied (GPT-2) and untied (Llama), with one and two
// micro-batches: with every following step's inputs known, with one guessed wrong (that step reads
// the blocks), with a loss pass and a sync between steps, and with no InputsAhead at all. The
// clipping is active (the rows' update takes the clip coefficient) and the logits after agree.
TEST(Executor, EmbeddingRowsAheadGiveTheUpdatedBlocksBits) {
  for (const std::string& name : {kTiny, std::string("tests/golden/tiny_llama")})
    for (const int micro : {1, 2}) {
      SCOPED_TRACE(name + " micro-batches " + std::to_string(micro));
      const std::string dir = source_path(name);
      const GptConfig cfg = model_read_config(dir);
      const ParamLayout layout = ParamLayout::of(cfg);
      const int B = 2, T = 16, BT = B * T, N = micro * BT;
      const long steps = 5;
      const auto tokens = token_file_read(dir + "/tokens.bin").tokens;
      auto batch = [&](long step, std::int32_t* in, std::int32_t* tg) {
        for (int i = 0; i < N; ++i) {
          const std::size_t at = static_cast<std::size_t>(step * 7 + i) % (tokens.size() - 1);
          in[i] = tokens[at];
          if (tg != nullptr) tg[i] = tokens[at + 1];
        }
      };
      enum class Ahead { None, Right, WrongOnce };
      struct Run {
        std::uint64_t hash;
        std::vector<float> losses, logits;
        long rows_ahead_steps;
        float least_scale = 1.0f;
      };
      auto run = [&](OptimizerMode mode, Ahead how, bool worker = false) {
        const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T), UnitSet::Training, false, 0,
                              micro > 1);
        RamSegmentStore store(units);
        model_load_weights(dir, layout, store);
        ThreadPool pool(2);
        blas_set_threads(1);
        Executor exec(pool, cfg, units, B, T, ActivationPolicy::Recompute, mode, Precision::Fp32, Backend::Cpu, micro);
        if (mode == OptimizerMode::Pipelined) exec.optimizer_worker_set(worker);  // Note [update thread]
        exec.attach(store);
        Run r;
        for (long step = 0; step < steps; ++step) {
          std::vector<std::int32_t> in(N), tg(N);
          batch(step, in.data(), tg.data());
          Executor::InputsAhead ahead;
          if (how != Ahead::None)
            ahead = [&, step](int k, std::int32_t* next, std::size_t n) {
              if (step + k >= steps || n != static_cast<std::size_t>(N)) return false;
              batch(how == Ahead::WrongOnce && step + k == 3 ? 99 : step + k, next, nullptr);
              return true;
            };
          const StepResult s = exec.train_step(in.data(), tg.data(), B, T, AdamWHyper{1e-2, 0.9, 0.95, 1e-8, step + 1},
                                               0.1, 0.5, ahead);
          r.losses.push_back(s.loss);
          r.least_scale = std::min(r.least_scale, s.grad_scale);
          if (step == 1) {  // reads the blocks as updated; leaves the rows ahead as they were
            r.losses.push_back(exec.loss(in.data(), tg.data(), B, T));
            exec.sync();
          }
        }
        r.logits.resize(static_cast<std::size_t>(cfg.vocab_size));
        std::vector<std::int32_t> prompt(N);
        batch(0, prompt.data(), nullptr);
        exec.logits_last(prompt.data(), T, r.logits.data());
        exec.sync();
        r.hash = model_params_hash(layout, store);
        r.rows_ahead_steps = exec.rows_ahead_steps();
        return r;
      };
      const Run want = run(OptimizerMode::Inline, Ahead::None);
      EXPECT_LT(want.least_scale, 1.0f) << "the clipping takes part";
      for (const Ahead how : {Ahead::Right, Ahead::WrongOnce, Ahead::None}) {
        for (const bool worker : {true, false}) {
          SCOPED_TRACE(std::string(worker ? "on the worker" : "at the groups") + ", ahead " +
                       std::to_string(static_cast<int>(how)));
          const Run got = run(OptimizerMode::Pipelined, how, worker);
          EXPECT_EQ(got.hash, want.hash);
          EXPECT_EQ(got.losses, want.losses);
          EXPECT_EQ(got.logits, want.logits);
          // The first step has nothing gathered; the wrong guess costs step 3 its rows.
          EXPECT_EQ(got.rows_ahead_steps, how == Ahead::Right ? 4 : how == Ahead::WrongOnce ? 3 : 0);
        }
      }
      EXPECT_EQ(want.rows_ahead_steps, 0);
    }
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// Note [segment chunks]: updating a segment chunk by chunk (params, grads and moments of one
// chunk at a time) gives the same bits as one AdamW call per whole tensor.
TEST(Executor, ChunkedOptimizerEqualsPerTensorAdamW) {
  GptConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 512;
  cfg.n_ctx = 16;
  cfg.vocab_size = 8192;
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, 1, 16));
  // ln_1 + c_attn (787K floats); c_proj + ln_2; c_fc weight (1M); c_fc bias + mlp c_proj weight;
  // mlp c_proj bias.
  ASSERT_EQ(store.units().chunk_count(layout.layer_segment(0), SegmentKind::AdamM), 5);
  model_init_random(cfg, layout, store, 3);
  ThreadPool pool(2);
  Executor exec(pool, cfg, store, 1, 16);
  struct Copy {
    std::vector<float> p, g, m, v;
  };
  std::vector<std::vector<Copy>> ref(static_cast<std::size_t>(layout.segment_count()));  // [segment][tensor]
  Rng rng(9);
  for (int step = 1; step <= 2; ++step) {
    for (int s = 0; s < layout.segment_count(); ++s) {
      const auto& tensors = layout.segments()[s].tensors;
      ref[s].resize(tensors.size());
      SegmentChunksHold g(store, s, SegmentKind::Grads, Access::Overwrite);
      SegmentChunksHold p(store, s, SegmentKind::Params, Access::Read);
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        float* gt = g.tensor(tensors[t]);
        for (std::size_t i = 0; i < tensors[t].numel; ++i) gt[i] = static_cast<float>(rng.normal());
        if (step == 1) {
          ref[s][t].p.assign(p.tensor(tensors[t]), p.tensor(tensors[t]) + tensors[t].numel);
          ref[s][t].m.assign(tensors[t].numel, 0.0f);
          ref[s][t].v.assign(tensors[t].numel, 0.0f);
        }
        ref[s][t].g.assign(gt, gt + tensors[t].numel);
      }
    }
    const AdamWHyper hyper{1e-3, 0.9, 0.95, 1e-8, step};
    exec.optimizer_step(hyper, 0.1, 0.5f);
    for (int s = 0; s < layout.segment_count(); ++s)
      for (std::size_t t = 0; t < ref[s].size(); ++t) {
        const TensorSlot& slot = layout.segments()[s].tensors[t];
        Copy& r = ref[s][t];
        adamw_update(pool, r.p.data(), r.m.data(), r.v.data(), r.g.data(), slot.numel, hyper,
                     slot.weight_decay ? 0.1 : 0.0, 0.5f);
      }
  }
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentChunksHold p(store, s, SegmentKind::Params, Access::Read);
    for (std::size_t t = 0; t < ref[s].size(); ++t) {
      const TensorSlot& slot = layout.segments()[s].tensors[t];
      EXPECT_EQ(std::memcmp(p.tensor(slot), ref[s][t].p.data(), slot.numel * sizeof(float)), 0) << slot.name;
    }
  }
}

}  // namespace
// Note [streamed updates after the backward]: which order the updates run in, by clipping, worker
// and streaming.
TEST(Executor, StreamedRunsPipelineTheirUpdatesWithOrWithoutClipping) {
  EXPECT_EQ(optimizer_mode_for(1.0, false, false), OptimizerMode::Inline);
  EXPECT_EQ(optimizer_mode_for(1.0, true, false), OptimizerMode::Pipelined);
  EXPECT_EQ(optimizer_mode_for(1.0, true, true), OptimizerMode::Pipelined);
  EXPECT_EQ(optimizer_mode_for(0.0, false, false), OptimizerMode::Overlapped);
  EXPECT_EQ(optimizer_mode_for(0.0, true, false), OptimizerMode::Overlapped) << "beside a device, in RAM";
  EXPECT_EQ(optimizer_mode_for(0.0, true, true), OptimizerMode::Pipelined) << "under --mem-budget";
}

}  // namespace stratum
