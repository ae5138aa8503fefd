// LayerNorm over the last dimension (PyTorch semantics: biased variance, eps inside the sqrt).
// Does not own memory.
#pragma once

#include "core/thread_pool.h"

namespace stratum {

// out (N,C) = (inp - mean) * rstd * w + b; mean (N), rstd (N) are written for the backward.
void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C, float eps);

// dinp (N,C) += d/dinp; dw (C), db (C) = (or += when accumulate_params) d/dw, d/db (dw null:
// neither, for a frozen norm).
void layernorm_backward(ThreadPool& pool, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd, int N, int C,
                        bool accumulate_params);

}  // namespace stratum
