// AdamW elementwise over fixed contiguous ranges; see adamw.h.
#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/simd.h"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void adamw_range(float* param, float* m, float* v, const float* grad, std::size_t i0, std::size_t i1,
                 AdamWScalars s) {
  for (std::size_t i = i0; i < i1; ++i) adamw_element(param[i], m[i], v[i], grad[i], s);
}
}  // namespace

void adamw_update(ThreadPool& pool, float* param, float* m, float* v, const float* grad, std::size_t n,
                  const AdamWHyper& h, double weight_decay, float grad_scale) {
  const AdamWScalars s = adamw_scalars(h, weight_decay, grad_scale);
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { adamw_range(param, m, v, grad, i0, i1, s); }, 4096);
}

}  // namespace stratum
