// Runs a training or inference pass block by block over segments held by a SegmentStore.
// Note [step schedule]: forward visits embed, layer.0 .. layer.L-1, head (keeping only each
// block's input, the "boundary activations"); the head computes loss and its backward in row
// chunks; backward visits layer.L-1 .. layer.0, recomputing each block's internals from its
// boundary input; the embedding backward runs last; the optimizer then visits every segment.
// Every segment use is bracketed by acquire/release (Note [acquire/release]) so a tiered store
// can stream segments without the model code knowing. Does not choose placement or own segments.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "kernels/cpu/adamw.h"
#include "model/gpt2_block.h"
#include "model/gpt2_head.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"

namespace stratum {

class Executor {
 public:
  // keep_activations: keep every block's forward internals until its backward instead of
  // recomputing them from the block input (faster, L times the activation memory; same bits).
  Executor(ThreadPool& pool, const GptConfig& config, const ParamLayout& layout, SegmentStore& store, int max_batch,
           int max_seq, bool keep_activations = false);

  // Forward + backward for inputs/targets (B,T); writes every parameter's gradient into the
  // store's Grads segments (overwriting) and returns the mean cross-entropy.
  float forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);
  // Forward only: mean cross-entropy.
  float loss(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);
  // Logits (V) of the last position of tokens (1, T), T <= max_seq.
  void logits_last(const std::int32_t* tokens, int T, float* logits);

  // Sum of squared gradients over all parameters (double, fixed order).
  double grad_sum_squares();
  // AdamW on every segment; weight decay applies to tensors with weight_decay set.
  void optimizer_step(const AdamWHyper& hyper, double weight_decay, float grad_scale);

  // Bytes of activation memory (boundary activations + scratch) this executor holds.
  std::size_t activation_bytes() const;

 private:
  void check_shape(int B, int T) const;
  void forward_blocks(const std::int32_t* inputs, int B, int T);
  // Head on the last forward's output: mean loss over targets (BT rows) when logits is null,
  // else the logits (V) of row logits_row.
  float head_inference(const std::int32_t* targets, int BT, int logits_row, float* logits);
  float* act(int i) { return acts_.as_f32() + static_cast<std::size_t>(i) * act_stride_; }
  Gpt2Activations& block_acts(int layer) { return block_acts_[keep_activations_ ? layer : 0]; }

  ThreadPool& pool_;
  GptConfig cfg_;
  const ParamLayout& layout_;
  SegmentStore& store_;
  int max_batch_, max_seq_;
  std::size_t act_stride_;   // max_batch * max_seq * C floats
  AlignedBuffer acts_;       // (L+1) x (B,T,C): input of each block, then the final output
  AlignedBuffer dacts_;      // 2 x (B,T,C): gradient ping-pong for the backward
  bool keep_activations_;
  std::vector<Gpt2Activations> block_acts_;  // 1 (recompute) or n_layer (keep)
  Gpt2Workspace workspace_;
  Gpt2HeadScratch head_scratch_;
};

}  // namespace stratum
