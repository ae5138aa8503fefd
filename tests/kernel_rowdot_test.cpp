// Tests for src/kernels/cpu/rowdot (Note [row dot products]): both forms against a float64
// product, with K, N and M off the tile sizes, strides and bias; every row's bits equal to that
// row computed alone (so a batch cannot change a sequence's logits); thread-count independence.
#include "kernels/cpu/rowdot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct Case {
  int M, N, K;
};

// y (M, N) from rowdot_nt (w (N, K)) or rowdot_kn (w (K, N)); x rows are ldx = K + 3 apart and y
// rows ldy = N + 5 apart for nt (the gaps must stay untouched).
std::vector<float> run(ThreadPool& pool, bool nt, const std::vector<float>& x, const std::vector<float>& w,
                       const float* bias, int M, int N, int K) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (nt) {
    const int ldx = K + 3, ldy = N + 5;
    std::vector<float> xs(static_cast<std::size_t>(M) * ldx, 7.0f), ys(static_cast<std::size_t>(M) * ldy, nan);
    for (int m = 0; m < M; ++m) std::memcpy(&xs[m * ldx], &x[m * K], K * sizeof(float));
    rowdot_nt(pool, ys.data(), ldy, xs.data(), ldx, w.data(), bias, M, N, K);
    std::vector<float> y(static_cast<std::size_t>(M) * N);
    for (int m = 0; m < M; ++m) {
      std::memcpy(&y[m * N], &ys[m * ldy], N * sizeof(float));
      for (int g = N; g < ldy; ++g) EXPECT_TRUE(std::isnan(ys[m * ldy + g])) << "wrote past row " << m;
    }
    return y;
  }
  std::vector<float> y(static_cast<std::size_t>(M) * N, nan);
  rowdot_kn(pool, y.data(), x.data(), w.data(), bias, M, K, N);
  return y;
}

std::vector<double> reference(bool nt, const std::vector<float>& x, const std::vector<float>& w, const float* bias,
                              int M, int N, int K) {
  std::vector<double> y(static_cast<std::size_t>(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = bias != nullptr ? bias[n] : 0.0;
      for (int k = 0; k < K; ++k)
        s += static_cast<double>(x[m * K + k]) * (nt ? w[static_cast<std::size_t>(n) * K + k] : w[static_cast<std::size_t>(k) * N + n]);
      y[m * N + n] = s;
    }
  return y;
}

TEST(KernelRowdot, MatchesFloat64AndEveryRowEqualsItselfAlone) {
  ThreadPool pool(2);
  for (bool nt : {true, false})
    for (const Case c : {Case{1, 1, 1}, Case{1, 67, 33}, Case{3, 9, 16}, Case{5, 130, 47}, Case{9, 6, 200}, Case{4, 64, 64}}) {
      for (bool with_bias : {false, true}) {
        const std::string what = std::string(nt ? "nt" : "kn") + " M" + std::to_string(c.M) + " N" +
                                 std::to_string(c.N) + " K" + std::to_string(c.K) + (with_bias ? " bias" : "");
        test::TestRng rng(c.M * 1000 + c.N * 10 + c.K);
        const std::vector<float> x = rng.normal_f32(static_cast<std::size_t>(c.M) * c.K);
        const std::vector<float> w = rng.normal_f32(static_cast<std::size_t>(c.N) * c.K, 0.1);
        const std::vector<float> b = rng.normal_f32(static_cast<std::size_t>(c.N));
        const float* bias = with_bias ? b.data() : nullptr;
        const std::vector<float> y = run(pool, nt, x, w, bias, c.M, c.N, c.K);
        expect_close(y, reference(nt, x, w, bias, c.M, c.N, c.K), 1e-5, what);
        for (int m = 0; m < c.M; ++m) {
          const std::vector<float> row(x.begin() + m * c.K, x.begin() + (m + 1) * c.K);
          const std::vector<float> alone = run(pool, nt, row, w, bias, 1, c.N, c.K);
          EXPECT_EQ(std::memcmp(alone.data(), &y[static_cast<std::size_t>(m) * c.N], c.N * sizeof(float)), 0)
              << what << ": row " << m << " differs from the same row alone";
        }
      }
    }
}

TEST(KernelRowdot, ThreadCountIndependent) {
  test::TestRng rng(5);
  const int M = 6, N = 300, K = 129;
  const std::vector<float> x = rng.normal_f32(static_cast<std::size_t>(M) * K);
  const std::vector<float> w = rng.normal_f32(static_cast<std::size_t>(N) * K);
  const std::vector<float> b = rng.normal_f32(N);
  test::expect_thread_count_independent([&](ThreadPool& pool) { return run(pool, true, x, w, b.data(), M, N, K); },
                                        "rowdot_nt");
  test::expect_thread_count_independent([&](ThreadPool& pool) { return run(pool, false, x, w, b.data(), M, N, K); },
                                        "rowdot_kn");
}

// Note [bf16 weights]: rowdot_nt_bf16 and rowdot_kn_bf16 equal rowdot_nt and rowdot_kn on the
// widened weights bit for bit, at every tile shape and tail (kn: N off its 64-column tiles, so
// the edge path runs too), including infinities and subnormals among the weights.
TEST(KernelRowdot, Bf16WeightsGiveTheBitsOfTheirWidening) {
  ThreadPool pool(2);
  for (const Case c : {Case{1, 1, 1}, Case{1, 67, 33}, Case{3, 9, 16}, Case{5, 130, 47}, Case{4, 64, 64}, Case{9, 7, 40},
                       Case{17, 33, 100}, Case{8, 2, 16}, Case{6, 200, 24}}) {
    test::TestRng rng(c.M * 7 + c.N * 3 + c.K);
    const std::vector<float> x = rng.normal_f32(static_cast<std::size_t>(c.M) * c.K);
    const std::vector<float> src = rng.normal_f32(static_cast<std::size_t>(c.N) * c.K, 0.1);
    const std::vector<std::uint16_t> h = test::bf16_truncate(src, 97);  // with subnormals
    std::vector<float> wide(src.size());
    bf16_widen(wide.data(), h.data(), h.size());
    const std::vector<float> b = rng.normal_f32(static_cast<std::size_t>(c.N));
    for (const float* bias : {static_cast<const float*>(nullptr), b.data()}) {
      std::vector<float> want(static_cast<std::size_t>(c.M) * c.N), got(want.size());
      rowdot_nt(pool, want.data(), c.N, x.data(), c.K, wide.data(), bias, c.M, c.N, c.K);
      rowdot_nt_bf16(pool, got.data(), c.N, x.data(), c.K, h.data(), bias, c.M, c.N, c.K);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "nt M" << c.M << " N" << c.N << " K" << c.K << (bias ? " bias" : "");
      // The same numbers as a (K, N) weight.
      rowdot_kn(pool, want.data(), x.data(), wide.data(), bias, c.M, c.K, c.N);
      rowdot_kn_bf16(pool, got.data(), x.data(), h.data(), bias, c.M, c.K, c.N);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "kn M" << c.M << " N" << c.N << " K" << c.K << (bias ? " bias" : "");
    }
  }
}

}  // namespace
}  // namespace stratum
