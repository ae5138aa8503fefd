// Zeroth-order perturbation and update; see zo_update.h.
#include "kernels/cpu/zo_update.h"

#include "core/simd.h"
#include "core/zo_noise.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void zo_range(float* x, std::size_t i0, std::size_t i1, std::uint64_t first, const float* table, ZoUpdate u) {
  for (std::size_t i = i0; i < i1; ++i) {
    float p = x[i];
    if (u.update) {
      const float z = zo_z(table, u.update_key, first + i);
      p = p + z * u.eps;
      p = p - u.lr * (u.g * z + u.weight_decay * p);
    }
    if (u.perturb) p = p + zo_z(table, u.perturb_key, first + i) * u.scale;
    x[i] = p;
  }
}
}  // namespace

void zo_update(ThreadPool& pool, float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) {
  const float* table = zo_normal_table();
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { zo_range(x, i0, i1, first, table, u); }, 16384);
}

}  // namespace stratum
