// AdamW of the CUDA backend: the CPU's scalars (computed on the host the same way) and its
// elementwise expression (kernels/cpu/adamw.h), so the same bits (sqrt and division are IEEE
// correctly rounded in CUDA without fast math).
#include <cmath>

#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

struct AdamWScalars {
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps, grad_scale;
};

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, std::size_t n, AdamWScalars s) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * s.grad_scale;
  float p = param[i] * s.decay_factor;
  const float mi = m[i] * s.beta1 + s.one_minus_beta1 * g;
  const float vi = v[i] * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  p = p + s.neg_step_size * mi / denom;
  m[i] = mi;
  v[i] = vi;
  param[i] = p;
}

}  // namespace

void CudaOps::adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n, const AdamWHyper& h,
                           double weight_decay, float grad_scale) const {
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  AdamWScalars s{};
  s.decay_factor = static_cast<float>(1.0 - h.lr * weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(h.eps);
  s.grad_scale = grad_scale;
  adamw_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(param, m, v, grad, n, s);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
