// rowdot_nt / rowdot_kn; see rowdot.h and Note [row dot products]. Register tiles of output
// elements share the loads of their rows; the tile shape changes speed, never bits.
#include "kernels/cpu/rowdot.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/bf16.h"
#include "core/simd.h"

namespace stratum {

namespace {
using simd::kLanes;
// kLanes floats as one GCC vector: the accumulators stay in registers (an array of floats was
// kept on the stack, each add waiting on a store: half the memory bandwidth). Lane-wise +
// and * are the same IEEE operations on every ISA clone (one zmm, two ymm or four xmm).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

#pragma GCC diagnostic ignored "-Wpsabi"  // Lanes never crosses a call: load() is always inlined
__attribute__((always_inline)) inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
// kLanes bfloat16 weights widened to fp32 (exact: the bf16 bits are the float's upper half), so
// a bf16 weight gives the bits of its fp32 widening in every product (Note [bf16 weights]).
typedef std::uint16_t Halves __attribute__((vector_size(kLanes * sizeof(std::uint16_t))));
typedef std::uint32_t Words __attribute__((vector_size(kLanes * sizeof(std::uint32_t))));
__attribute__((always_inline)) inline Lanes load(const std::uint16_t* p) {
  Halves h;
  __builtin_memcpy(&h, p, sizeof h);
  const Words bits = __builtin_convertvector(h, Words) << 16;
  Lanes v;
  __builtin_memcpy(&v, &bits, sizeof v);
  return v;
}

// MB x NB outputs of rowdot_nt: x rows m0.., w rows n0...
template <int MB, int NB, typename W>
STRATUM_SIMD_CLONES void nt_tile(float* y, int ldy, const float* x, int ldx, const W* w, const float* bias, int K) {
  Lanes acc[MB][NB];
#pragma GCC unroll 16
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
    for (int n = 0; n < NB; ++n) acc[m][n] = Lanes{};
  int k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    Lanes xv[MB];
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) xv[m] = load(x + static_cast<std::size_t>(m) * ldx + k);
#pragma GCC unroll 16
    for (int n = 0; n < NB; ++n) {
      const Lanes wv = load(w + static_cast<std::size_t>(n) * K + k);
#pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) acc[m][n] += xv[m] * wv;
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB; ++n) {
      float lanes[kLanes];
      __builtin_memcpy(lanes, &acc[m][n], sizeof lanes);
      for (int l = 0; k + l < K; ++l)  // the tail: element k + l to lane l
        lanes[l] += x[static_cast<std::size_t>(m) * ldx + k + l] * to_f32(w[static_cast<std::size_t>(n) * K + k + l]);
      const float dot = simd::lanes_sum(lanes);
      y[static_cast<std::size_t>(m) * ldy + n] = bias != nullptr ? dot + bias[n] : dot;
    }
}

template <int NB, typename W>
void nt_rows(float* y, int ldy, const float* x, int ldx, const W* w, const float* bias, int M, int K, int n) {
  const W* wn = w + static_cast<std::size_t>(n) * K;
  const float* bn = bias != nullptr ? bias + n : nullptr;
  int m = 0;
  for (; m + 4 <= M; m += 4) nt_tile<4, NB, W>(y + static_cast<std::size_t>(m) * ldy + n, ldy, x + static_cast<std::size_t>(m) * ldx, ldx, wn, bn, K);
  for (; m < M; ++m) nt_tile<1, NB, W>(y + static_cast<std::size_t>(m) * ldy + n, ldy, x + static_cast<std::size_t>(m) * ldx, ldx, wn, bn, K);
}

// MB rows x kCols columns [n, n + kCols) of rowdot_kn (a narrower last tile goes through
// kn_edge: the same per-element order).
constexpr int kColVecs = 4;
constexpr int kCols = kColVecs * kLanes;
template <int MB, typename W>
STRATUM_SIMD_CLONES void kn_tile(float* y, const float* x, const W* w, const float* bias, int K, int N, int n) {
  Lanes acc[MB][kColVecs];
#pragma GCC unroll 16
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
    for (int c = 0; c < kColVecs; ++c) acc[m][c] = Lanes{};
  for (int k = 0; k < K; ++k) {
    const W* wk = w + static_cast<std::size_t>(k) * N + n;
    Lanes wv[kColVecs];
#pragma GCC unroll 16
    for (int c = 0; c < kColVecs; ++c) wv[c] = load(wk + c * kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      const float xs = x[static_cast<std::size_t>(m) * K + k];
#pragma GCC unroll 16
      for (int c = 0; c < kColVecs; ++c) acc[m][c] += xs * wv[c];
    }
  }
  for (int m = 0; m < MB; ++m) {
    float out[kCols];
    __builtin_memcpy(out, acc[m], sizeof out);
    for (int c = 0; c < kCols; ++c)
      y[static_cast<std::size_t>(m) * N + n + c] = bias != nullptr ? out[c] + bias[n + c] : out[c];
  }
}

template <typename W>
void kn_edge(float* y, const float* x, const W* w, const float* bias, int M, int K, int N, int n, int width) {
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < width; ++c) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k)
        acc += x[static_cast<std::size_t>(m) * K + k] * to_f32(w[static_cast<std::size_t>(k) * N + n + c]);
      y[static_cast<std::size_t>(m) * N + n + c] = bias != nullptr ? acc + bias[n + c] : acc;
    }
}
}  // namespace

// Tiles of weight rows are handed out from a shared counter, a few per thread, so a thread that
// a noisy neighbour slows does not hold the whole product back (decoding is memory-bound and
// both threads stream). Which thread computes a tile never changes its bits (Note [row dot
// products]), so this dynamic split keeps the results deterministic.
namespace {
template <typename W>
void nt_run(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const W* w, const float* bias, int M, int N,
            int K) {
  // One weight row per tile when there are few rows (one stream per thread reads memory fastest:
  // 1.1B Llama batch 1 at 7.9-9.4 tokens/s vs 6.6-8.3 with four), four when rows reuse them.
  const int nb = M < 4 ? 1 : 4;
  const std::size_t tiles = static_cast<std::size_t>(N + nb - 1) / nb;
  const std::size_t grain = std::max<std::size_t>(1, tiles / (8 * static_cast<std::size_t>(pool.num_threads())));
  std::atomic<std::size_t> next{0};
  pool.parallel_for(static_cast<std::size_t>(pool.num_threads()), [&](std::size_t, std::size_t) {
    for (;;) {
      const std::size_t t0 = next.fetch_add(grain, std::memory_order_relaxed);
      if (t0 >= tiles) return;
      for (std::size_t t = t0; t < std::min(tiles, t0 + grain); ++t) {
        const int n = static_cast<int>(t) * nb;
        if (nb == 4 && n + 4 <= N) {
          nt_rows<4>(y, ldy, x, ldx, w, bias, M, K, n);
        } else {
          for (int j = n; j < std::min(N, n + nb); ++j) nt_rows<1>(y, ldy, x, ldx, w, bias, M, K, j);
        }
      }
    }
  });
}
}  // namespace

void rowdot_nt(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M,
               int N, int K) {
  nt_run(pool, y, ldy, x, ldx, w, bias, M, N, K);
}

void rowdot_nt_bf16(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, const std::uint16_t* w,
                    const float* bias, int M, int N, int K) {
  nt_run(pool, y, ldy, x, ldx, w, bias, M, N, K);
}

namespace {
template <typename W>
void kn_run(ThreadPool& pool, float* y, const float* x, const W* w, const float* bias, int M, int K, int N) {
  const std::size_t tiles = static_cast<std::size_t>(N + kCols - 1) / kCols;
  pool.parallel_for(tiles, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) {
      const int n = static_cast<int>(t) * kCols;
      if (n + kCols > N) {
        kn_edge(y, x, w, bias, M, K, N, n, N - n);
        continue;
      }
      int m = 0;
      for (; m + 4 <= M; m += 4)
        kn_tile<4, W>(y + static_cast<std::size_t>(m) * N, x + static_cast<std::size_t>(m) * K, w, bias, K, N, n);
      for (; m < M; ++m)
        kn_tile<1, W>(y + static_cast<std::size_t>(m) * N, x + static_cast<std::size_t>(m) * K, w, bias, K, N, n);
    }
  }, 2);
}
}  // namespace

void rowdot_kn(ThreadPool& pool, float* y, const float* x, const float* w, const float* bias, int M, int K, int N) {
  kn_run(pool, y, x, w, bias, M, K, N);
}

void rowdot_kn_bf16(ThreadPool& pool, float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                    int N) {
  kn_run(pool, y, x, w, bias, M, K, N);
}

}  // namespace stratum
