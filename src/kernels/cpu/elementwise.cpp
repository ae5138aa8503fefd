// Residual add, sum of squares and bf16 widening; see elementwise.h.
#include "kernels/cpu/elementwise.h"

#include <vector>

#include "core/bf16.h"
#include "core/simd.h"

namespace stratum {

namespace {
constexpr std::size_t kChunk = 65536;

STRATUM_SIMD_CLONES
void add_range(float* out, const float* a, const float* b, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
}

STRATUM_SIMD_CLONES
void widen_range(float* out, const std::uint16_t* in, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) out[i] = bf16_to_f32(in[i]);
}

STRATUM_SIMD_CLONES
double sum_squares_chunk(const float* x, std::size_t n) {
  double acc[simd::kLanes] = {};
  std::size_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes)
    for (int l = 0; l < simd::kLanes; ++l) {
      const double v = x[i + l];
      acc[l] += v * v;
    }
  for (int l = 0; i < n; ++i, ++l) {
    const double v = x[i];
    acc[l] += v * v;
  }
  return simd::lanes_sum(acc);
}
}  // namespace

void add_f32(ThreadPool& pool, float* out, const float* a, const float* b, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { add_range(out, a, b, i0, i1); }, 8192);
}

double sum_squares(ThreadPool& pool, const float* x, std::size_t n) {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  pool.parallel_for(chunks, [&](std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c) {
      const std::size_t begin = c * kChunk;
      const std::size_t len = std::min(kChunk, n - begin);
      partial[c] = sum_squares_chunk(x + begin, len);
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void bf16_widen_f32(ThreadPool& pool, float* out, const std::uint16_t* in, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { widen_range(out, in, i0, i1); }, kChunk);
}

}  // namespace stratum
