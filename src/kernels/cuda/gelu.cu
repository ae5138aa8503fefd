// GELU (tanh form) of the CUDA backend: the CPU's expression with the CPU's tanh (simd::tanh_f32,
// one definition for both), so the same bits (kernels/cpu/gelu.h).
#include "core/simd.h"
#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  out[i] = 0.5f * x * (1.0f + simd::tanh_f32(u));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = inp[i];
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float t = simd::tanh_f32(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  dinp[i] = dout[i] * grad;
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
