// The gated activations of the Llama-family MLPs, elementwise in fp32: SwiGLU, silu(gate) * up, and
// Gemma's GeGLU, gelu_tanh(gate) * up (Note [gemma] in model/model_config.h).
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

// out (n) = gelu_tanh(gate) * up (gelu.h's GELU, torch's gelu(approximate="tanh")), and its
// backward with swiglu_backward's aliasing rules.
void geglu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, std::size_t n);
void geglu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                    const float* up, std::size_t n);

}  // namespace stratum
