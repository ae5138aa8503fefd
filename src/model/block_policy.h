// The two things a block forward is parameterised by (Note [one forward]): how a linear layer is
// computed (Linear) and how attention is computed (Attention). One block forward per family
// serves training, the backward's recompute and decoding; only these differ:
//   training:  GemmLinear  + CausalAttention  (many rows; keeps what the backward needs)
//   decoding:  RowDotLinear + CachedAttention (few rows; each output its own fixed-order dot
//              product, so a sequence's bits do not depend on the batch; keys and values
//              appended to a KV cache)
// This is also where LoRA adapters and bf16 GEMMs plug in: a Linear that adds x A^T B^T, or one
// that multiplies bf16 weights. Does not own weights or buffers.
// Note [one forward]: the block forwards (model/gpt2_block.h, model/llama_block.h) are the only
// place a block's computation is written; the executor, its recompute and the decoder all call
// them, with the same ops in the same order, so the decoder's residual stream after a layer has
// the bits a full forward would compute with row dot products.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/tensor_view.h"
#include "model/model_config.h"
#include "ops/ops.h"

namespace stratum {

class Linear {
 public:
  virtual ~Linear() = default;
  // y (M,N) = x (M,K) @ w (K,N) + bias (N, null = none): the Conv1D layout of GPT-2, fp32 or
  // (where the policy supports it) bf16.
  virtual void kn(const Ops& ops, float* y, const float* x, const TensorView& w, const float* bias, int M, int K,
                  int N) const = 0;
  // y (M,N), row stride ldy, = x (M,K), row stride ldx, @ w^T for w (N,K) (nn.Linear, Llama),
  // fp32 or (where the policy supports it) bf16.
  virtual void nt(const Ops& ops, float* y, int ldy, const float* x, int ldx, const TensorView& w, int M, int N,
                  int K) const = 0;
};

// Note [row chunks]: a block runs over fixed chunks of R rows of the B*T rows, in order:
// [0, R), [R, 2R), .... The forward first computes every chunk's q, k and v (norm, projections;
// Llama then rotates every row), because a row attends to the keys of every row before it in its
// sequence; then, chunk by chunk, the attention of the chunk's query rows (Note [attention row
// ranges] in kernels/cpu/attention.h), the output projection and residual add, and the MLP half
// (norm, up projections, activation, down projection, residual add). The backward goes chunk by
// chunk in the same order through the MLP half, the output projection and the attention's rows
// (each chunk adds to the dk and dv of the rows before it), then through every chunk's q, k and v
// projections and norm. Only qkv and its gradient keep every row. The workspace's tmp (the
// normed inputs, the projections before the residual add), the normed inputs' gradient, the
// attention output's gradient and the MLP's gradients hold one chunk, and the gradient at res2 is
// built in dx's rows. The one set of internals --activations recompute refills
// (TransformerBlock with recompute) holds one chunk of the attention output, res2 and the MLP's
// widest buffers (GPT-2's fch, fch_gelu; Llama's gate, up; hmid is the workspace's): the
// backward recomputes every row's qkv first, then each chunk's attention rows and MLP internals
// just before that chunk's backward, without the down projection whose output the backward
// never reads (its adapter's u is recomputed alone, lora_forward_u). Kept and held internals
// (keep, offload) and the decoder's keep every row, at the chunk's offset. Weight, bias and norm
// gradients are summed chunk by chunk in that order (the first chunk overwrites). The chunks are
// a function of B*T alone, so every budget, policy and prefetch depth gets the same bits; at B*T
// <= R there is one chunk and the bits are those of an unchunked block. Above R the weight
// gradients' sums are split at the chunk boundaries (the same math, other roundings), and so are
// a grouped-query kv head's dk/dv sums where a chunk boundary splits a sequence.
// R is a run's choice, fixed for the run like B and T (train --row-chunk, recorded in its
// checkpoints; by default kRowChunk on the CPU and kRowChunkDevice on a GPU; the decoder uses
// kRowChunk): a larger R multiplies more rows at once in more workspace memory (the GPU's products
// fill its cores better, bench/row_chunk_gemm), a smaller one needs less. Another R is another
// partition of the same math: other roundings wherever B*T exceeds the smaller of the two, the
// same bits where it exceeds neither.
// Note [device row chunk]: on an H200 GPT-2 small's B4 T1024 step takes 122.4 ms in one chunk of
// 4096 rows against 134.9 in four of 1024 (--activations keep; 149.5 against 164.4 recomputing):
// the linear layers' products run at 37-45 TFLOP/s instead of 26-36 (bench/row_chunk_gemm); on
// the CPU the chunk makes no difference to speed. The default is one per backend, not per budget,
// so every --gpu-mem-budget keeps the whole state's bits; a budget that needs a smaller minimum
// takes --row-chunk 1024 (GPT-2 small at --gpu-mem-budget 1000M: 217.5 against 211.7 ms).
inline constexpr int kRowChunk = 1024;
inline constexpr int kRowChunkDevice = 4096;
inline constexpr int kMaxRowChunk = 1 << 20;  // train --row-chunk's bound (the --seq bound)
// A block's row partition: chunks of `chunk` rows (Note [row chunks]), the MLP half of each in
// sub-chunks of `mlp` rows (Note [frozen MLP rows]; mlp == chunk unless the MLP trains nothing).
struct BlockRows {
  int chunk = kRowChunk;
  int mlp = kRowChunk;
  static BlockRows whole(int chunk) { return {chunk, chunk}; }  // no MLP sub-chunks
  bool operator==(const BlockRows&) const = default;
};
// f(r0, n) for each chunk [r0, r0 + n) of `rows` rows, in order: the one partition every block
// forward and backward uses (Note [row chunks]).
template <class F>
void for_each_row_chunk(int rows, int chunk, F&& f) {
  for (int r0 = 0; r0 < rows; r0 += chunk) f(r0, std::min(chunk, rows - r0));
}
// Rows of one chunk buffer for passes of up to max_rows rows in chunks of `chunk` rows.
inline int row_chunk_rows(std::size_t max_rows, int chunk) {
  return max_rows < static_cast<std::size_t>(chunk) ? static_cast<int>(max_rows) : chunk;
}
// Note [frozen MLP rows]: where a block's MLP half gets no gradient in a run (ParamLayout::
// mlp_frozen: LoRA with no adapter on the MLP, or no backward at all), nothing sums over its
// rows: every op of the half, forward and backward (norm, products, activation, the input's
// gradient), is row by row. A product's element is then the same dot product over K for any
// number of rows, provided the GEMM never takes its small-matrix path (OpenBLAS's sums in another
// order, for at most 10^6 multiply-adds): so only MLPs whose products are above that for one row
// (mlp_sub_chunks_exact: C x I > 2^20), in fp32 (oneDNN's bf16 products may split K by shape).
// Such a half may run each row chunk in sub-chunks of mlp_rows rows (Executor, TransformerBlock;
// the plan takes the largest of R, R/2, ... 256 whose minimum fits the budget, plan_mlp_rows), in
// order, its widest buffers (GPT-2's fch, fch_gelu, dfch; Llama's gate, up, dgate, dup, with
// hmid) holding one sub-chunk: at B*T = 1024 on the ~1.1B Llama 22 MiB at 256 rows instead of
// 88 MiB. Same bits (RowChunks.FrozenMlpSubChunksKeepTheBitsInLessMemory); the weights'
// widening and packing is repeated per sub-chunk, which costs time (docs/benchmarks.md), so in
// RAM and where a budget allows the sub-chunk is the chunk.
inline constexpr int kFrozenMlpRows = 256;
inline bool mlp_sub_chunks_exact(const GptConfig& cfg) {
  return static_cast<std::size_t>(cfg.n_embd) * static_cast<std::size_t>(cfg.mlp_width()) > (std::size_t{1} << 20);
}
// f(q0, m) for each sub-chunk [q0, q0 + m) of `step` rows of the row chunk [r0, r0 + n).
template <class F>
void for_each_sub_chunk(int r0, int n, int step, F&& f) {
  for (int q0 = r0; q0 < r0 + n; q0 += step) f(q0, std::min(step, r0 + n - q0));
}

// Note [frozen bf16 base]: a LoRA run over a base stored in bf16 keeps the frozen layers in bf16
// in the training store too (UnitTable with param_bf16: half the RAM, budget and offload reads of
// the fp32 widening). The GEMMs widen each bf16 weight matrix into a scratch of the largest one
// just before the product that reads it (weight_f32, Ops::bf16_widen), and the block tensors'
// norm weights and biases into a small scratch (llama_block_tensors / gpt2_block_tensors from
// typed views), so every product sees the floats an fp32 store of the widened checkpoint would
// hold: same bits, tests compare the params hash (which widens too). Where a backend multiplies
// bf16 itself (--precision bf16 with oneDNN) sgemm_w hands it the bf16 weight as it is. Embeddings and the head
// stay fp32 in a training store. Gradients, moments and adapters are fp32 as always.

// A block's norm weights and biases as fp32: in place, or (bf16) widened into consecutive slices
// of the scratch it was made with (enough floats for every vector asked for). With a norm offset
// (Gemma's 1, Note [gemma] in model/model_config.h) every vector asked for is a norm weight w,
// given as offset + w in the scratch (fp32 or bf16): the scratch's first `offset_floats` floats
// (the longest vector) hold the offset, then the vectors follow.
class WidenedVectors {
 public:
  WidenedVectors(const Ops& ops, float* scratch, float offset = 0.0f, std::size_t offset_floats = 0);
  float* operator()(const TensorView& v);

 private:
  const Ops& ops_;
  float* next_;
  const float* offsets_ = nullptr;  // offset_floats copies of the offset; null without one
  std::size_t offset_floats_ = 0;
};
// Note [gemma]: offset + w (n floats) computed in scratch (2n floats: the offset n times, then the
// sum), as transformers' (1.0 + weight.float()), by WidenedVectors; w itself without an offset.
const float* norm_weight_offset(const Ops& ops, const float* w, std::size_t n, float offset, float* scratch);

// w's elements as fp32: w's own (fp32), or (bf16) widened into scratch (at least w's elements).
const float* weight_f32(const Ops& ops, const TensorView& w, float* scratch);
// Note [widened in panels]: a bf16 weight reaches a widening backend (Ops::sgemm_b16_widens) in
// panels of output columns, each widened into the same scratch of at most kWidenPanelFloats
// floats just before its product: C's columns [n0, n1) = alpha op(A) op(w)[:, n0:n1] + beta C's.
// Each of C's elements is then the same dot product over K, in the same order, as in one product
// over every column: the GEMM blocks K the same way for any N, and a panel (as few as fit, of
// equal widths, so each over half the scratch: more than 10^6 multiply-adds a row) never reaches
// OpenBLAS's small-matrix kernels, which sum in another order. MatmulBf16.PanelsGiveTheBitsOfOneWidening
// checks it at the ~1.1B Llama's shapes. A 5632 x 2048 MLP matrix needs 8 MiB of scratch instead
// of 44 MiB; GPT-2's Conv1D products (GemmLinear::kn, bias first) still widen a whole matrix.
inline constexpr std::size_t kWidenPanelFloats = std::size_t{1} << 21;
// Floats of widening scratch for bf16 matrices of up to `largest` elements.
inline std::size_t widen_scratch_floats(std::size_t largest) { return std::min(largest, kWidenPanelFloats); }

// C = alpha op(A) op(w) + beta C for a weight w, fp32 (Ops::sgemm) or bf16 (Ops::sgemm_b16, which
// may widen it into scratch, scratch_floats floats, in panels: Note [widened in panels]): the same
// bits either way.
void sgemm_w(const Ops& ops, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
             const TensorView& w, int ldw, float beta, float* C, int ldc, float* scratch, std::size_t scratch_floats);

// GEMM (sgemm / matmul_forward): training and recompute. fp32 weights, or bf16 ones widened
// into widen_scratch first (Note [frozen bf16 base]): nt() in panels (Note [widened in panels]),
// kn() (GPT-2's Conv1D, bias first) the whole matrix.
class GemmLinear final : public Linear {
 public:
  explicit GemmLinear(float* widen_scratch = nullptr, std::size_t widen_floats = 0)
      : widen_(widen_scratch), widen_floats_(widen_floats) {}
  void kn(const Ops& ops, float* y, const float* x, const TensorView& w, const float* bias, int M, int K,
          int N) const override;
  void nt(const Ops& ops, float* y, int ldy, const float* x, int ldx, const TensorView& w, int M, int N,
          int K) const override;

 private:
  float* widen_;
  std::size_t widen_floats_;  // nt(): the scratch's floats (Note [widened in panels]); kn() widens whole
};

// Row dot products (Note [row dot products] in kernels/cpu/rowdot.h): decoding. fp32 or bf16.
class RowDotLinear final : public Linear {
 public:
  void kn(const Ops& ops, float* y, const float* x, const TensorView& w, const float* bias, int M, int K,
          int N) const override;
  void nt(const Ops& ops, float* y, int ldy, const float* x, int ldx, const TensorView& w, int M, int N,
          int K) const override;
};

class Attention {
 public:
  virtual ~Attention() = default;
  // Position of each sequence's first row (B entries; null = every sequence starts at 0): the
  // rotary embedding rotates row (b, t) by position positions[b] + t.
  virtual const int* positions() const = 0;
  // atty (n, H*hd) = causal attention of query rows [r0, r0 + n) of the (rotated) qkv (B*T, H*hd +
  // 2*KV*hd). stats: the (B,H,T,2) softmax row statistics the backward needs (CausalAttention
  // only); scratch: the backend's attention scratch; scores: a window, soft-capping (Note
  // [attention scores] in ops/attention_rows.h).
  virtual void attend(const Ops& ops, float* atty, float* stats, float* scratch, const float* qkv, int B, int T, int H,
                      int KV, int hd, int r0, int n, AttentionScores scores) const = 0;
  // Whether attend takes the block's row chunks in turn (Note [attention row ranges] in
  // kernels/cpu/attention.h), or the whole pass in one call (r0 0, n B*T).
  virtual bool by_row_chunks() const = 0;
};

// Every row attends to rows 0..itself of its own sequence; positions start at 0.
class CausalAttention final : public Attention {
 public:
  const int* positions() const override { return nullptr; }
  void attend(const Ops& ops, float* atty, float* stats, float* scratch, const float* qkv, int B, int T, int H, int KV,
              int hd, int r0, int n, AttentionScores scores) const override;
  bool by_row_chunks() const override { return true; }
};

// Decoding against a KV cache (Note [KV cache units] in infer/decoder.h): row (b, t) is at
// position past[b] + t of the sequence in cache slot slot[b]; its key and value are appended to
// the cache, then it attends to the slot's positions 0..past[b] + t. kcache and vcache are
// (slots, KV, max_ctx, hd); q is (B*T, H*hd) scratch for the contiguous queries.
class CachedAttention final : public Attention {
 public:
  // kcache, vcache: (slots, KV, cache_rows, hd). past: each sequence's position (the rope's);
  // cache_past: the cache row it goes to, past less the position of the slot's first row (Note
  // [sliding KV cache] in infer/decoder.h; null: past). past, cache_past, slot: host arrays;
  // ops_cache_past: cache_past where the ops read it (the same pointer on the CPU, a device copy on
  // a GPU; Note [ops memory]), and ops_past likewise.
  CachedAttention(float* kcache, float* vcache, float* q, int cache_rows, const int* past, const int* ops_past,
                  const int* slot, const int* cache_past = nullptr, const int* ops_cache_past = nullptr)
      : kcache_(kcache),
        vcache_(vcache),
        q_(q),
        max_ctx_(cache_rows),
        ops_past_(ops_past),
        cache_past_(cache_past != nullptr ? cache_past : past),
        ops_cache_past_(ops_cache_past != nullptr ? ops_cache_past : ops_past),
        slot_(slot) {}
  const int* positions() const override { return ops_past_; }
  // Appends the pass's keys and values to the cache before any query reads it: the whole pass at once.
  void attend(const Ops& ops, float* atty, float* stats, float* scratch, const float* qkv, int B, int T, int H, int KV,
              int hd, int r0, int n, AttentionScores scores) const override;
  bool by_row_chunks() const override { return false; }

 private:
  float* kcache_;
  float* vcache_;
  float* q_;
  int max_ctx_;  // cache rows per (slot, KV head)
  const int* ops_past_;
  const int* cache_past_;
  const int* ops_cache_past_;
  const int* slot_;
};

}  // namespace stratum
