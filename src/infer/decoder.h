// Incremental decoding with a KV cache for both families: each step runs B sequences' next Tn
// tokens (at their own positions) through every layer, appends their keys and values to the
// cache and returns the logits of each sequence's last token. Weights come from a SegmentStore,
// so under a memory budget they stream from the offload dir layer by layer, the store
// prefetching the next layers while one computes by the decode schedule below; a layer is
// applied to the whole batch before it is evicted, so B sequences share one read of the weights
// (the FlexGen idea).
// Note [decode schedule]: one step is layer.0 .. layer.L-1 (every chunk of the layer's params
// and the layer's KV cache), head, then the LM head's vocabulary blocks; it repeats every step. The token embedding's rows
// are read on demand at the start of a step from the vocabulary blocks holding the step's tokens
// (usually one or two), outside the schedule, so they are not prefetched but also never read
// whole (a tied head's blocks are often still resident from the previous step's head).
// Each layer is the family's one block forward (Note [one forward] in model/block_policy.h) with
// RowDotLinear (each output element a fixed-order dot product of its own row, Note [row dot
// products], which streams each weight once instead of packing it like sgemm) and
// CachedAttention (attention_cached against the KV cache), so logits do not depend on the batch,
// the chunking of a prompt or the budget. Does not own the store.
// Note [KV cache units]: layer l's KV cache (K then V, (max_batch, KV, max_ctx, hd) each, fp32)
// is the layer segment's activation unit of an inference UnitTable (UnitSet::Inference, act_floats =
// kv_unit_floats), used with Access::Update in the layer's schedule group. So the store treats it
// like the weights: in RAM it is allocated on first use; under a budget the tiered store keeps
// it, or writes it to the offload dir and reads it back, by the same farthest-next-use rule
// (the FlexGen cache offload), and the bits do not depend on where it was.
// Note [sliding KV cache]: a sliding layer (every layer of a Mistral or Phi-3 with a window,
// Gemma 2's and 3's sliding layers; Note [attention scores]) reads only the last W keys of a
// query (W = sliding_window), so its KV cache keeps sliding_rows = W + max(kMaxRows, max_batch) +
// kCacheShiftAlign positions per sequence (when that is below max_ctx) instead of max_ctx: each
// slot's rows hold the positions from base[slot], a multiple of kCacheShiftAlign, on. When a
// step's new positions would pass the last row, base moves up to the first key its first new row
// reads, rounded down to that multiple, and every sliding layer moves the rows it keeps to the
// front before appending (once every ~kMaxRows tokens of decoding: W rows per KV head). The
// attention kernels get positions relative to base (the rope the absolute ones): the same keys in
// the same key tiles as the whole cache, so the same bits (a test compares every logit with
// decoding against the whole cache). Gemma 3 4B (29 of 34 layers sliding, W 1024) at 32768
// positions: 1.6 GiB of fp32 KV cache a sequence instead of 8.5. A sequence may restart at
// position 0, or continue from a position whose window the rows still hold (resume_point).
// Note [bf16 weights]: a checkpoint stored in bf16 (GPT-2 or Llama) is kept in bf16 (an
// inference UnitTable with param_bf16; model_load_weights copies the bytes unconverted), so it
// takes half the RAM, half the budget and half the offload reads of its fp32 widening. Weights
// are widened to fp32 as they are used: matrices inside rowdot_nt_bf16's and rowdot_kn_bf16's
// loads, norm weights, biases and embedding rows (token and position) into fp32 scratch.
// Widening is exact, so every product and sum sees the same floats in the same order and the
// logits are bit-identical to decoding the widened fp32 copy (tests check it). generate
// --precision bf16 puts any model in such a store: model_load_weights rounds its fp32 (or fp16)
// weights to bf16, nearest-even, as PyTorch's .to(torch.bfloat16) does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "ops/ops.h"
#include "ops/ops_buffer.h"
#include "model/gpt2_block.h"
#include "model/gpt2_head.h"
#include "model/llama_block.h"
#include "model/transformer_block.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "store/segment_store.h"
#include "store/step_schedule.h"

namespace stratum {

class Decoder {
 public:
  // Rows one step computes at most (B * Tn); a longer prompt is fed in chunks.
  static constexpr int kMaxRows = 256;
  // Floats of each layer's KV cache unit (Note [KV cache units]): the store's UnitTable's
  // layer_act_floats.
  // sliding false: every layer's holds max_ctx positions (what tests compare the sliding cache with).
  static std::vector<std::size_t> kv_unit_floats(const GptConfig& config, int max_batch, int max_ctx,
                                                 bool sliding = true);
  // Positions layer l's KV cache holds per sequence: max_ctx, or a sliding layer's fewer (Note
  // [sliding KV cache]) unless sliding is false.
  static int cache_rows(const GptConfig& config, int l, int max_batch, int max_ctx, bool sliding = true);
  // RAM the decoder holds besides the store: the per-step buffers.
  static std::size_t fixed_bytes_for(const Ops& ops, const GptConfig& config, int max_batch, int max_ctx);
  // Smallest store budget a step can run with: the most the decode schedule holds at once
  // (schedule_min_bytes: a layer's parameters with its KV cache, or a vocabulary block of the
  // head), or the embedding's holds outside it if larger.
  static std::size_t min_store_bytes(const UnitTable& units);

  // ops: the backend to decode on (null: the CPU's, on `pool`); off the host the store must hand out
  // that backend's memory (DeviceSegmentStore) and step() takes and returns host arrays as before.
  // sliding_cache: as kv_unit_floats' sliding, which made the store's units.
  Decoder(ThreadPool& pool, const GptConfig& config, SegmentStore& store, int max_batch, int max_ctx,
          std::shared_ptr<const Ops> ops = nullptr, bool sliding_cache = true);
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
  // The position a sequence in `slot` whose cache holds positions 0 .. past-1 can continue from
  // (Note [sliding KV cache]): past where its sliding layers' rows still hold the window of
  // position past, else 0 (feed it again from the start).
  int resume_point(int slot, int past) const;
  // Records each layer's and the head's compute as spans into `trace` (borrowed; null = off).
  void trace_set(TraceRecorder* trace) { trace_ = trace; }

 private:
  // tokens/past: host arrays; dev_tokens/dev_past: the same where the ops read them.
  void embed(const std::int32_t* tokens, const std::int32_t* dev_tokens, int B, int Tn, const int* past);
  // cache_past: each sequence's first new row in a sliding layer's cache (Note [sliding KV cache]).
  void layer(int l, int B, int Tn, const int* past, const int* dev_past, const int* slot, const int* cache_past);
  // Note [sliding KV cache]: a sliding layer's kept rows of each sequence moved to the front.
  void cache_shift(float* cache, int B, const int* past, const int* slot) const;
  // A Llama layer's tensors in a params unit's chunks; with bf16 params (Note [bf16 weights]) the
  // matrices stay bf16 and the two norm weights are widened into b_.widened.
  LlamaBlockTensors llama_tensors(const SegmentLayout& seg, const SegmentChunksHold& params);
  // A GPT-2 layer's likewise: the four matrices stay bf16, its norms and biases are widened into
  // b_.widened.
  Gpt2BlockTensors gpt2_tensors(const SegmentLayout& seg, const SegmentChunksHold& params);
  // n weights from element `at` of a params unit's buffer as fp32: in place, or (bf16) widened
  // into `into` (n floats).
  const float* weights_f32(const TensorView& unit, std::size_t at, int n, float* into) const;
  void head(int B, int Tn, float* logits);
  struct Buffers {
    float* x;        // (rows, C) the residual stream (each layer's input and output)
    float* q;        // (rows, H*hd) contiguous queries for attention_cached
    float* tmp;      // (rows, C) the block forward's scratch
    float* last;     // (max_batch, C) each sequence's last row
    float* scratch;  // attention_cached scratch
    float* widened;  // a block's (or the head's) fp32 vectors widened from bf16 (Note [bf16 weights]):
                     // Llama's two norm weights (2 C), GPT-2's norms and biases (13 C)
  };
  // The buffer's slices, written through b's fields; fixed_bytes_for sizes the same list.
  static CarveSlices slices(const Ops& ops, Buffers& b, const GptConfig& config, int max_batch, int max_ctx);

  std::shared_ptr<const Ops> ops_;  // the kernels (the CPU's on the pool the decoder was given, or the caller's)
  GptConfig cfg_;
  SegmentStore& store_;
  const ParamLayout& layout_;
  int max_batch_, max_ctx_;
  // Note [sliding KV cache]: the window W (0: no layer's cache slides), a sliding layer's cache
  // rows (fewer than max_ctx), each slot's first cached position in them, and this step's moves
  // of it (per sequence of the step).
  int window_ = 0;
  int sliding_rows_ = 0;
  std::vector<int> base_;
  std::vector<int> shift_;
  bool bf16_;                 // the store's params are bf16 (Note [bf16 weights])
  Buffers b_{};           // before buffer_, whose initializer writes it
  OpsBuffer buffer_;
  Gpt2HeadScratch head_scratch_;
  // The block forward's internals at up to rows_for(max_batch) rows (no attention probabilities).
  std::unique_ptr<Gpt2Activations> gpt2_acts_;
  std::unique_ptr<LlamaActivations> llama_acts_;
  std::unique_ptr<LlamaRopes> ropes_;
  OpsBuffer lora_u_;  // (rows, r): an adapter's x A^T (generate --adapter), else empty
  // Off the host: the step's tokens, past and (slot-ordered) positions in the ops' memory, and
  // the logits before their download; empty on the CPU.
  OpsBuffer dev_ints_;
  OpsBuffer dev_logits_;
  StepSchedule schedule_;
  std::vector<int> group_layer_, group_head_vocab_;
  int group_head_ = 0;
  TraceRecorder* trace_ = nullptr;
};

}  // namespace stratum
