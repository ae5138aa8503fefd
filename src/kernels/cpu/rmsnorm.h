// RMSNorm over the last dimension, Hugging Face LlamaRMSNorm semantics in fp32:
// out = w * (x * rsqrt(mean(x^2) + eps)), no mean subtraction and no bias.
// Does not own memory and does not do the bf16/fp16 casts transformers inserts around it.
#pragma once

#include "core/thread_pool.h"

namespace stratum {

// out (N,C) = w * (inp * rstd); rstd (N) = 1/sqrt(mean_c(inp^2) + eps) is written for the backward.
void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps);

// dinp (N,C) += d/dinp (accumulates); dw (C) = (or += when accumulate_params) d/dw, each column
// summed over rows 0..N-1 in order (independent of the thread count); dw null: none (a frozen norm).
void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, bool accumulate_params);

// Per-head RMSNorm in place (Note [qk norm] in model/llama_block.h): n token rows ld floats
// apart, each holding `heads` vectors of hd floats, every vector normed with the same w (hd);
// rstd (n * heads), token-major.
void rmsnorm_heads_forward(ThreadPool& pool, float* x, int ld, float* rstd, const float* w, int n, int heads, int hd,
                           float eps);
// d (the same layout) goes from d out to d in, in place; x is the forward's input; dw (hd) = (or
// += when accumulate_params) d/dw, each column summed over the n * heads vectors in order; dw
// null: none.
void rmsnorm_heads_backward(ThreadPool& pool, float* d, const float* x, int ld, float* dw, const float* w,
                            const float* rstd, int n, int heads, int hd, bool accumulate_params);

}  // namespace stratum
