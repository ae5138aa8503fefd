// Rotary position embedding (RoPE), Hugging Face Llama "rotate-half" convention: the first and
// second halves of each head vector form the (re, im) pairs. Rotates head vectors in place
// (forward) or by the transposed rotation (backward) with the tables of ops/rope_table.h.
// Does not apply the q/k projections, does not do the interleaved-pairs convention (GPT-J,
// Meta's original checkpoints) and does not support dynamic / YaRN / LongRoPE scaling.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"
#include "ops/rope_table.h"

namespace stratum {

// In place on `heads` head vectors of hd floats per row: x points at the first head of row 0;
// row r (of B*T) starts at x + r*row_stride and its heads are contiguous; row r = b*T + t is at
// position pos0[b] + t (pos0 nullptr = all zero). For each head vector v and i < hd/2 with
// c = cos(pos*inv_freq[i]), s = sin(...):
//   v'[i] = v[i]*c - v[i+hd/2]*s;   v'[i+hd/2] = v[i+hd/2]*c + v[i]*s.
// hd must equal table.head_dim() and every position must be < table.max_pos().
void rope_forward(ThreadPool& pool, float* x, int B, int T, int heads, int hd, std::size_t row_stride,
                  const int* pos0, const RopeTable& table);

// Gradient w.r.t. the unrotated input, in place on dx (same layout as rope_forward): the
// transposed rotation (angle -a).
void rope_backward(ThreadPool& pool, float* dx, int B, int T, int heads, int hd, std::size_t row_stride,
                   const int* pos0, const RopeTable& table);

}  // namespace stratum
