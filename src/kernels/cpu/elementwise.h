// Small elementwise and reduction kernels (residual add, sum of squares, bf16 widening). Does not own memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// out (n) = in (n) widened from bfloat16 (exact), over fixed ranges.
void bf16_widen_f32(ThreadPool& pool, float* out, const std::uint16_t* in, std::size_t n);

// out (n) = a + b; out may alias a or b.
void add_f32(ThreadPool& pool, float* out, const float* a, const float* b, std::size_t n);

// Sum of x[i]^2 in double. Note [fixed chunks]: the input is cut into fixed 64 Ki-element chunks
// (not per thread), each summed in order, chunk sums added in order: thread-count independent.
double sum_squares(ThreadPool& pool, const float* x, std::size_t n);

}  // namespace stratum
