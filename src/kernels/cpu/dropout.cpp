// Dropout with a regenerated mask; see dropout.h.
#include "kernels/cpu/dropout.h"

#include <algorithm>
#include <cstddef>

#include "core/dropout_mask.h"
#include "core/simd.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void dropout_row(float* y, const float* x, int n, std::uint64_t first, std::uint64_t key, std::uint32_t threshold,
                 float scale, bool accumulate) {
  for (int j = 0; j < n; ++j) {
    const float v = dropout_keep(key, first + static_cast<std::uint64_t>(j), threshold) ? x[j] * scale : 0.0f;
    y[j] = accumulate ? y[j] + v : v;
  }
}
}  // namespace

void dropout_rows(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key,
                  float p, bool accumulate) {
  const std::uint32_t threshold = dropout_threshold(p);
  const float scale = dropout_keep_scale(p);
  const std::size_t rows_per_item = std::max<std::size_t>(1, 16384 / static_cast<std::size_t>(std::max(n, 1)));
  pool.parallel_for(
      static_cast<std::size_t>(M),
      [&](std::size_t m0, std::size_t m1) {
        for (std::size_t m = m0; m < m1; ++m)
          dropout_row(y + m * ldy, x + m * ldx, n, m * static_cast<std::size_t>(n), key, threshold, scale, accumulate);
      },
      rows_per_item);
}

}  // namespace stratum
