// AdamW elementwise over fixed contiguous ranges; see adamw.h.
#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/simd.h"

namespace stratum {

namespace {
struct AdamWScalars {
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps, grad_scale;
};

STRATUM_SIMD_CLONES
void adamw_range(float* param, float* m, float* v, const float* grad, std::size_t i0, std::size_t i1,
                 AdamWScalars s) {
  for (std::size_t i = i0; i < i1; ++i) {
    const float g = grad[i] * s.grad_scale;
    float p = param[i] * s.decay_factor;
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * g;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p = p + s.neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}
}  // namespace

void adamw_update(ThreadPool& pool, float* param, float* m, float* v, const float* grad, std::size_t n,
                  const AdamWHyper& h, double weight_decay, float grad_scale) {
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
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { adamw_range(param, m, v, grad, i0, i1, s); }, 4096);
}

}  // namespace stratum
