// One GPT-2 transformer block, forward and backward (with recompute of the block's internals from
// its input), plus the embedding and the final LayerNorm + tied LM head + cross-entropy.
// Operates on borrowed pointers into segments; does not know where segments live.
#pragma once

#include <cstdint>

#include "core/aligned_buffer.h"
#include "ops/ops.h"
#include "ops/ops_buffer.h"
#include "model/block_policy.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace stratum {

// One block segment's tensors (params or grads: same layout). The four matrices are (in, out)
// views in Conv1D's layout: fp32, or bf16 for a decoder's params kept in bf16 (Note [bf16 weights]
// in infer/decoder.h); the vectors are fp32.
struct Gpt2BlockTensors {
  float* ln1_w;            // (C)
  float* ln1_b;            // (C)
  TensorView attn_w;       // (C, 3C)
  float* attn_b;           // (3C)
  TensorView attn_proj_w;  // (C, C)
  float* attn_proj_b;      // (C)
  float* ln2_w;            // (C)
  float* ln2_b;            // (C)
  TensorView fc_w;         // (C, 4C)
  float* fc_b;             // (4C)
  TensorView mlp_proj_w;   // (4C, C)
  float* mlp_proj_b;       // (C)
};
// One pointer or view per tensor of a block segment held as chunks (Note [segment chunks]):
// chunks[c] is a typed view of chunk c: fp32 (params or grads), or bf16 params (Note [frozen bf16
// base] in model/block_policy.h, Note [bf16 weights] in infer/decoder.h), whose four matrices stay
// bf16 views and whose norm weights and biases are widened into `widened` (13 C floats; may be
// null for fp32 chunks).
Gpt2BlockTensors gpt2_block_tensors(const Ops& ops, const SegmentLayout& layout, const TensorView* chunks,
                                    float* widened);

// Forward internals of one block at up to B*T rows, fp32, RAM: what the backward needs. The
// executor keeps one (recompute mode: refilled by recomputing from the block input) or one per
// block (keep mode).
class Gpt2Workspace;
class Gpt2Activations {
 public:
  // attention_stats false: no `att_stats` (decoding attends against a KV cache and keeps none).
  // borrow: a training workspace of the same shape whose tmp rows hold ln1 and ln2 (as Llama's
  // xn1 and xn2, Note [hmid in the workspace] in model/llama_block.h); null: slices of their own.
  // chunked: atty, res2, fch and fch_gelu hold one row chunk (Note [row chunks] in
  // model/block_policy.h), for a set the backward refills by recomputing; false: every row.
  // With a borrowed workspace the MLP half runs in its sub-chunks (rows.mlp, Note [frozen MLP rows]
  // in model/block_policy.h), and chunked fch and fch_gelu hold one sub-chunk.
  Gpt2Activations(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, bool attention_stats = true,
                  const Gpt2Workspace* borrow = nullptr, bool chunked = false);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }
  // A training set over memory the caller owns: bytes_for(..., true, true) bytes, 64-byte
  // aligned (a store's Internals unit, Note [activations offload] in exec/executor.h), with
  // `borrow`'s rows as above. size_bytes() is 0: the memory is not this object's.
  Gpt2Activations(const GptConfig& config, int max_batch, int max_seq, const Gpt2Workspace& borrow, float* memory);
  // size_bytes() of such an object (borrowed: the training layout, without the borrowed rows),
  // or of a set of every row made without a workspace (the decoder's), without allocating it.
  static std::size_t bytes_for(const GptConfig& config, int max_batch, int max_seq, bool attention_stats = true,
                               bool borrowed = false);
  // Row r0's offset in atty, res2, fch and fch_gelu (0 when they hold one chunk), and in ln1 and
  // ln2 (0 when they are the workspace's one-chunk tmp rows).
  std::size_t chunk_row(int r0) const { return chunked ? 0 : static_cast<std::size_t>(r0); }
  std::size_t work_row(int r0) const { return borrowed ? 0 : static_cast<std::size_t>(r0); }

  bool chunked = false;
  BlockRows rows;  // its passes' chunks and MLP sub-chunks (Note [row chunks]): the borrowed workspace's
  bool borrowed = false;  // ln1 and ln2 are a training workspace's rows
  float* ln1;       // (B,T,C) (one chunk: the workspace's tmp rows in training)
  float* ln1_mean;  // (B,T)
  float* ln1_rstd;  // (B,T)
  float* qkv;       // (B,T,3C)
  float* att_stats; // (B,H,T,2) softmax row statistics (kernels/cpu/attention.h)
  float* atty;      // (B,T,C), or (row_chunk_rows, C) when chunked
  float* res2;      // (B,T,C), or (row_chunk_rows, C) when chunked
  float* ln2;       // (B,T,C) (one chunk: the workspace's tmp rows in training)
  float* ln2_mean;  // (B,T)
  float* ln2_rstd;  // (B,T)
  float* fch;       // (B,T,4C), or (row_chunk_rows, 4C) when chunked
  float* fch_gelu;  // (B,T,4C), or (row_chunk_rows, 4C) when chunked; fch's rows (gelu in place)
                    // in a recomputed set of an MLP that trains nothing (Gpt2Workspace::gelu_in_fch)

 private:
  struct NoBuffer {};
  explicit Gpt2Activations(NoBuffer) {}
  // The buffer's slices, written through this object's fields.
  CarveSlices slices(const GptConfig& config, int max_batch, int max_seq, bool attention_stats, bool borrow,
                     bool chunked, BlockRows rows, bool gelu_in_fch = false);
  OpsBuffer buffer_;
};

// Temporaries shared by every block (forward projections, backward gradients), fp32, RAM.
class Gpt2Workspace {
 public:
  // bf16_weights: the block's params may be bf16 (Note [frozen bf16 base] in model/block_policy.h):
  // room to widen its largest matrix (wide) and its norm weights and biases (wide_vectors).
  // backward false: forward passes only; dfch, dln, datty and dqkv are null.
  // rows: the row chunk (Note [row chunks] in model/block_policy.h), whose rows the chunk buffers
  // hold, and the MLP half's sub-chunk (at most kFrozenMlpRows where it has nothing to train,
  // Note [frozen MLP rows]), whose rows dfch holds.
  // gelu_in_fch: its sets are recomputed ones of an MLP that trains nothing, whose backward needs
  // only fch (pre-gelu; fch_gelu feeds mlp_proj's weight gradient and adapter): their fch_gelu is
  // fch's rows, the gelu runs in place in the forward and not at all in the backward's recompute
  // (as Llama's hmid, Note [hmid in the workspace] in model/llama_block.h).
  Gpt2Workspace(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, bool bf16_weights = false,
                bool backward = true, BlockRows rows = {}, bool gelu_in_fch = false);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }

  // Note [row chunks] (model/block_policy.h): tmp, dfch, dln and datty hold one chunk of rows.
  float* tmp;       // (chunk, C) projections before the residual add; ln1, ln2
  float* dfch;      // (mlp rows, 4C) d fch, then d fch_gelu
  float* dln;       // (chunk, C)
  float* datty;     // (chunk, C)
  float* dqkv;      // (B,T,3C)
  float* attn_scratch;  // ops.attention_scratch_floats(B, T, H, H, C / H)
  float* wide = nullptr;          // (4C * C) a widened bf16 matrix (bf16_weights only)
  std::size_t wide_floats = 0;    // wide's floats
  float* wide_vectors = nullptr;  // (13 C) widened norm weights and biases (bf16_weights only)
  BlockRows rows;                 // the row chunk and the MLP half's sub-chunk (Note [row chunks])
  bool gelu_in_fch = false;       // the sets' fch_gelu is their fch

 private:
  OpsBuffer buffer_;
};

// out (B,T,C) = block(x (B,T,C)) (Note [one forward] in model/block_policy.h): linear layers by
// `linear`, attention by `attention`; fills a with the block's internals. out may be x (not
// for the attention half: part, Note [block halves] in model/param_layout.h). tmp is
// (row_chunk_rows(B*T), C) scratch, attn_scratch the backend's attention scratch. lora (may be null): adapters
// added to the modules they target (Note [lora math] in model/lora.h). Runs in row chunks (Note
// [row chunks] in model/block_policy.h).
void gpt2_block_forward(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                        const Gpt2BlockTensors& p, const float* x, float* out, Gpt2Activations& a, float* tmp,
                        float* attn_scratch, int B, int T, const LoraBlock* lora = nullptr,
                        BlockPart part = BlockPart::Whole);

// Writes dx (B,T,C) and the block's parameter gradients into g (overwriting them) for the
// upstream gradient dout (B,T,C). With recompute, first refills a by re-running the forward
// from x (bit-identical to the original forward); otherwise a must still hold this block's
// forward internals. g null: a frozen base, no parameter gradients (Note [lora segments]); lora:
// the adapters' gradients into their da, db.
// part (Note [attention recompute first] in model/param_layout.h): Attention runs only the
// recompute of the attention half (one row chunk), Mlp the rest after it, Whole both.
void gpt2_block_backward(const Ops& ops, const GptConfig& cfg, const Gpt2BlockTensors& p,
                         const Gpt2BlockTensors* g, const float* x, const float* dout, float* dx,
                         Gpt2Activations& a, Gpt2Workspace& w, int B, int T, bool recompute,
                         const LoraBlock* lora = nullptr,
                          BlockPart part = BlockPart::Whole);

}  // namespace stratum
