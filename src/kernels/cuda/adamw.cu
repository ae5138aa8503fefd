// AdamW of the CUDA backend: the CPU's scalars and element expression (ops/elementwise_math.h,
// one definition), so the same bits (sqrt and division are IEEE correctly rounded in CUDA without
// fast math).
#include <cmath>

#include "kernels/cuda/cuda_context.cuh"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, std::size_t n, AdamWScalars s) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) adamw_element(param[i], m[i], v[i], grad[i], s);
}

}  // namespace

void CudaOps::adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n, const AdamWHyper& h,
                           double weight_decay, float grad_scale) const {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(param, m, v, grad, n,
                                                             adamw_scalars(h, weight_decay, grad_scale));
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
