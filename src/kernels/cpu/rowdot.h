// Matrix products for decoding, where few rows meet a large weight matrix that is read once per
// step. Note [row dot products]: every output element is computed on its own, from its input row
// and its weight row or column only, in a fixed order (Note [simd lanes]), so its bits do not
// depend on how many rows are computed together, on the tiling or on the thread count: a
// sequence's logits are the same alone, in any batch and however its prompt is chunked. Unlike
// OpenBLAS sgemm, which packs the weights and at one row runs at about a quarter of the memory
// bandwidth on our machines (docs/benchmarks.md), these stream each weight once from memory.
// Compute-bound shapes (long prompts, large batches) run at about half of sgemm's rate (no FMA:
// -ffp-contract=off keeps the ISA clones bit-identical). Does not own memory.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// y[m * ldy + n] = dot(x row m, w row n) (+ bias[n]) for x (M, K) with row stride ldx, w (N, K)
// row-major (a PyTorch Linear / LM head). The dot: element k to lane k % 16, lanes summed by
// simd::lanes_sum, then the bias added. bias may be null.
void rowdot_nt(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M,
               int N, int K);

// rowdot_nt with bfloat16 weights, each widened to fp32 as it is loaded: the same bits as
// rowdot_nt on the widened copy of w (Note [bf16 weights] in infer/decoder.h).
void rowdot_nt_bf16(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const std::uint16_t* w,
                    const float* bias, int M, int N, int K);

// y (M, N) = x (M, K) @ w (K, N) + bias (N), w in GPT-2's Conv1D layout (in, out). Each y[m][n]
// sums x[m][k] * w[k][n] over k in order, then adds the bias. bias may be null.
void rowdot_kn(ThreadPool& pool, float* y, const float* x, const float* w, const float* bias, int M, int K, int N);

// rowdot_kn with bfloat16 weights, each widened to fp32 as it is loaded: the same bits as
// rowdot_kn on the widened copy of w (Note [bf16 weights] in infer/decoder.h).
void rowdot_kn_bf16(ThreadPool& pool, float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                    int N);

}  // namespace stratum
