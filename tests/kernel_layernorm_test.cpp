// Tests for src/kernels/cpu/layernorm: forward/backward against the PyTorch float64 golden file
// and a float64 reference at a shape with lane remainders and several column tiles, a
// finite-difference gradient check in double for dinp, dw and db, the += / = contracts of the
// backward, and thread-count independence (Note [deterministic partition]).
#include "kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct LnOut {
  std::vector<float> out, mean, rstd;
};

LnOut ln_forward(ThreadPool& pool, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& b, int N, int C, float eps) {
  LnOut r{std::vector<float>(static_cast<std::size_t>(N) * C), std::vector<float>(N), std::vector<float>(N)};
  layernorm_forward(pool, r.out.data(), r.mean.data(), r.rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  return r;
}

struct LnGrads {
  std::vector<float> dx, dw, db;
};

LnGrads ln_backward(ThreadPool& pool, const std::vector<float>& dout, const std::vector<float>& x,
                    const std::vector<float>& w, const LnOut& fwd, int N, int C) {
  LnGrads g{std::vector<float>(static_cast<std::size_t>(N) * C, 0.0f), std::vector<float>(C), std::vector<float>(C)};
  layernorm_backward(pool, g.dx.data(), g.dw.data(), g.db.data(), dout.data(), x.data(), w.data(), fwd.mean.data(),
                     fwd.rstd.data(), N, C, false);
  return g;
}

// Float64 LayerNorm forward + backward (PyTorch semantics), written independently of the kernel.
struct LnRef {
  std::vector<double> out, mean, rstd, dx, dw, db;
};

LnRef ln_reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                   const std::vector<float>& dout, int N, int C, double eps) {
  LnRef r;
  r.out.resize(x.size());
  r.dx.resize(x.size());
  r.mean.resize(N);
  r.rstd.resize(N);
  r.dw.assign(C, 0.0);
  r.db.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* xr = x.data() + static_cast<std::size_t>(n) * C;
    const float* dy = dout.data() + static_cast<std::size_t>(n) * C;
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += xr[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + eps);
    r.mean[n] = m;
    r.rstd[n] = s;
    double sum_g = 0.0, sum_gx = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * s;
      r.out[static_cast<std::size_t>(n) * C + c] = xhat * w[c] + b[c];
      r.dw[c] += dy[c] * xhat;
      r.db[c] += dy[c];
      sum_g += static_cast<double>(w[c]) * dy[c];
      sum_gx += static_cast<double>(w[c]) * dy[c] * xhat;
    }
    for (int c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * s;
      r.dx[static_cast<std::size_t>(n) * C + c] = s * (static_cast<double>(w[c]) * dy[c] - sum_g / C - xhat * sum_gx / C);
    }
  }
  return r;
}

// Measured (Release, AVX-512 clone; scaled error |got-ref|/(1+|ref|)): out 2.0e-7, mean 4.6e-8,
// rstd 4.1e-8, dx 1.2e-7, dw 5.8e-7, db 1.3e-7. Bound 1e-5 (the suggested 1e-5 (1+|ref|)):
// 17x above the worst, far below e.g. an unbiased variance (rstd off by 1%).
TEST(KernelLayernorm, MatchesPytorchGolden) {
  test::GoldenFile g("layernorm");
  const int N = 10, C = 48;
  const auto x = g.f32("x", {2, 5, C}), w = g.f32("w", {C}), b = g.f32("b", {C}), dout = g.f32("dout", {2, 5, C});
  const float eps = static_cast<float>(g.meta("eps"));
  ThreadPool pool(2);
  const LnOut fwd = ln_forward(pool, x, w, b, N, C, eps);
  expect_close(fwd.out, g.f32("out", {2, 5, C}), 1e-5, "out");
  expect_close(fwd.mean, g.f32("mean", {2, 5}), 1e-5, "mean");
  expect_close(fwd.rstd, g.f32("rstd", {2, 5}), 1e-5, "rstd");
  const LnGrads grads = ln_backward(pool, dout, x, w, fwd, N, C);
  expect_close(grads.dx, g.f32("dx", {2, 5, C}), 1e-5, "dx");
  expect_close(grads.dw, g.f32("dw", {C}), 1e-5, "dw");
  expect_close(grads.db, g.f32("db", {C}), 1e-5, "db");
}

// C = 300: two 16-lane remainders' worth of tail (300 = 18*16 + 12) and three 128-column tiles
// in the parameter-gradient kernel; N = 37 rows split unevenly over threads.
// Measured: out 1.7e-7, mean 8.3e-8, rstd 3.2e-8, dx 9.0e-8, dw 1.1e-6, db 8.3e-7 (sums of 37
// rows). Bound 1e-5.
TEST(KernelLayernorm, MatchesFloat64ReferenceAtOddShape) {
  const int N = 37, C = 300;
  test::TestRng rng(11);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 3.0, -1.0);
  const auto w = rng.normal_f32(C, 0.2, 1.0), b = rng.normal_f32(C, 0.2);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  ThreadPool pool(2);
  const LnOut fwd = ln_forward(pool, x, w, b, N, C, 1e-5f);
  const LnGrads grads = ln_backward(pool, dout, x, w, fwd, N, C);
  const LnRef ref = ln_reference(x, w, b, dout, N, C, 1e-5);
  expect_close(fwd.out, ref.out, 1e-5, "out");
  expect_close(fwd.mean, ref.mean, 1e-5, "mean");
  expect_close(fwd.rstd, ref.rstd, 1e-5, "rstd");
  expect_close(grads.dx, ref.dx, 1e-5, "dx");
  expect_close(grads.dw, ref.dw, 1e-5, "dw");
  expect_close(grads.db, ref.db, 1e-5, "db");
}

// J = sum w_ij out_ij, float forward, differences in double, h = 1e-2. Error budget: truncation
// h^2/6 |J'''| ~ 1e-5, float rounding of J ~ sqrt(120) * 6e-8 / 2h ~ 3e-5.
// Measured: dx 5.6e-5, dw 3.5e-6, db 4.7e-6. Bound 3e-4 (a wrong sign or a missing
// mean-subtraction term gives errors of order 1e-1).
TEST(KernelLayernorm, GradientsMatchFiniteDifferences) {
  const int N = 6, C = 20;
  test::TestRng rng(12);
  auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 2.0, 0.5);
  auto w = rng.normal_f32(C, 0.1, 1.0), b = rng.normal_f32(C, 0.1);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(N) * C);  // the weights of J, exact in float
  const std::vector<double> weights(dout.begin(), dout.end());
  ThreadPool pool(2);
  auto objective = [&] { return test::weighted_sum(ln_forward(pool, x, w, b, N, C, 1e-5f).out, weights); };
  const LnGrads grads = ln_backward(pool, dout, x, w, ln_forward(pool, x, w, b, N, C, 1e-5f), N, C);
  test::expect_grad_matches_fd(x, grads.dx, 1e-2, 3e-4, "dx", objective);
  test::expect_grad_matches_fd(w, grads.dw, 1e-2, 3e-4, "dw", objective);
  test::expect_grad_matches_fd(b, grads.db, 1e-2, 3e-4, "db", objective);
}

// dinp always accumulates; dw/db overwrite unless accumulate_params, then accumulate. The float
// additions are the kernel's own last step, so the results are exact sums of the fresh grads.
TEST(KernelLayernorm, BackwardAccumulationContract) {
  const int N = 5, C = 33;
  test::TestRng rng(13);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C), w = rng.normal_f32(C, 0.1, 1.0);
  const auto b = rng.normal_f32(C), dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  ThreadPool pool(2);
  const LnOut fwd = ln_forward(pool, x, w, b, N, C, 1e-5f);
  const LnGrads fresh = ln_backward(pool, dout, x, w, fwd, N, C);

  const auto dx0 = rng.normal_f32(x.size()), dw0 = rng.normal_f32(C), db0 = rng.normal_f32(C);
  std::vector<float> dx = dx0, dw = dw0, db = db0;
  layernorm_backward(pool, dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), fwd.mean.data(),
                     fwd.rstd.data(), N, C, true);
  for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], dx0[i] + fresh.dx[i]) << "dinp must accumulate, i=" << i;
  for (int c = 0; c < C; ++c) {
    ASSERT_EQ(dw[c], dw0[c] + fresh.dw[c]) << "dw must accumulate, c=" << c;
    ASSERT_EQ(db[c], db0[c] + fresh.db[c]) << "db must accumulate, c=" << c;
  }

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dx_zero(x.size(), 0.0f), dw_nan(C, nan), db_nan(C, nan);
  layernorm_backward(pool, dx_zero.data(), dw_nan.data(), db_nan.data(), dout.data(), x.data(), w.data(),
                     fwd.mean.data(), fwd.rstd.data(), N, C, false);
  EXPECT_EQ(dw_nan, fresh.dw) << "dw must be overwritten when !accumulate_params";
  EXPECT_EQ(db_nan, fresh.db) << "db must be overwritten when !accumulate_params";
}

// Rows: min 8 per range, columns: min 32 per range; N = 37, C = 300 split for 2 and 3 threads.
TEST(KernelLayernorm, ThreadCountIndependent) {
  const int N = 37, C = 300;
  test::TestRng rng(14);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 2.0), w = rng.normal_f32(C, 0.1, 1.0);
  const auto b = rng.normal_f32(C), dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const LnOut fwd = ln_forward(pool, x, w, b, N, C, 1e-5f);
        const LnGrads g = ln_backward(pool, dout, x, w, fwd, N, C);
        return test::concat({&fwd.out, &fwd.mean, &fwd.rstd, &g.dx, &g.dw, &g.db});
      },
      "layernorm");
}

}  // namespace
}  // namespace stratum
