// SwiGLU of the CUDA backend: the CPU's element expressions (ops/elementwise_math.h, one definition
// for both), so the same bits (kernels/cpu/swiglu.h).
#include "core/simd.h"
#include "kernels/cuda/cuda_context.cuh"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {

__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = swiglu_element(gate[i], up[i]);
}

// dout[i] is read before dgate[i] / dup[i] are written, so either may be dout itself.
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                       std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float dg, du;
  swiglu_grad_element(dout[i], gate[i], up[i], dg, du);
  dup[i] = du;
  dgate[i] = dg;
}

}  // namespace

void CudaOps::swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) const {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(out, gate, up, n);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                              std::size_t n) const {
  STRATUM_ASSERT(dgate != dup || n == 0);
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(dgate, dup, dout, gate, up, n);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
