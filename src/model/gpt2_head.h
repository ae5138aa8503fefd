// GPT-2 output side: final LayerNorm, LM head tied to the token embedding, and mean
// cross-entropy, computed in fixed chunks of rows so the full (B*T, V) logits never exist.
// Note [head chunks]: rows are processed in chunks of kHeadRows in order; the tied-embedding
// gradient is accumulated chunk by chunk in that order, whatever the memory placement.
#pragma once

#include <cstdint>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "model/model_config.h"

namespace stratum {

inline constexpr int kHeadRows = 256;

class Gpt2HeadScratch {
 public:
  Gpt2HeadScratch(const GptConfig& config, int max_rows);
  std::size_t size_bytes() const { return buffer_.size_bytes(); }
  float* lnf;       // (BT, C)
  float* mean;      // (BT)
  float* rstd;      // (BT)
  float* logits;    // (kHeadRows, V), reused per chunk (holds dlogits in training)
  float* losses;    // (BT)
  float* dlnf;      // (BT, C)

 private:
  AlignedBuffer buffer_;
};

struct Gpt2HeadParams {
  const float* lnf_w;  // (C)
  const float* lnf_b;  // (C)
  const float* wte;    // (V, C), segment embed.params
};

struct Gpt2HeadGrads {
  float* lnf_w;  // (C), overwritten
  float* lnf_b;  // (C), overwritten
  float* wte;    // (V, C): overwritten by the head, then the embedding backward adds to it
  float* dx;     // (BT, C) gradient w.r.t. the final residual stream, overwritten
};

// Mean cross-entropy of x (BT, C) (the last block's output) against targets (BT). With grads
// non-null it also runs the backward for dloss = 1 (the mean). Returns the mean loss.
float gpt2_head_loss(ThreadPool& pool, const GptConfig& cfg, const Gpt2HeadParams& p, const Gpt2HeadGrads* grads,
                     const float* x, const std::int32_t* targets, int BT, Gpt2HeadScratch& s);

// logits (V) for one row x (C) (generation).
void gpt2_head_logits_row(ThreadPool& pool, const GptConfig& cfg, const Gpt2HeadParams& p, const float* x,
                          float* logits, Gpt2HeadScratch& s);

}  // namespace stratum
