// SwiGLU gate of the Llama MLP: silu(gate) * up, elementwise in fp32.
// Does not include the gate/up/down projections (see matmul.h). Does not own memory.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace stratum {

// out (n) = silu(gate) * up with silu(x) = x / (1 + exp(-x)) (torch's float formula).
void swiglu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, std::size_t n);

// dgate (n), dup (n) (overwrite) from dout (n). dgate and dup must not alias each other; either
// may be the same pointer as dout (in place).
void swiglu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::size_t n);

}  // namespace stratum
