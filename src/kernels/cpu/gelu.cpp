// GELU forward/backward, elementwise over fixed contiguous ranges; see gelu.h.
#include "kernels/cpu/gelu.h"

#include "core/simd.h"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void gelu_forward_range(float* out, const float* inp, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = gelu_element(inp[i]);
}

STRATUM_SIMD_CLONES
void gelu_backward_range(float* dinp, const float* inp, const float* dout, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) dinp[i] = gelu_grad_element(inp[i], dout[i]);
}
}  // namespace

void gelu_forward(ThreadPool& pool, float* out, const float* inp, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { gelu_forward_range(out, inp, i0, i1); }, 4096);
}

void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { gelu_backward_range(dinp, inp, dout, i0, i1); },
                    4096);
}

}  // namespace stratum
