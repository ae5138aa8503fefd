// Causal multi-head self-attention core (softmax(q k^T / sqrt(hd)) v), GPT-2 head layout:
// qkv rows are [q (C) | k (C) | v (C)], head h owns channels [h*hd, (h+1)*hd) of each.
// Does not include the c_attn / c_proj projections (see matmul.h). Does not own memory.
#pragma once

#include "core/thread_pool.h"

namespace stratum {

// Floats of scratch both directions need: each head's K (forward) or V (backward) transposed to
// (hd, T), so score rows are computed as contiguous, vectorised sums over the head dimension,
// plus one (T) row per (batch, head) for the backward.
std::size_t attention_scratch_floats(int B, int T, int C, int H);

// qkv (B,T,3C) -> out (B,T,C); att (B,H,T,T) receives the softmax probabilities (row t is
// valid for t2 <= t, zero above) for the backward.
void attention_forward(ThreadPool& pool, float* out, float* att, float* scratch, const float* qkv, int B, int T,
                       int C, int H);

// dqkv (B,T,3C) = gradient w.r.t. qkv given dout (B,T,C) (overwrites).
void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int H);

}  // namespace stratum
