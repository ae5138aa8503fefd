// Tests for src/kernels/cpu/matmul: matmul_forward/backward against the PyTorch float64 golden
// file (HF Conv1D layout) with 1 and 2 BLAS threads, sgemm's transpose/leading-dimension
// arguments, a finite-difference check in double for dinp, dw and dbias, the null-pointer and
// accumulate contracts, and column_sum (float64 reference, accumulate, thread-count
// independence). GEMM itself depends on the BLAS thread count by design (matmul.h), so only
// column_sum gets the ThreadPool sweep.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct MatmulGrads {
  std::vector<float> dinp, dw, dbias;
};

std::vector<float> mm_forward(ThreadPool& pool, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>* bias, int M, int K, int N) {
  std::vector<float> out(static_cast<std::size_t>(M) * N, std::numeric_limits<float>::quiet_NaN());
  matmul_forward(pool, Precision::Fp32, out.data(), x.data(), w.data(), bias ? bias->data() : nullptr, M, K, N);
  return out;
}

MatmulGrads mm_backward(ThreadPool& pool, const std::vector<float>& dout, const std::vector<float>& x,
                        const std::vector<float>& w, int M, int K, int N) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // !accumulate: all overwritten
  MatmulGrads g{std::vector<float>(x.size(), nan), std::vector<float>(w.size(), nan), std::vector<float>(N, nan)};
  matmul_backward(pool, Precision::Fp32, g.dinp.data(), g.dw.data(), g.dbias.data(), dout.data(), x.data(), w.data(), M, K, N, false);
  return g;
}

// C (M,N) = op(A) op(B) in double for row-major A, B with leading dimensions.
std::vector<double> gemm_reference(bool ta, bool tb, int M, int N, int K, const std::vector<float>& A, int lda,
                                   const std::vector<float>& B, int ldb) {
  std::vector<double> C(static_cast<std::size_t>(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[static_cast<std::size_t>(k) * lda + i] : A[static_cast<std::size_t>(i) * lda + k];
        const double b = tb ? B[static_cast<std::size_t>(j) * ldb + k] : B[static_cast<std::size_t>(k) * ldb + j];
        C[static_cast<std::size_t>(i) * N + j] += a * b;
      }
  return C;
}

int blas_threads_now() {  // parsed from "... (core, N threads)"
  const std::string d = blas_describe();
  const std::size_t comma = d.rfind(", ");
  return comma == std::string::npos ? 0 : std::stoi(d.substr(comma + 2));
}

// M 10, K 24, N 40. Measured (1 and 2 BLAS threads): y 2.3e-7, dx 1.3e-7, dW 2.9e-7, db 1.8e-7.
// Bound 1e-5 (K = 24 products of O(1) values; a transposed W or a dropped bias is off by >0.1).
TEST(KernelMatmul, MatchesPytorchGolden) {
  test::GoldenFile g("matmul");
  const int M = 10, K = 24, N = 40;
  const auto x = g.f32("x", {2, 5, K}), W = g.f32("W", {K, N}), b = g.f32("b", {N}), dy = g.f32("dy", {2, 5, N});
  const int saved_threads = blas_threads_now();
  ASSERT_GE(saved_threads, 1) << blas_describe();
  ThreadPool pool(2);
  for (int blas_threads : {1, 2}) {
    blas_set_threads(blas_threads);
    EXPECT_NE(blas_describe().find(std::to_string(blas_threads) + " thread"), std::string::npos) << blas_describe();
    const std::string tag = "_blas" + std::to_string(blas_threads);
    expect_close(mm_forward(pool, x, W, &b, M, K, N), g.f32("y", {2, 5, N}), 1e-5, "y" + tag);
    const MatmulGrads grads = mm_backward(pool, dy, x, W, M, K, N);
    expect_close(grads.dinp, g.f32("dx", {2, 5, K}), 1e-5, "dx" + tag);
    expect_close(grads.dw, g.f32("dW", {K, N}), 1e-5, "dW" + tag);
    expect_close(grads.dbias, g.f32("db", {N}), 1e-5, "db" + tag);
  }
  blas_set_threads(saved_threads);
}

// All four transpose combinations with padded leading dimensions and alpha/beta.
// Measured <= 2.3e-7. Bound 1e-5.
TEST(KernelMatmul, SgemmTransposesAndLeadingDimensions) {
  const int M = 7, N = 9, K = 13, pad = 3;
  test::TestRng rng(51);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const auto A = rng.normal_f32(static_cast<std::size_t>(ta ? K : M) * lda);
      const auto B = rng.normal_f32(static_cast<std::size_t>(tb ? N : K) * ldb);
      const auto C0 = rng.normal_f32(static_cast<std::size_t>(M) * ldc);
      std::vector<float> C = C0;
      sgemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
      const std::vector<double> AB = gemm_reference(ta, tb, M, N, K, A, lda, B, ldb);
      std::vector<float> got;
      std::vector<double> want;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < ldc; ++j) {
          const std::size_t at = static_cast<std::size_t>(i) * ldc + j;
          got.push_back(C[at]);
          want.push_back(j < N ? 0.5 * AB[static_cast<std::size_t>(i) * N + j] + 2.0 * C0[at] : C0[at]);  // padding untouched
        }
      expect_close(got, want, 1e-5, std::string("sgemm_") + (ta ? "T" : "N") + (tb ? "T" : "N"));
    }
}

// J = sum w * (x W + b): linear in each argument, so central differences have no truncation
// error and h can be large: h = 0.25 leaves the float rounding of J (~sqrt(72) 1e-7 / 2h ~ 2e-6).
// Measured: dinp 1.0e-6, dw 1.3e-6, dbias 1.9e-7. Bound 2e-5 (a wrong transpose or a missing row in
// dbias is off by O(1)).
TEST(KernelMatmul, GradientsMatchFiniteDifferences) {
  const int M = 6, K = 20, N = 12;
  test::TestRng rng(52);
  auto x = rng.normal_f32(static_cast<std::size_t>(M) * K), w = rng.normal_f32(static_cast<std::size_t>(K) * N, 0.3);
  auto b = rng.normal_f32(N, 0.1);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(M) * N);
  const std::vector<double> weights(dout.begin(), dout.end());
  ThreadPool pool(2);
  auto objective = [&] { return test::weighted_sum(mm_forward(pool, x, w, &b, M, K, N), weights); };
  const MatmulGrads g = mm_backward(pool, dout, x, w, M, K, N);
  test::expect_grad_matches_fd(x, g.dinp, 0.25, 2e-5, "dinp", objective);
  test::expect_grad_matches_fd(w, g.dw, 0.25, 2e-5, "dw", objective);
  test::expect_grad_matches_fd(b, g.dbias, 0.25, 2e-5, "dbias", objective);
}

// Null bias in the forward; null dinp / dbias in the backward; accumulate adds to dw and dbias.
TEST(KernelMatmul, NullPointersAndAccumulate) {
  const int M = 5, K = 8, N = 70;
  test::TestRng rng(53);
  const auto x = rng.normal_f32(static_cast<std::size_t>(M) * K), w = rng.normal_f32(static_cast<std::size_t>(K) * N);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(M) * N);
  ThreadPool pool(2);
  expect_close(mm_forward(pool, x, w, nullptr, M, K, N), gemm_reference(false, false, M, N, K, x, K, w, N), 1e-5,
               "y_no_bias");

  const MatmulGrads fresh = mm_backward(pool, dout, x, w, M, K, N);
  const auto dw0 = rng.normal_f32(w.size()), db0 = rng.normal_f32(N);
  std::vector<float> dw = dw0, db = db0;
  matmul_backward(pool, Precision::Fp32, nullptr, dw.data(), db.data(), dout.data(), x.data(), w.data(), M, K, N, true);
  std::vector<double> dw_want(dw.size()), db_want(N);
  for (std::size_t i = 0; i < dw.size(); ++i) dw_want[i] = static_cast<double>(dw0[i]) + fresh.dw[i];
  for (int j = 0; j < N; ++j) db_want[j] = static_cast<double>(db0[j]) + fresh.dbias[j];
  expect_close(dw, dw_want, 1e-6, "dw_accumulated");
  for (int j = 0; j < N; ++j) EXPECT_EQ(db[j], db0[j] + fresh.dbias[j]) << "column_sum accumulate is exact, j=" << j;

  std::vector<float> dw_only(w.size(), std::numeric_limits<float>::quiet_NaN());
  matmul_backward(pool, Precision::Fp32, nullptr, dw_only.data(), nullptr, dout.data(), x.data(), w.data(), M, K, N, false);
  EXPECT_EQ(dw_only, fresh.dw);
}

// column_sum over rows in order: float64 reference (measured 2.8e-7 for 33 rows), exact
// accumulate, and thread-count independence (min 64 columns per range: N = 600 splits 3 ways and
// crosses the 256-column tile).
TEST(KernelMatmul, ColumnSum) {
  const int M = 33, N = 600;
  test::TestRng rng(54);
  const auto src = rng.normal_f32(static_cast<std::size_t>(M) * N, 1.0, 0.5);
  std::vector<double> want(N, 0.0);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) want[c] += src[static_cast<std::size_t>(r) * N + c];
  ThreadPool pool(2);
  std::vector<float> sums(N, std::numeric_limits<float>::quiet_NaN());
  column_sum(pool, sums.data(), src.data(), M, N, false);
  expect_close(sums, want, 1e-5, "column_sum");

  const auto base = rng.normal_f32(N);
  std::vector<float> acc = base;
  column_sum(pool, acc.data(), src.data(), M, N, true);
  for (int c = 0; c < N; ++c) ASSERT_EQ(acc[c], base[c] + sums[c]) << c;

  test::expect_thread_count_independent(
      [&](ThreadPool& p) {
        std::vector<float> out(N), out_acc = base;
        column_sum(p, out.data(), src.data(), M, N, false);
        column_sum(p, out_acc.data(), src.data(), M, N, true);
        return test::concat({&out, &out_acc});
      },
      "column_sum");
}

}  // namespace
}  // namespace stratum
