// Incremental decoding with a KV cache for both families: each step runs B sequences' next Tn
// tokens (at their own positions) through every layer, appends their keys and values to the
// cache and returns the logits of each sequence's last token. Weights come from a SegmentStore,
// so under a memory budget they stream from the offload dir layer by layer, the store
// prefetching the next layers while one computes by the decode schedule below; a layer is
// applied to the whole batch before it is evicted, so B sequences share one read of the weights
// (the FlexGen idea).
// Note [decode schedule]: one step is layer.0 .. layer.L-1 (every chunk of the layer's params),
// head, then the LM head's vocabulary blocks; it repeats every step. The token embedding's rows
// are read on demand at the start of a step from the vocabulary blocks holding the step's tokens
// (usually one or two), outside the schedule, so they are not prefetched but also never read
// whole (a tied head's blocks are often still resident from the previous step's head).
// Every output row is computed with the same kernels and order as the training forward
// (attention_cached is bit-identical to attention_forward), so logits do not depend on the
// batch, the chunking of a prompt or the budget. Does not own the store; the KV cache lives in
// RAM (fixed_bytes) and does not spill.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "kernels/cpu/rope.h"
#include "model/gpt2_head.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"
#include "store/step_schedule.h"

namespace stratum {

class Decoder {
 public:
  // Rows one step computes at most (B * Tn); a longer prompt is fed in chunks.
  static constexpr int kMaxRows = 256;
  // RAM the decoder holds besides the store: KV cache (2 * L * B * KV * ctx * hd floats) and
  // the per-step buffers.
  static std::size_t fixed_bytes_for(const GptConfig& config, int max_batch, int max_ctx);
  // Smallest store budget a step can run with: the largest layer's parameters plus one
  // vocabulary block.
  static std::size_t min_store_bytes(const UnitTable& units);

  Decoder(ThreadPool& pool, const GptConfig& config, SegmentStore& store, int max_batch, int max_ctx);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int max_batch() const { return max_batch_; }
  int max_ctx() const { return max_ctx_; }
  // Most tokens per sequence one step takes for a batch of B.
  int max_step_tokens(int B) const { return std::max(1, std::max(kMaxRows, max_batch_) / B); }

  // tokens (B, Tn) row-major: row b's tokens at positions past[b] .. past[b]+Tn-1 of the sequence
  // in cache slot slot[b] (slot null = b; the slot's cache holds 0 .. past[b]-1). logits (B, V):
  // each row's last token. B <= max_batch, distinct slots < max_batch, Tn <= max_step_tokens(B),
  // past[b] + Tn <= max_ctx.
  void step(const std::int32_t* tokens, int B, int Tn, const int* past, float* logits, const int* slot = nullptr);

 private:
  void embed(const std::int32_t* tokens, int B, int Tn, const int* past);
  void layer(int l, int B, int Tn, const int* past, const int* slot);
  void head(int B, int Tn, float* logits);
  float* kcache(int l) { return cache_.as_f32() + static_cast<std::size_t>(2 * l) * cache_floats_; }
  float* vcache(int l) { return cache_.as_f32() + static_cast<std::size_t>(2 * l + 1) * cache_floats_; }

  ThreadPool& pool_;
  GptConfig cfg_;
  SegmentStore& store_;
  const ParamLayout& layout_;
  int max_batch_, max_ctx_;
  std::size_t cache_floats_;  // one layer's K (or V): (max_batch, KV, max_ctx, hd)
  AlignedBuffer cache_;       // per layer: K then V, fp32, RAM
  AlignedBuffer buffer_;
  float* x_;       // (rows, C) the residual stream
  float* xn_;      // (rows, C) normed
  float* mean_;    // (rows) LayerNorm mean (GPT-2)
  float* rstd_;    // (rows)
  float* qkv_;     // (rows, H*hd + 2*KV*hd)
  float* q_;       // (rows, H*hd) contiguous queries for attention_cached
  float* atty_;    // (rows, H*hd)
  float* tmp_;     // (rows, C)
  float* mlp_a_;   // (rows, I) GPT-2 fc / Llama gate
  float* mlp_b_;   // (rows, I) GPT-2 gelu / Llama up
  float* mlp_c_;   // (rows, I) Llama silu(gate) * up
  float* last_;    // (max_batch, C) each sequence's last row
  float* scratch_; // attention_cached scratch
  Gpt2HeadScratch head_scratch_;
  std::unique_ptr<RopeTable> rope_;
  StepSchedule schedule_;
  std::vector<int> group_layer_, group_head_vocab_;
  int group_head_ = 0;
};

}  // namespace stratum
