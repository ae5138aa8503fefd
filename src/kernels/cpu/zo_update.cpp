// Zeroth-order perturbation and update; see zo_update.h.
#include "kernels/cpu/zo_update.h"

#include "core/simd.h"
#include "core/zo_noise.h"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void zo_range(float* x, std::size_t i0, std::size_t i1, std::uint64_t first, const float* table, ZoUpdate u) {
  for (std::size_t i = i0; i < i1; ++i) x[i] = zo_element(x[i], table, first + i, u);
}
}  // namespace

void zo_update(ThreadPool& pool, float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) {
  const float* table = zo_normal_table();
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { zo_range(x, i0, i1, first, table, u); }, 16384);
}

}  // namespace stratum
