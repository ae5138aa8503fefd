// Output side of both families: final norm (GPT-2's LayerNorm ln_f, or Llama's RMSNorm
// model.norm, by cfg.arch: lnf_b / dlnf_b are then null), the LM head (the token embedding's
// vocabulary blocks when tied, lm_head's when not: the caller passes the rows), and mean
// cross-entropy, computed one vocabulary block at a time (Note [vocab blocks] in
// model/param_layout.h) and, inside a block, head_chunk_rows() rows at a time, so neither the
// full (B*T, V) logits nor the whole of wte is ever needed at once.
// Note [head passes]: training runs two passes over the vocabulary blocks. The first
// (gpt2_head_lse_block) computes each row's log-sum-exp online (Note [online log-sum-exp]) and
// its target logit; gpt2_head_loss_finish turns them into the loss. The second
// (gpt2_head_backward_block) recomputes each block's logits, turns them into dlogits with the
// final log-sum-exp, accumulates dlnf over blocks in block order and writes the block's wte
// gradient (accumulated over row chunks in row order). Inference needs only the first pass.
// Every sum runs in a fixed order, so the bits do not depend on where the blocks live.
// Note [kept logits]: a scratch made with keep_logits (the executor's, under --activations keep)
// also holds every block's logits of the first pass (BT x V floats), and the second pass reads
// them instead of multiplying again: one of the head's four products a step less, the same
// values (the same product of the same operands), so the same bits.
#pragma once

#include <cstdint>

#include "core/aligned_buffer.h"
#include "ops/ops.h"
#include "ops/ops_buffer.h"
#include "model/block_policy.h"
#include "model/model_config.h"

namespace stratum {

// Rows of one head product. fp32: 256. bf16: 1024, because each bf16 product rounds its operands
// again, the vocabulary block among them: a quarter of the roundings and larger products make the
// head 1.6x faster in bf16 on GPT-2 small (docs/benchmarks.md), while fp32 gains nothing and keeps
// its bits (the block's gradient sums its row chunks in order, so the chunk size is in the bits).
int head_chunk_rows(Precision precision);

class Gpt2HeadScratch {
 public:
  // Rows of up to max_rows, in chunks of head_chunk_rows(precision) on the host, of max_rows on a
  // device (bytes_for is the host's size).
  // keep_logits: Note [kept logits]. backward false: forward passes only, no dlnf.
  Gpt2HeadScratch(const Ops& ops, const GptConfig& config, int max_rows, Precision precision = Precision::Fp32,
                  bool keep_logits = false, bool backward = true);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }
  // size_bytes() before allocating.
  static std::size_t bytes_for(const GptConfig& config, int max_rows, Precision precision = Precision::Fp32,
                               bool keep_logits = false);
  int chunk_rows() const { return chunk_rows_; }
  float* lnf;           // (BT, C)
  float* mean;          // (BT)
  float* rstd;          // (BT)
  float* logits;        // (chunk_rows, vocab block rows), reused per chunk (holds dlogits in training)
  float* run_max;       // (BT) online log-sum-exp state
  float* run_sum;       // (BT)
  float* target_logit;  // (BT)
  float* lse;           // (BT) after gpt2_head_loss_finish
  float* dlnf;          // (BT, C); null for forward passes only
  // Note [kept logits]: vocabulary rows [v0, v0 + n) at v0 * BT as (BT, n) row-major, every block
  // of the first pass; null without keep_logits.
  float* kept = nullptr;
  // Note [rounded operands] (ops/ops.h), used where ops.bf16_rounded(): lnf rounded once (BT, C),
  // the block's wte rows (vocab block rows, C) and a chunk's logit gradients (chunk_rows, vocab
  // block rows); null in fp32.
  std::uint16_t* lnf16 = nullptr;
  std::uint16_t* w16 = nullptr;
  std::uint16_t* d16 = nullptr;
  // Note [gemma] (model/model_config.h): (2C) the final norm's weight as 1 + w (the ones, then the
  // sum); null where the norm takes w.
  float* norm_w = nullptr;

 private:
  // The slices in field order, written through `fields` (14 pointers); rounded: the bf16 ones.
  static CarveSlices slices(const GptConfig& config, int max_rows, int chunk_rows, bool keep_logits, bool backward,
                            bool rounded, float** const* fields);
  int chunk_rows_ = 0;
  OpsBuffer buffer_;
};

// Final LayerNorm of x (BT, C) (the last block's output) into s.lnf, and resets the
// log-sum-exp state.
void gpt2_head_begin(const Ops& ops, const GptConfig& cfg, const float* lnf_w, const float* lnf_b, const float* x,
                     int BT, Gpt2HeadScratch& s);
// Folds vocabulary rows [v0, v0 + n) (wte_rows: (n, C)) into every row's log-sum-exp.
void gpt2_head_lse_block(const Ops& ops, const GptConfig& cfg, const float* wte_rows, int v0, int n,
                         const std::int32_t* targets, int BT, Gpt2HeadScratch& s);
// After every block: the mean cross-entropy over the rows whose target counts (Note [loss mask]
// in data/token_file.h; 0 when none does), and s.lse for the backward.
float gpt2_head_loss_finish(const Ops& ops, const std::int32_t* targets, int BT, Gpt2HeadScratch& s);
// Backward of the mean loss for one block: overwrites dwte_rows (n, C; null for a frozen head,
// Note [lora segments]) and adds the block's
// contribution to s.dlnf (overwrites it for the first block). mean_rows: the rows the loss is the
// mean over: BT, or N * BT for one of N accumulated micro-batches (Note [gradient accumulation]),
// or the step's targets that count (Note [masked loss] in exec/executor.h); 0: none, no gradient.
void gpt2_head_backward_block(const Ops& ops, const GptConfig& cfg, const float* wte_rows, float* dwte_rows, int v0,
                              int n, const std::int32_t* targets, int BT, bool first_block, Gpt2HeadScratch& s,
                              int mean_rows);
// After every block: dx (BT, C) and the final LayerNorm's gradients (all overwritten; dlnf_w null:
// frozen, none).
void gpt2_head_backward_finish(const Ops& ops, const GptConfig& cfg, const float* lnf_w, const float* x, float* dx,
                               float* dlnf_w, float* dlnf_b, int BT, Gpt2HeadScratch& s);
// Logits of vocabulary rows [v0, v0 + n) (wte_rows: (n, C), fp32 or bf16) for the first `rows` rows
// of the last gpt2_head_begin: logits (rows, n), row stride ld_logits, by `linear` (GEMM for the
// executor's inference, row dot products for decoding; Note [one forward]).
void gpt2_head_logits_block(const Ops& ops, const Linear& linear, const GptConfig& cfg, const TensorView& wte_rows,
                            int n, int rows, float* logits, int ld_logits, const Gpt2HeadScratch& s);

}  // namespace stratum
