// RoPE frequencies, cos/sin tables and the in-place rotation; see rope.h. Rows are split over
// threads; each element is produced by one elementwise expression, so results do not depend on
// the thread count (Note [deterministic partition] in core/thread_pool.h).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <numbers>

#include "core/simd.h"
#include "ops/elementwise_math.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// Rotates rows [r0, r1) by +angle (forward) or -angle (backward, the transpose).
STRATUM_SIMD_CLONES
void rope_rows(float* x, std::size_t r0, std::size_t r1, int T, int heads, int hd, std::size_t row_stride,
               const int* pos0, const RopeTable& table, bool transpose) {
  const int half = table.head_dim() / 2;  // Note [partial rotary]: channels past 2 * half stay
  for (std::size_t r = r0; r < r1; ++r) {
    const std::size_t b = r / T, t = r % T;
    const int pos = (pos0 != nullptr ? pos0[b] : 0) + static_cast<int>(t);
    const float* c = table.cos(pos);
    const float* s = table.sin(pos);
    for (int h = 0; h < heads; ++h) {
      float* lo = x + r * row_stride + static_cast<std::size_t>(h) * hd;  // the rotary part's first half
      float* hi = lo + half;                                                // and its second
      if (!transpose) {
        for (int i = 0; i < half; ++i) rope_rotate(lo[i], hi[i], c[i], s[i], false);
      } else {
        for (int i = 0; i < half; ++i) rope_rotate(lo[i], hi[i], c[i], s[i], true);
      }
    }
  }
}

void rope_apply(ThreadPool& pool, float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                const RopeTable& table, bool transpose) {
  rope_check_shape(table, B, T, heads, hd, row_stride);
  if (B == 0 || T == 0 || heads == 0) return;
  for (int b = 0; b < B; ++b) {
    const int first = pos0 != nullptr ? pos0[b] : 0;
    STRATUM_ASSERT(first >= 0 && first <= table.max_pos() - T);
  }
  pool.parallel_for(static_cast<std::size_t>(B) * T, [&](std::size_t r0, std::size_t r1) {
    rope_rows(x, r0, r1, T, heads, hd, row_stride, pos0, table, transpose);
  }, 16);
}
}  // namespace

void rope_forward(ThreadPool& pool, float* x, int B, int T, int heads, int hd, std::size_t row_stride,
                  const int* pos0, const RopeTable& table) {
  rope_apply(pool, x, B, T, heads, hd, row_stride, pos0, table, false);
}

void rope_backward(ThreadPool& pool, float* dx, int B, int T, int heads, int hd, std::size_t row_stride,
                   const int* pos0, const RopeTable& table) {
  rope_apply(pool, dx, B, T, heads, hd, row_stride, pos0, table, true);
}

}  // namespace stratum
