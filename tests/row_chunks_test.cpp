// The MLP half of a block in row chunks (Note [row chunks] in model/block_policy.h): a pass of
// more than kRowChunk rows gives the gradients of the same sequences run as one-sequence
// micro-batches (each a single chunk, the unchunked computation), for GPT-2 and Llama, with and
// without adapters on every linear; training at such a size gives the same bits whatever the
// activation policy, budget and prefetch depth; an adapter's rows see the rows of its pass's
// dropout mask and kept u; the one recomputed set of internals holds one chunk of its row-wise
// internals; and another row chunk (train --row-chunk) is another fixed partition: correct
// gradients, and the same bits for every policy, budget and prefetch depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "exec/executor.h"
#include "integration_util.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "model/block_policy.h"
#include "model/gpt2_head.h"
#include "model/lora.h"
#include "model/transformer_block.h"
#include "store/tiered_segment_store.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

// 3 sequences of 400 tokens: 1200 rows, MLP chunks [0, 1024) and [1024, 1200); the second starts
// inside the third sequence.
constexpr int kB = 3, kT = 400;
static_assert(kB * kT > kRowChunk && (kRowChunk % kT) != 0, "two chunks, split inside a sequence");

// qwen3: the Llama with per-head q and k norms (Note [qk norm]), 4 heads of 16 (wider than C).
GptConfig chunk_config(bool llama, bool qwen3 = false) {
  GptConfig c;
  c.arch = llama ? ModelArch::Llama : ModelArch::Gpt2;
  if (qwen3) {
    c.variant = LlamaVariant::Qwen3;
    c.n_head_dim = 16;
  }
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.n_ctx = 512;
  c.vocab_size = 97;
  if (llama) {
    c.n_kv_head = 2;
    c.n_inner = 88;
    c.tie_word_embeddings = false;
  }
  return c;
}

LoraConfig every_linear(bool llama, double dropout) {
  return lora_config_make(llama ? LoraFamily::Llama : LoraFamily::Gpt2, 4, 8,
                          llama ? "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" : "c_attn,c_proj,c_fc",
                          false, dropout);
}

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> out(n);
  for (std::int32_t& t : out) t = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(vocab));
  return out;
}

// Every adapter's A and B set to small random values (a fresh adapter's B is zero, which would
// leave A's gradient zero).
void lora_fill(const ParamLayout& layout, SegmentStore& store) {
  Rng rng(99);
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (layout.segments()[s].role != SegmentRole::Lora) continue;
    SegmentChunksHold params(store, s, SegmentKind::Params, Access::Update);
    for (const TensorSlot& t : layout.segments()[s].tensors)
      for (std::size_t i = 0; i < t.numel; ++i) params.tensor(t)[i] = 0.1f * static_cast<float>(rng.normal());
  }
}

// Every trainable gradient after one forward and backward of the kB x kT batch as `micro`
// micro-batches of kB / micro sequences.
std::vector<std::vector<float>> batch_grads(const GptConfig& cfg, const LoraConfig& lora, int micro,
                                            int row_chunk = kRowChunk) {
  const ParamLayout layout = ParamLayout::of(cfg, lora);
  const int B = kB / micro;
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, kT), UnitSet::Training, false, 0, micro > 1);
  RamSegmentStore store(units);
  ThreadPool pool(2);
  Executor exec(pool, cfg, units, B, kT, ActivationPolicy::Recompute, OptimizerMode::Inline, Precision::Fp32,
                Backend::Cpu, micro, nullptr, BlockRows::whole(row_chunk));
  exec.attach(store);
  model_init_random(cfg, layout, store, 7);
  lora_fill(layout, store);
  const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(kB) * kT + 1, cfg.vocab_size, 5);
  const std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
  exec.forward_backward(tokens.data(), targets.data(), B, kT);
  exec.sync();
  std::vector<std::vector<float>> out;
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (!layout.trainable(s)) continue;
    SegmentChunksHold grads(store, s, SegmentKind::Grads, Access::Read);
    for (const TensorSlot& t : layout.segments()[s].tensors) out.emplace_back(grads.tensor(t), grads.tensor(t) + t.numel);
  }
  return out;
}

TEST(RowChunks, ChunkedPassGivesTheGradientsOfOneSequenceMicroBatches) {
  blas_set_threads(2);
  for (const int family : {0, 1, 2}) {  // GPT-2, Llama, Qwen3
    const bool llama = family > 0;
    for (const bool adapters : {false, true}) {
      const GptConfig cfg = chunk_config(llama, family == 2);
      SCOPED_TRACE(std::string(cfg.family()) + (adapters ? " lora" : ""));
      const LoraConfig lora = adapters ? every_linear(llama, 0.0) : LoraConfig{};
      const auto micro = batch_grads(cfg, lora, kB);  // 400 rows each: one chunk
      // 1200 rows: two chunks; and --row-chunk 256: five, every sequence split.
      for (const int row_chunk : {kRowChunk, 256}) {
        const auto chunked = batch_grads(cfg, lora, 1, row_chunk);
        ASSERT_EQ(chunked.size(), micro.size());
        ASSERT_FALSE(chunked.empty());
        for (std::size_t i = 0; i < chunked.size(); ++i) {
          double max_err = 0, max_ref = 0;
          for (std::size_t j = 0; j < chunked[i].size(); ++j) {
            max_err = std::max(max_err, std::abs(static_cast<double>(chunked[i][j]) - micro[i][j]));
            max_ref = std::max(max_ref, std::abs(static_cast<double>(micro[i][j])));
          }
          EXPECT_GT(max_ref, 0.0) << "tensor " << i;
          EXPECT_LE(max_err, 1e-7 + 1e-5 * max_ref)
              << "row chunk " << row_chunk << " tensor " << i << " max |ref| " << max_ref;
        }
      }
    }
  }
}

// The params hash after two AdamW steps of a B x T batch of random tokens (adapters filled, the
// dropout keyed by the step) under `policy`, in RAM (depth -1) or at the smallest budget with
// prefetch depth `depth`; backward_groups: the schedule's LayerBackward groups.
std::uint64_t two_steps_hash(const GptConfig& cfg, const LoraConfig& lora, int B, int T, ActivationPolicy policy,
                             int depth, int* backward_groups = nullptr, int row_chunk = kRowChunk) {
  SCOPED_TRACE(std::string(cfg.family()) + " " + (lora.on() ? "lora " : "") +
               activation_policy_name(policy) + " prefetch " + std::to_string(depth) + " row chunk " +
               std::to_string(row_chunk));
  const ParamLayout layout = ParamLayout::of(cfg, lora);
  const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(B) * T + 1, cfg.vocab_size, 3);
  const std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
  const std::size_t internals =
      policy == ActivationPolicy::Offload ? Executor::internals_unit_floats(cfg, B, T, layout) : 0;
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T), UnitSet::Training, false, internals);
  testing::TempDir tmp;
  std::unique_ptr<SegmentStore> store;  // outlives the executor
  ThreadPool pool(2);
  Executor exec(pool, cfg, units, B, T, policy, OptimizerMode::Inline, Precision::Fp32, Backend::Cpu, 1, nullptr,
                BlockRows::whole(row_chunk));
  if (backward_groups != nullptr) {
    *backward_groups = 0;
    for (int g = 0; g < exec.schedule().group_count(); ++g)
      *backward_groups += exec.schedule().group_work(g) == GroupWork::LayerBackward;
  }
  store = testing::store_in_ram_or_under(units, depth, exec.min_store_bytes(), tmp.path());
  model_init_random(cfg, layout, *store, 11);
  lora_fill(layout, *store);
  exec.attach(*store);
  for (int step = 0; step < 2; ++step) {
    exec.lora_dropout_step(3, step);
    exec.train_step(tokens.data(), targets.data(), B, T, AdamWHyper{1e-3, 0.9, 0.95, 1e-8, step + 1}, 0.1, 1.0);
  }
  exec.sync();
  return model_params_hash(layout, *store);
}

// Two optimizer steps of the kB x kT batch: the params hash of recompute in RAM, whatever the
// policy (keep: every row kept; offload: held internals), budget and prefetch depth.
TEST(RowChunks, EveryPolicyAndBudgetGivesTheBitsOfRam) {
  blas_set_threads(2);
  for (const int family : {0, 1, 2}) {  // GPT-2, Llama, Qwen3
    const bool llama = family > 0;
    for (const bool adapters : {false, true}) {
      const GptConfig cfg = chunk_config(llama, family == 2);
      const LoraConfig lora = adapters ? every_linear(llama, 0.1) : LoraConfig{};
      const std::uint64_t ram = two_steps_hash(cfg, lora, kB, kT, ActivationPolicy::Recompute, -1);
      EXPECT_EQ(two_steps_hash(cfg, lora, kB, kT, ActivationPolicy::Keep, -1), ram);
      EXPECT_EQ(two_steps_hash(cfg, lora, kB, kT, ActivationPolicy::Recompute, 1), ram);
      EXPECT_EQ(two_steps_hash(cfg, lora, kB, kT, ActivationPolicy::Offload, 2), ram);
    }
  }
}

// Another row chunk (train --row-chunk) is another partition of the same math, fixed for the
// run: 256 rows (five chunks of the 1200, every sequence split) gives other bits than 1024, and
// those bits under every policy, budget and prefetch depth; a chunk of at least B*T rows (one
// chunk) gives one set of bits whatever its size, another than 1024's two chunks.
TEST(RowChunks, AnotherRowChunkIsAnotherFixedPartition) {
  blas_set_threads(2);
  for (const bool llama : {false, true}) {
    for (const bool adapters : {false, true}) {
      const GptConfig cfg = chunk_config(llama);
      const LoraConfig lora = adapters ? every_linear(llama, 0.1) : LoraConfig{};
      const auto hash = [&](ActivationPolicy policy, int depth, int row_chunk) {
        return two_steps_hash(cfg, lora, kB, kT, policy, depth, nullptr, row_chunk);
      };
      const std::uint64_t default_ram = hash(ActivationPolicy::Recompute, -1, kRowChunk);
      const std::uint64_t ram = hash(ActivationPolicy::Recompute, -1, 256);
      EXPECT_NE(ram, default_ram);
      EXPECT_EQ(hash(ActivationPolicy::Keep, -1, 256), ram);
      EXPECT_EQ(hash(ActivationPolicy::Recompute, 1, 256), ram);
      EXPECT_EQ(hash(ActivationPolicy::Offload, 2, 256), ram);
      const std::uint64_t one_chunk = hash(ActivationPolicy::Recompute, -1, kB * kT);
      EXPECT_NE(one_chunk, default_ram);
      EXPECT_EQ(hash(ActivationPolicy::Recompute, 1, 4096), one_chunk);
      EXPECT_EQ(hash(ActivationPolicy::Keep, -1, 4096), one_chunk);
    }
  }
}

// lora_rows: rows r0.. of a pass see that pass's dropout mask and write its u rows.
TEST(RowChunks, AdapterRowsSeeThePassesMaskAndKeptRows) {
  ThreadPool pool(2);
  blas_set_threads(2);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  constexpr int M = 10, in = 12, out = 8, r = 3, r0 = 4;
  Rng rng(1);
  auto randoms = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = static_cast<float>(rng.normal());
    return v;
  };
  const std::vector<float> x = randoms(M * in), a = randoms(r * in), b = randoms(out * r);
  std::vector<float> u(M * r), xd(M * in), y(M * out, 0.0f), u_rows(M * r, 0.0f), y_rows(M * out, 0.0f);
  LoraBlock lora;
  lora.r = r;
  lora.scale = 0.5f;
  lora.dropout = 0.5f;
  lora.xd = xd.data();
  lora.t[0].a = a.data();
  lora.t[0].b = b.data();
  lora.t[0].drop_key = 0x1234;
  lora.t[0].u = u.data();
  lora_forward(*ops, lora, 0, y.data(), out, x.data(), in, M, in, out);  // the whole pass
  lora.t[0].u = u_rows.data();
  const LoraBlock rows = lora_rows(lora, 0, r0, in);
  lora_forward(*ops, rows, 0, y_rows.data() + r0 * out, out, x.data() + r0 * in, in, M - r0, in, out);
  for (int i = r0 * r; i < M * r; ++i) EXPECT_NEAR(u_rows[i], u[i], 1e-5f * (1 + std::abs(u[i]))) << "u " << i;
  for (int i = r0 * out; i < M * out; ++i) EXPECT_NEAR(y_rows[i], y[i], 1e-5f * (1 + std::abs(y[i]))) << "y " << i;
  for (int i = 0; i < r0 * r; ++i) EXPECT_EQ(u_rows[i], 0.0f) << "rows before r0 untouched";
  EXPECT_EQ(lora_rows(lora, 0, 0, in).t[0].drop_key, lora.t[0].drop_key);
}

// The one set of internals --activations recompute refills holds one row chunk of everything but
// qkv (Note [row chunks], Note [attention row ranges]): at 4096 rows it is smaller than a kept set
// by the rows of the attention output, res2 and fch and fch_gelu (GPT-2) or gate and up (Llama)
// past the chunk; and the workspace's attention-output gradient holds one chunk too.
TEST(RowChunks, TheRecomputedSetHoldsOneChunkOfTheRowWiseInternals) {
  ThreadPool pool(1);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  for (const bool llama : {false, true}) {
    GptConfig cfg = chunk_config(llama);
    cfg.n_ctx = 4096;
    const std::size_t width = llama ? static_cast<std::size_t>(cfg.mlp_width()) : 4u * cfg.n_embd;
    const std::size_t C = cfg.n_embd, Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim());
    for (const int chunk : {kRowChunk, 512, 2048}) {  // the default and --row-chunk's
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " row chunk " + std::to_string(chunk));
      const BlockRows rows = BlockRows::whole(chunk);
      const TransformerBlock kept(*ops, cfg, 1, 4096, 1, nullptr, false, false, true, rows);
      const TransformerBlock recomputed(*ops, cfg, 1, 4096, 1, nullptr, false, true, true, rows);
      EXPECT_GE(kept.size_bytes() - recomputed.size_bytes(), (4096 - chunk) * (2 * width + Q + C) * sizeof(float));
      // The workspace: dqkv keeps every row; the rest is one chunk of rows (tmp, the normed inputs'
      // gradient, the MLP's gradients, datty), the attention scratch and the carve's alignment.
      const std::size_t chunk_floats = chunk * (2 * C + (llama ? 2 * width : width) + Q);
      const std::size_t bound = (4096 * QKV + chunk_floats + ops->attention_scratch_floats(1, 4096, cfg.n_head,
                                                                                           cfg.kv_heads(), cfg.head_dim())) *
                                    sizeof(float) + 16 * 64;
      const std::size_t workspace = llama ? LlamaWorkspace(*ops, cfg, 1, 4096, false, true, rows).size_bytes()
                                          : Gpt2Workspace(*ops, cfg, 1, 4096, false, true, rows).size_bytes();
      EXPECT_LE(workspace, bound);
      EXPECT_GE(workspace, (4096 * QKV + chunk_floats) * sizeof(float));
    }
  }
}

// A block forward run as its two halves (Note [block halves] in model/param_layout.h), each given
// only the chunks that hold its tensors (the others empty, as a zeroth-order step's groups hold
// them), gives the whole block's bits: GPT-2 and Llama with adapters on every linear, two row
// chunks, layers wide enough (C = 512) to span several chunks, some holding both halves' tensors.
TEST(RowChunks, TheBlockHalvesGiveTheWholeBlocksBits) {
  ThreadPool pool(2);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  for (const int family : {0, 1, 2}) {  // GPT-2, Llama, Qwen3 (its q and k norms in the attention half)
    const bool llama = family > 0;
    GptConfig cfg = chunk_config(llama, family == 2);
    SCOPED_TRACE(cfg.family());
    cfg.n_embd = 512;
    cfg.n_head = 8;
    if (llama) {
      cfg.n_kv_head = 4;
      cfg.n_inner = 1376;
    }
    const ParamLayout layout = ParamLayout::of(cfg, every_linear(llama, 0.0));
    const int s = layout.layer_segment(0), a = layout.lora_segment(0);
    const SegmentLayout& seg = layout.segments()[s];
    ASSERT_GE(seg.chunk_count(), 3) << "the halves must hold different chunks";
    RamSegmentStore store(UnitTable(layout, Executor::activation_unit_floats(cfg, kB, kT)));
    model_init_random(cfg, layout, store, 7);
    lora_fill(layout, store);
    TransformerBlock block(*ops, cfg, kB, kT, 1, &layout, false, true, false);
    const std::size_t n = static_cast<std::size_t>(kB) * kT * cfg.n_embd;
    std::vector<float> x(n), whole(n), halves(n);
    Rng rng(3);
    for (float& v : x) v = static_cast<float>(rng.normal());
    const SegmentChunksHold params(store, s, SegmentKind::Params, Access::Read);
    const SegmentChunksHold adapters(store, a, SegmentKind::Params, Access::Read);
    const LoraChunks lora{&layout.segments()[a], adapters.chunks(), nullptr, false, 0};
    block.forward(*ops, seg, params.views(), x.data(), whole.data(), {0, nullptr}, kB, kT, &lora);
    for (const BlockPart part : {BlockPart::Attention, BlockPart::Mlp}) {
      auto holds_part = [&](int segment, int c) {
        const SegmentLayout& l = layout.segments()[segment];
        for (const TensorSlot& t : l.tensors) {
          const int i = static_cast<int>(&t - l.tensors.data());
          if (t.chunk != c) continue;
          if (segment == s && block_tensor_part(cfg, i) == part) return true;
          if (segment == a) {
            for (int k = 0; k < kLoraMaxTargets; ++k) {
              const int slot = layout.lora_slot(k);
              if (slot < 0 || (i != slot && i != slot + 1)) continue;
              const bool mlp = lora_modules(lora_family(cfg))[static_cast<std::size_t>(k)].rfind("mlp.", 0) == 0;
              if (mlp == (part == BlockPart::Mlp)) return true;
            }
          }
        }
        return false;
      };
      std::vector<TensorView> views(params.views(), params.views() + seg.chunk_count());
      for (int c = 0; c < seg.chunk_count(); ++c)
        if (!holds_part(s, c)) views[static_cast<std::size_t>(c)] = TensorView();
      std::vector<float*> chunks(adapters.chunks(), adapters.chunks() + layout.segments()[a].chunk_count());
      for (int c = 0; c < layout.segments()[a].chunk_count(); ++c)
        if (!holds_part(a, c)) chunks[static_cast<std::size_t>(c)] = nullptr;
      const LoraChunks half_lora{&layout.segments()[a], chunks.data(), nullptr, false, 0};
      block.forward(*ops, seg, views.data(), part == BlockPart::Attention ? x.data() : halves.data(), halves.data(),
                    {0, nullptr}, kB, kT, &half_lora, part);
    }
    EXPECT_EQ(std::memcmp(whole.data(), halves.data(), n * sizeof(float)), 0);
  }
}

// Forward passes only (zeroth-order training): the engine keeps none of the backward's gradient
// buffers (the workspace's dqkv, the attention output's, the normed inputs' and the MLP's
// gradients; the head's dlnf), so its smallest budget leaves them out.
TEST(RowChunks, TheForwardOnlyEngineHasNoBackwardBuffers) {
  ThreadPool pool(1);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  for (const bool llama : {false, true}) {
    GptConfig cfg = chunk_config(llama);
    cfg.n_ctx = 2048;
    const int B = 1, T = 2048;  // two row chunks
    const std::size_t C = cfg.n_embd, Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim());
    const std::size_t chunk = kRowChunk, I = llama ? cfg.mlp_width() : 4 * C;
    // GPT-2: dqkv, datty, dln, dfch (4C); Llama: dqkv, datty, dxn, dup (I).
    const std::size_t backward_floats = static_cast<std::size_t>(B) * T * QKV + chunk * (Q + C + I);
    const TransformerBlock train(*ops, cfg, B, T, 1, nullptr, false, true, true);
    const TransformerBlock zo(*ops, cfg, B, T, 1, nullptr, false, true, false);
    EXPECT_GE(train.size_bytes() - zo.size_bytes(), backward_floats * sizeof(float)) << (llama ? "llama" : "gpt2");
    const Gpt2HeadScratch head(*ops, cfg, B * T), zo_head(*ops, cfg, B * T, Precision::Fp32, false, false);
    EXPECT_GE(head.size_bytes() - zo_head.size_bytes(), static_cast<std::size_t>(B) * T * C * sizeof(float));
    EXPECT_EQ(zo_head.dlnf, nullptr);
  }
}

// Note [frozen MLP rows]: where the blocks' MLPs train nothing (LoRA on the attention only, or
// zo-sgd) they may run in sub-chunks of fewer rows than a chunk: the same bits for any sub-chunk
// (256, and 100, which splits both chunks unevenly), policy (offload's held internals keep every
// row, as keep's), budget and prefetch depth, at the default row chunk and others, in less memory
// (the recomputed set's and the workspace's MLP buffers hold one sub-chunk). The MLP must be wide
// enough for its products to stay off OpenBLAS's small-matrix path (mlp_sub_chunks_exact).
TEST(RowChunks, FrozenMlpSubChunksKeepTheBitsInLessMemory) {
  blas_set_threads(2);
  for (const bool llama : {false, true}) {
    GptConfig cfg = chunk_config(llama);  // one layer whose MLP products are above OpenBLAS's small ones
    cfg.n_layer = 1;
    cfg.n_head = 8;
    cfg.n_embd = llama ? 512 : 576;
    if (llama) cfg.n_inner = 2304;
    ASSERT_TRUE(mlp_sub_chunks_exact(cfg));
    ASSERT_FALSE(mlp_sub_chunks_exact(chunk_config(llama)));
    const LoraConfig lora = lora_config_make(llama ? LoraFamily::Llama : LoraFamily::Gpt2, 4, 8,
                                             llama ? "q_proj,v_proj,o_proj" : "c_attn,attn.c_proj", false, 0.1);
    const ParamLayout layout = ParamLayout::of(cfg, lora);
    ASSERT_TRUE(layout.mlp_frozen());
    ASSERT_FALSE(ParamLayout::of(cfg, every_linear(llama, 0.0)).mlp_frozen());
    const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(kB) * kT + 1, cfg.vocab_size, 3);
    const std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
    std::size_t fixed_full = 0, fixed_sub = 0;
    auto run = [&](const LoraConfig& adapters, OptimizerMode mode, ActivationPolicy policy, int rows, int depth,
                   int chunk = kRowChunk) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + activation_policy_name(policy) + " rows " +
                   std::to_string(rows) + " prefetch " + std::to_string(depth) + " chunk " + std::to_string(chunk));
      const ParamLayout l = ParamLayout::of(cfg, adapters);
      const bool zo = mode == OptimizerMode::ZerothOrder;
      const std::size_t internals =
          policy == ActivationPolicy::Offload ? Executor::internals_unit_floats(cfg, kB, kT, l) : 0;
      const UnitTable units(l, Executor::activation_unit_floats(cfg, kB, kT, zo),
                            zo ? UnitSet::ForwardOnly : UnitSet::Training, false, internals);
      testing::TempDir tmp;
      std::unique_ptr<SegmentStore> store;  // outlives the executor
      ThreadPool pool(2);
      Executor exec(pool, cfg, units, kB, kT, policy, mode, Precision::Fp32, Backend::Cpu, 1, nullptr,
                    BlockRows{chunk, rows});
      if (chunk == kRowChunk) (rows == kRowChunk ? fixed_full : fixed_sub) = exec.fixed_bytes();
      store = testing::store_in_ram_or_under(units, depth, exec.min_store_bytes(), tmp.path());
      model_init_random(cfg, l, *store, 11);
      if (adapters.on()) lora_fill(l, *store);
      exec.attach(*store);
      for (int step = 0; step < 2; ++step) {
        if (zo) {
          ZoHyper h;
          h.seed = 5;
          h.step = step;
          h.lr = 1e-3;
          exec.zo_step(tokens.data(), targets.data(), kB, kT, h);
        } else {
          exec.lora_dropout_step(7, step);
          exec.train_step(tokens.data(), targets.data(), kB, kT, AdamWHyper{1e-3, 0.9, 0.95, 1e-8, step + 1}, 0.1, 1.0);
        }
      }
      exec.sync();
      return model_params_hash(l, *store);
    };
    const OptimizerMode adamw = OptimizerMode::Inline;
    const std::uint64_t ram = run(lora, adamw, ActivationPolicy::Recompute, kRowChunk, -1);
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Recompute, kFrozenMlpRows, -1), ram);
    // The recomputed set's gate and up (fch; hmid and fch_gelu are in gate's and fch's rows) and the
    // workspace's dup (dfch).
    const std::size_t width = llama ? static_cast<std::size_t>(cfg.mlp_width()) : 4u * cfg.n_embd;
    EXPECT_GE(fixed_full - fixed_sub, (kRowChunk - kFrozenMlpRows) * width * (llama ? 3 : 2) * sizeof(float));
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Recompute, 100, -1), ram);
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Recompute, kFrozenMlpRows, 1), ram);
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Offload, kFrozenMlpRows, 2), ram);
    // Another --row-chunk: its sub-chunks keep its bits (512 rows in sub-chunks of 256; 200 rows,
    // below kFrozenMlpRows, in sub-chunks of 100).
    const std::uint64_t ram512 = run(lora, adamw, ActivationPolicy::Recompute, 512, -1, 512);
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Recompute, kFrozenMlpRows, 1, 512), ram512);
    EXPECT_EQ(run(lora, adamw, ActivationPolicy::Offload, 100, 2, 200),
              run(lora, adamw, ActivationPolicy::Recompute, 200, -1, 200));
    // zo-sgd on every weight: no backward, so no MLP trains through a sum over rows.
    const OptimizerMode zo = OptimizerMode::ZerothOrder;
    const std::uint64_t zo_ram = run(LoraConfig{}, zo, ActivationPolicy::Recompute, kRowChunk, -1);
    EXPECT_EQ(run(LoraConfig{}, zo, ActivationPolicy::Recompute, kFrozenMlpRows, 1), zo_ram);
  }
}

// Note [attention recompute first]: a frozen base's recomputing backward of one row chunk holds
// the attention half alone first, then the whole layer; the bits of the whole backward (keep and
// offload run it whole), in RAM and streamed, GPT-2 and Llama, adapters on every linear or on the
// attention only, with dropout.
TEST(RowChunks, TheAttentionRecomputeFirstGivesTheWholeBackwardsBits) {
  blas_set_threads(2);
  constexpr int B = 2, T = 256;  // one row chunk
  for (const int family : {0, 1, 2}) {  // GPT-2, Llama, Qwen3
    const bool llama = family > 0;
    for (const bool mlp_adapters : {false, true}) {
      SCOPED_TRACE(mlp_adapters ? "every linear" : "attention only");
      const GptConfig cfg = chunk_config(llama, family == 2);
      const LoraConfig lora = mlp_adapters ? every_linear(llama, 0.1)
                                           : lora_config_make(llama ? LoraFamily::Llama : LoraFamily::Gpt2, 4, 8,
                                                              llama ? "q_proj,v_proj" : "c_attn", false, 0.1);
      int split = 0, whole = 0;
      const std::uint64_t keep = two_steps_hash(cfg, lora, B, T, ActivationPolicy::Keep, -1, &whole);
      EXPECT_EQ(two_steps_hash(cfg, lora, B, T, ActivationPolicy::Recompute, -1, &split), keep);
      EXPECT_EQ(split, 2 * cfg.n_layer);
      EXPECT_EQ(whole, cfg.n_layer);
      EXPECT_EQ(two_steps_hash(cfg, lora, B, T, ActivationPolicy::Recompute, 1), keep);
      EXPECT_EQ(two_steps_hash(cfg, lora, B, T, ActivationPolicy::Offload, 2), keep);
    }
  }
}

// bf16 products round their operands into per-thread scratch that grows to the largest call's;
// the engine reserves it for a row chunk's (or a head chunk's) products, not for every row
// (Executor::fixed_bytes). So a 1200-row bf16 pass (two chunks) grows it no further than a
// 1024-row pass (one chunk): no product takes more rows than a chunk.
std::size_t bf16_scratch_after_pass(const GptConfig& cfg, int B, int T) {
  std::size_t held = 0;
  std::thread([&] {  // a thread of its own: fresh thread-local scratch
    const ParamLayout layout = ParamLayout::of(cfg);
    const UnitTable units(layout, Executor::activation_unit_floats(cfg, B, T), UnitSet::Training, false, 0, false);
    RamSegmentStore store(units);
    ThreadPool pool(2);
    Executor exec(pool, cfg, units, B, T, ActivationPolicy::Recompute, OptimizerMode::Inline, Precision::Bf16,
                  Backend::Cpu, 1);
    exec.attach(store);
    model_init_random(cfg, layout, store, 7);
    const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(B) * T + 1, cfg.vocab_size, 5);
    const std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
    exec.forward_backward(tokens.data(), targets.data(), B, T);
    exec.sync();
    held = bf16_scratch_bytes_held();
  }).join();
  return held;
}

TEST(RowChunks, Bf16ProductsTakeNoMoreRowsThanAChunk) {
  blas_set_threads(2);
  for (const bool llama : {false, true}) {
    GptConfig cfg = chunk_config(llama);
    cfg.vocab_size = 600;  // the head's products the widest: a head chunk's rows count too
    ASSERT_EQ(2 * cfg.n_ctx, kRowChunk);
    const std::size_t one_chunk = bf16_scratch_after_pass(cfg, 2, cfg.n_ctx);
    const std::size_t two_chunks = bf16_scratch_after_pass(cfg, kB, kT);
    EXPECT_GT(one_chunk, 0u) << "the products ran in bf16";
    EXPECT_LE(two_chunks, one_chunk) << (llama ? "llama" : "gpt2");
  }
}

}  // namespace
}  // namespace stratum
