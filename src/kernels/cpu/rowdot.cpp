// rowdot_nt / rowdot_kn; see rowdot.h and Note [row dot products]. Register tiles of output
// elements share the loads of their rows; the tile shape changes speed, never bits.
#include "kernels/cpu/rowdot.h"

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/simd.h"

namespace stratum {

namespace {
using simd::kLanes;

// MB x NB outputs of rowdot_nt: x rows m0.., w rows n0...
template <int MB, int NB>
STRATUM_SIMD_CLONES void nt_tile(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int K) {
  float acc[MB][NB][kLanes] = {};
  int k = 0;
  for (; k + kLanes <= K; k += kLanes)
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NB; ++n)
        for (int l = 0; l < kLanes; ++l)
          acc[m][n][l] += x[static_cast<std::size_t>(m) * ldx + k + l] * w[static_cast<std::size_t>(n) * K + k + l];
  for (int l = 0; k + l < K; ++l)
    for (int m = 0; m < MB; ++m)
      for (int n = 0; n < NB; ++n)
        acc[m][n][l] += x[static_cast<std::size_t>(m) * ldx + k + l] * w[static_cast<std::size_t>(n) * K + k + l];
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) {
      const float dot = simd::lanes_sum(acc[m][n]);
      y[static_cast<std::size_t>(m) * ldy + n] = bias != nullptr ? dot + bias[n] : dot;
    }
}

template <int NB>
void nt_rows(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M, int K, int n) {
  const float* wn = w + static_cast<std::size_t>(n) * K;
  const float* bn = bias != nullptr ? bias + n : nullptr;
  int m = 0;
  for (; m + 4 <= M; m += 4) nt_tile<4, NB>(y + static_cast<std::size_t>(m) * ldy + n, ldy, x + static_cast<std::size_t>(m) * ldx, ldx, wn, bn, K);
  for (; m < M; ++m) nt_tile<1, NB>(y + static_cast<std::size_t>(m) * ldy + n, ldy, x + static_cast<std::size_t>(m) * ldx, ldx, wn, bn, K);
}

// MB rows x kCols columns [n, n + width) of rowdot_kn.
constexpr int kCols = 64;
template <int MB>
STRATUM_SIMD_CLONES void kn_tile(float* y, const float* x, const float* w, const float* bias, int K, int N, int n,
                                 int width) {
  float acc[MB][kCols] = {};
  for (int k = 0; k < K; ++k) {
    const float* wk = w + static_cast<std::size_t>(k) * N + n;
    for (int m = 0; m < MB; ++m) {
      const float xv = x[static_cast<std::size_t>(m) * K + k];
      if (width == kCols)
        for (int c = 0; c < kCols; ++c) acc[m][c] += xv * wk[c];
      else
        for (int c = 0; c < width; ++c) acc[m][c] += xv * wk[c];
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < width; ++c)
      y[static_cast<std::size_t>(m) * N + n + c] = bias != nullptr ? acc[m][c] + bias[n + c] : acc[m][c];
}
}  // namespace

void rowdot_nt(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M,
               int N, int K) {
  constexpr int kNb = 4;
  const std::size_t tiles = static_cast<std::size_t>(N + kNb - 1) / kNb;
  pool.parallel_for(tiles, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) {
      const int n = static_cast<int>(t) * kNb;
      if (n + kNb <= N) {
        nt_rows<kNb>(y, ldy, x, ldx, w, bias, M, K, n);
      } else {
        for (int j = n; j < N; ++j) nt_rows<1>(y, ldy, x, ldx, w, bias, M, K, j);
      }
    }
  }, 4);
}

void rowdot_kn(ThreadPool& pool, float* y, const float* x, const float* w, const float* bias, int M, int K, int N) {
  const std::size_t tiles = static_cast<std::size_t>(N + kCols - 1) / kCols;
  pool.parallel_for(tiles, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) {
      const int n = static_cast<int>(t) * kCols, width = std::min(kCols, N - n);
      int m = 0;
      for (; m + 4 <= M; m += 4)
        kn_tile<4>(y + static_cast<std::size_t>(m) * N, x + static_cast<std::size_t>(m) * K, w, bias, K, N, n, width);
      for (; m < M; ++m)
        kn_tile<1>(y + static_cast<std::size_t>(m) * N, x + static_cast<std::size_t>(m) * K, w, bias, K, N, n, width);
    }
  }, 2);
}

}  // namespace stratum
