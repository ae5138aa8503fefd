// SwiGLU and GeGLU forward/backward, elementwise over fixed contiguous ranges; see swiglu.h. Each output
// element comes from one expression of its own inputs, so the thread count does not matter.
#include "kernels/cpu/swiglu.h"

#include "core/simd.h"
#include "ops/elementwise_math.h"
#include "stratum/error.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void swiglu_forward_range(float* out, const float* gate, const float* up, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = swiglu_element(gate[i], up[i]);
}

// silu'(x) = sig(x) * (1 + x * (1 - sig(x))), applied to dy * up in torch's silu_backward
// order. dout[i] is read before dgate[i] / dup[i] are written, so either may be dout itself.
STRATUM_SIMD_CLONES
void swiglu_backward_range(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                           std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) {
    float dg, du;
    swiglu_grad_element(dout[i], gate[i], up[i], dg, du);
    dup[i] = du;
    dgate[i] = dg;
  }
}

STRATUM_SIMD_CLONES
void geglu_forward_range(float* out, const float* gate, const float* up, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = geglu_element(gate[i], up[i]);
}

STRATUM_SIMD_CLONES
void geglu_backward_range(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                          std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) {
    float dg, du;
    geglu_grad_element(dout[i], gate[i], up[i], dg, du);
    dup[i] = du;
    dgate[i] = dg;
  }
}
}  // namespace

void swiglu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { swiglu_forward_range(out, gate, up, i0, i1); }, 4096);
}

void swiglu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, std::size_t n) {
  STRATUM_ASSERT(dgate != dup || n == 0);
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) {
    swiglu_backward_range(dgate, dup, dout, gate, up, i0, i1);
  }, 4096);
}

void geglu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { geglu_forward_range(out, gate, up, i0, i1); }, 4096);
}

void geglu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                    const float* up, std::size_t n) {
  STRATUM_ASSERT(dgate != dup || n == 0);
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) {
    geglu_backward_range(dgate, dup, dout, gate, up, i0, i1);
  }, 4096);
}

}  // namespace stratum
