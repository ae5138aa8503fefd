// GELU, tanh approximation ("gelu_new" in Hugging Face GPT-2). Does not own memory.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace stratum {

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(ThreadPool& pool, float* out, const float* inp, std::size_t n);
// dinp (n) = dout * gelu'(inp)   (overwrites)
void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, std::size_t n);

}  // namespace stratum
