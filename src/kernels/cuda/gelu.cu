// GELU (tanh form) of the CUDA backend: the CPU's element expressions (ops/elementwise_math.h, one
// definition for both), so the same bits (kernels/cpu/gelu.h).
#include "core/simd.h"
#include "kernels/cuda/cuda_context.cuh"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {

__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = gelu_element(inp[i]);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) dinp[i] = gelu_grad_element(inp[i], dout[i]);
}

}  // namespace

void CudaOps::gelu_forward(float* out, const float* inp, std::size_t n) const {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(out, inp, n);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) const {
  if (n == 0) return;
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(dinp, inp, dout, n);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
