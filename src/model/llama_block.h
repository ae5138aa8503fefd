// One Llama transformer block, forward and backward (with recompute of the block's internals from
// its input): x + o_proj(attention(rope(q,k), v)) over RMSNorm'd input, then + down(silu(gate) *
// up) over RMSNorm'd residual; grouped-query attention (query head h reads kv head h/(H/KV)).
// Weights are nn.Linear (out, in). Operates on borrowed pointers into segments; does not know
// where segments live. The output side (final RMSNorm + LM head) is model/gpt2_head.h, which
// handles both families.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/aligned_buffer.h"
#include "ops/ops.h"
#include "ops/ops_buffer.h"
#include "model/block_policy.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace stratum {

// One Llama block segment's tensors (params or grads: same layout). The seven matrices are typed
// views: fp32, or bf16 params kept as stored (Note [bf16 weights] in infer/decoder.h, Note [frozen
// bf16 base] in model/block_policy.h), read through Linear::nt and, in the backward, weight_f32.
// The norm weights are always fp32 (a bf16 model's are widened by its reader).
struct LlamaBlockTensors {
  float* attn_norm_w;  // (C)
  TensorView q_w;      // (H*hd, C)
  TensorView k_w;      // (KV*hd, C)
  TensorView v_w;      // (KV*hd, C)
  TensorView o_w;      // (C, H*hd)
  float* mlp_norm_w;   // (C)
  TensorView gate_w;   // (I, C)
  TensorView up_w;     // (I, C)
  TensorView down_w;   // (C, I)
  // Qwen2 (GptConfig::qkv_bias): the q, k and v projections' biases, fp32 (a bf16 model's widened
  // like the norm weights); null for Llama.
  float* q_b = nullptr;  // (H*hd)
  float* k_b = nullptr;  // (KV*hd)
  float* v_b = nullptr;  // (KV*hd)
  // Qwen3 (GptConfig::qk_norm, Note [qk norm]): q_norm and k_norm weights, fp32 (widened likewise);
  // null for the others.
  float* q_norm_w = nullptr;  // (hd)
  float* k_norm_w = nullptr;  // (hd)
  // Gemma 3 (GptConfig::post_norms, Note [post norms]): the norms of the attention's and the
  // MLP's outputs, fp32 (as 1 + w, Note [gemma]); null for the others.
  float* post_attn_norm_w = nullptr;  // (C)
  float* post_ff_norm_w = nullptr;    // (C)
};
// Note [post norms]: Gemma 3 (Note [gemma3] in model/model_config.h) RMSNorms the attention's
// output, o(atty) with its adapter, before res2 = x + it, and the MLP's, down(hmid) with its
// adapter, before out = res2 + it. The forward norms them in place in tmp, keeping each row's
// rstd (rstd_pa, rstd_pf); the backward recomputes the output (one more o and down product a
// chunk) into the workspace's `post` rows, and its rstd again (the same kernel on the same
// operands: the same bits), and turns d res2 (d out) into the gradient of the normed output with
// the norm's backward before the projection's. So nothing (B,T,C)-sized is kept for them, and the
// backward needs hmid even where the MLP trains nothing: such a block keeps its dgate rows (no
// gate_holds_hmid).
// Note [qk norm]: Qwen3 (model_type "qwen3") RMSNorms each query and key head before the rotary
// embedding: q = rope(q_norm(q_proj(xn1))) per head of hd, with one (hd) weight for every query
// head and one for every key head (transformers' Qwen3Attention; LoRA's adapters add to q_proj
// and k_proj before the norm, as PEFT's wrap of the Linear does). The forward norms qkv's q and k
// in place (Ops::rmsnorm_heads_forward, rstd kept per row and head in rstd_q and rstd_k), so
// qkv's raw projections are gone when the backward needs them: its attention loop recomputes
// each chunk's raw q and k (xn1 and the two projections with their adapters; not v) into qkv's
// rows, which the attention backward has finished reading, and turns d q and d k (after the
// rope's backward) into the projections' gradients in place (Ops::rmsnorm_heads_backward). The
// same kernels on the same rows and chunk shapes as the forward, so the same bits; about 6% more
// multiply-adds in a Qwen3-0.6B layer's backward, and no (B,T,H*hd + KV*hd) set of raw q and k kept
// per layer. CUDA has no per-head norm kernel yet: Qwen3 is refused on --backend cuda.
// Floats of the scratch a bf16 block's vectors (norm weights, Qwen2's biases, Qwen3's q and k
// norms) are widened into, or a Gemma block's norm weights given as 1 + w (Note [gemma] in
// model/model_config.h; fp32 too), with the offsets before them (llama_offset_floats).
std::size_t llama_vector_floats(const GptConfig& config);
std::size_t llama_offset_floats(const GptConfig& config);
// Note [biases by products]: a Qwen2 bias is added to the n rows of y (row stride ldy) as the
// product of a column of n ones and the bias row (y = 1 y + ones (n,1) bias (1,N)), and its
// gradient is the product of that column and dy (db (+)= ones^T dy): the seam's sgemm on any
// backend, each element of db a sum over the rows in the GEMM's fixed order. In fp32 each
// element of y takes one multiply by 1 and one add: a plain add's bits. Under the CPU's
// --precision bf16 the product's operands are rounded like every product's, so the add takes the
// bias rounded to bf16 and the gradient sums dy rounded to bf16 (in fp32), as PyTorch's autocast
// does (its linear casts the bias to bf16 too), where GPT-2's Conv1D biases stay fp32.
// `ones` is the activations' (a decoder's own, or its training workspace's: at least one chunk
// of rows).
void llama_bias_add(const Ops& ops, float* y, int ldy, const float* bias, const float* ones, int n, int N);
void llama_bias_grad(const Ops& ops, float* db, const float* dy, int ldy, const float* ones, int n, int N, bool acc);
// chunks[c] is a typed view of chunk c (Note [segment chunks]): fp32 (params or grads), or bf16
// params (Note [frozen bf16 base] in model/block_policy.h, Note [bf16 weights] in
// infer/decoder.h), whose seven matrices stay bf16 views and whose two norm weights (and Qwen2's
// biases) are widened into `widened` (llama_vector_floats; may be null for fp32 chunks).
// offset_norms: the params' model, whose norm weights the kernels take as norm_offset() + w
// (Gemma's, Note [gemma]; `widened` then holds them, fp32 too); null for gradients.
LlamaBlockTensors llama_block_tensors(const Ops& ops, const SegmentLayout& layout, const TensorView* chunks,
                                    float* widened, const GptConfig* offset_norms);

// Note [hmid in the workspace]: three internals that are cheap to recompute are not kept with
// a training block's internals but borrow workspace rows: silu(gate) * up, the widest (I = 2.75 C
// for Llama 2 and TinyLlama), lives in the workspace's dgate rows (free until the backward's
// swiglu), and the two normed inputs xn1 = rmsnorm(x) and xn2 = rmsnorm(res2) in its tmp rows
// (each dead in the forward before tmp is next written). The backward reads hmid right after the
// recompute, or recomputes it from gate and up when the internals were kept, and recomputes xn2
// and xn1 into tmp before their weight gradients: the same kernels on the same inputs, so the
// same bits. (B,T,I) + 2 (B,T,C) floats less per block of internals: 637 MB for the 1.1B Llama
// at T = 16384. Where the MLP trains nothing (Note [frozen MLP rows] in model/block_policy.h)
// the backward needs no hmid at all (it feeds only down's weight gradient and its adapter): a
// recomputed set then keeps hmid in its gate rows (the forward's swiglu runs in place, and the
// backward's recompute stops before it) and its d gate too (the swiglu backward writes it over
// gate), so the workspace has no dgate rows (LlamaWorkspace with gate_holds_hmid): one (mlp
// rows, I) buffer less, and no swiglu forward in the backward.
class LlamaWorkspace;

// A Llama-family model's rotary tables for positions [0, max_pos): the full layers' (rope_theta
// with rope_scaling) and, for Gemma 3, its sliding layers' (rope_local_base_freq, unscaled; Note
// [gemma3] in model/model_config.h). The training blocks and the decoder hold one each.
class LlamaRopes {
 public:
  // For sequences of up to max_pos positions; a LongRoPE model's turn by its long factors when
  // max_pos is past its original context (Note [longrope]): training's and evaluation's
  // sequences are all max_pos long.
  LlamaRopes(const GptConfig& config, int max_pos);
  const RopeTable& layer(int l) const {  // layer l's table
    return local_ && static_cast<std::size_t>(l) < local_layers_.size() && local_layers_[l] != 0 ? *local_ : full_;
  }
  // Bytes the tables of such a model hold.
  static std::size_t bytes_for(const GptConfig& config, int max_pos);

 private:
  RopeTable full_;
  std::optional<RopeTable> local_;
  std::vector<std::uint8_t> local_layers_;  // per layer: its table is local_'s
};

// Forward internals of one block at up to B*T rows, fp32, RAM: what the backward needs.
class LlamaActivations {
 public:
  // attention_stats false: no `att_stats` (decoding attends against a KV cache and keeps none).
  // borrow: a training workspace of the same shape whose rows hold hmid, xn1 and xn2 (Note [hmid
  // in the workspace]); null: slices of their own.
  // chunked: atty, res2, gate and up hold one row chunk (Note [row chunks] in model/block_policy.h),
  // for a set the backward refills by recomputing; false: every row.
  // With a borrowed workspace the MLP half runs in its sub-chunks (rows.mlp, Note [frozen MLP rows]
  // in model/block_policy.h), and chunked gate and up hold one sub-chunk.
  LlamaActivations(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, bool attention_stats = true,
                   const LlamaWorkspace* borrow = nullptr, bool chunked = false);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }
  // A training set over memory the caller owns: bytes_for(..., true, true) bytes, 64-byte
  // aligned (a store's Internals unit, Note [activations offload] in exec/executor.h), with
  // `borrow`'s rows as above. size_bytes() is 0: the memory is not this object's.
  LlamaActivations(const GptConfig& config, int max_batch, int max_seq, const LlamaWorkspace& borrow, float* memory);
  // size_bytes() of such an object (borrowed: the training layout, without the borrowed rows),
  // or of a set of every row made without a workspace (the decoder's), without allocating it.
  static std::size_t bytes_for(const GptConfig& config, int max_batch, int max_seq, bool attention_stats = true,
                               bool borrowed = false);
  // Row r0's offset in atty, res2, gate and up (0 when they hold one chunk), and in hmid, xn1 and xn2 (0 when
  // they are the workspace's one-chunk dgate and tmp rows).
  std::size_t chunk_row(int r0) const { return chunked ? 0 : static_cast<std::size_t>(r0); }
  std::size_t work_row(int r0) const { return borrowed ? 0 : static_cast<std::size_t>(r0); }

  bool chunked = false;
  bool borrowed = false;  // hmid, xn1 and xn2 are a training workspace's rows
  BlockRows rows;  // its passes' chunks and MLP sub-chunks (Note [row chunks]): the borrowed workspace's
  float* xn1;    // (B,T,C) input_layernorm(x) (Note [hmid in the workspace])
  float* rstd1;  // (B,T)
  float* qkv;    // (B,T,H*hd + 2*KV*hd) [q | k | v], q and k rotated (Qwen3: normed, then rotated)
  float* rstd_q = nullptr;  // Qwen3: (B,T,H) q_norm's (Note [qk norm])
  float* rstd_k = nullptr;  // Qwen3: (B,T,KV) k_norm's
  float* rstd_pa = nullptr;  // Gemma 3: (B,T) the post-attention norm's (Note [post norms])
  float* rstd_pf = nullptr;  // Gemma 3: (B,T) the post-feedforward norm's
  float* att_stats; // (B,H,T,2) softmax row statistics (kernels/cpu/attention.h)
  float* atty;   // (B,T,H*hd), or (row_chunk_rows, H*hd) when chunked
  float* res2;   // (B,T,C) x + attention output, or (row_chunk_rows, C) when chunked
  float* xn2;    // (B,T,C) post_attention_layernorm(res2) (Note [hmid in the workspace])
  float* rstd2;  // (B,T)
  float* gate;   // (B,T,I), or (row_chunk_rows, I) when chunked
  float* up;     // (B,T,I), or (row_chunk_rows, I) when chunked
  float* hmid;   // (B,T,I) silu(gate) * up, or one chunk's (Note [hmid in the workspace])
  float* ones = nullptr;  // Qwen2: a column of ones (Note [biases by products]); a borrowed workspace's

 private:
  struct NoBuffer {};
  explicit LlamaActivations(NoBuffer) {}
  // The buffer's slices, written through this object's fields.
  CarveSlices slices(const GptConfig& config, int max_batch, int max_seq, bool attention_stats, bool borrow,
                     bool chunked, BlockRows rows);
  OpsBuffer buffer_;
};

// Temporaries shared by every block, fp32, RAM.
class LlamaWorkspace {
 public:
  // bf16_weights: the block's params may be bf16 (Note [frozen bf16 base] in model/block_policy.h):
  // room to widen a panel of its largest matrix (wide) and its two norm weights (wide_vectors).
  // backward false: forward passes only; dxn, datty, dqkv and dup are null (dgate still holds hmid).
  // rows: the row chunk (Note [row chunks] in model/block_policy.h), whose rows the chunk buffers
  // hold, and the MLP half's sub-chunk (at most kFrozenMlpRows where it has nothing to train,
  // Note [frozen MLP rows]), whose rows dgate and dup hold.
  // gate_holds_hmid: its sets are recomputed ones of an MLP that trains nothing (Note [hmid in the
  // workspace]): no dgate rows.
  LlamaWorkspace(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, bool bf16_weights = false,
                 bool backward = true, BlockRows rows = {}, bool gate_holds_hmid = false);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }

  // Note [row chunks] (model/block_policy.h): tmp, dxn, datty, dgate and dup hold one chunk of rows.
  float* tmp;    // (chunk, C) projections before the residual add; xn1, xn2 (Note [hmid in the workspace])
  float* dxn;    // (chunk, C)
  float* datty;  // (chunk, H*hd)
  float* dqkv;   // (B,T,H*hd + 2*KV*hd)
  float* dgate;  // (mlp rows, I) a sub-chunk's hmid (Note [hmid in the workspace]), then d gate
  float* dup;    // (mlp rows, I) d hmid, then d up (Note [row chunks] in model/block_policy.h)
  BlockRows rows;  // the row chunk and the MLP half's sub-chunk (Note [row chunks])
  bool gate_holds_hmid = false;  // dgate is null: the sets' gate rows hold hmid (Note [hmid in the workspace])
  float* attn_scratch;  // ops.attention_scratch_floats(B, T, H, KV, hd)
  float* wide = nullptr;          // a panel of a matrix widened from bf16 (bf16_weights only; Note [widened in panels])
  std::size_t wide_floats = 0;    // wide's floats
  float* wide_vectors = nullptr;  // (llama_vector_floats) the widened norm weights and biases (bf16_weights or Gemma)
  float* ones = nullptr;          // Qwen2: (chunk) ones (Note [biases by products])
  float* post = nullptr;          // Gemma 3, backward: (chunk, C) a recomputed output (Note [post norms])

 private:
  OpsBuffer buffer_;
};

// out (B,T,C) = block(x (B,T,C)) at the attention's positions (Note [one forward] in
// model/block_policy.h), rotated by `rope`, its scores windowed or capped as `scores` says
// (GptConfig::layer_scores; Note [attention scores] in ops/attention_rows.h): linear layers by `linear`, attention by `attention`; fills a with the
// block's internals. out may be x (not for the attention half: part, Note [block halves] in
// model/param_layout.h). tmp is (row_chunk_rows(B*T), C) scratch, attn_scratch the backend's attention
// scratch. Runs in row chunks (Note [row chunks] in model/block_policy.h).
void llama_block_forward(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                         const RopeTable& rope, AttentionScores scores, const LlamaBlockTensors& p, const float* x, float* out,
                         LlamaActivations& a, float* tmp, float* attn_scratch, int B, int T,
                         const LoraBlock* lora = nullptr,
                         BlockPart part = BlockPart::Whole);

// Writes dx (B,T,C) and the block's parameter gradients into g (overwriting them) for the
// upstream gradient dout (B,T,C); with recompute, first refills a from x (bit-identical). g null:
// a frozen base (Note [lora segments]); lora (may be null): adapters, as gpt2_block_backward.
// part (Note [attention recompute first] in model/param_layout.h): Attention runs only the
// recompute of the attention half (one row chunk), Mlp the rest after it, Whole both.
void llama_block_backward(const Ops& ops, const GptConfig& cfg, const RopeTable& rope, AttentionScores scores,
                          const LlamaBlockTensors& p,
                          const LlamaBlockTensors* g, const float* x, const float* dout, float* dx,
                          LlamaActivations& a, LlamaWorkspace& w, int B, int T, bool recompute,
                          const LoraBlock* lora = nullptr,
                          BlockPart part = BlockPart::Whole);

}  // namespace stratum
