// Tests for src/kernels/cpu/rmsnorm (Hugging Face LlamaRMSNorm semantics): forward/backward
// against a float64 reference at a shape with lane remainders and several column tiles, a
// finite-difference gradient check in double for dinp and dw, the += / = contracts of the
// backward, and thread-count independence (Note [deterministic partition]); the per-head form
// (Note [qk norm] in model/llama_block.h) against the plain one on the gathered heads.
#include "kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct RmsOut {
  std::vector<float> out, rstd;
};

RmsOut rms_forward(ThreadPool& pool, const std::vector<float>& x, const std::vector<float>& w, int N, int C,
                   float eps) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // every element must be written
  RmsOut r{std::vector<float>(static_cast<std::size_t>(N) * C, nan), std::vector<float>(N, nan)};
  rmsnorm_forward(pool, r.out.data(), r.rstd.data(), x.data(), w.data(), N, C, eps);
  return r;
}

struct RmsGrads {
  std::vector<float> dx, dw;
};

RmsGrads rms_backward(ThreadPool& pool, const std::vector<float>& dout, const std::vector<float>& x,
                      const std::vector<float>& w, const RmsOut& fwd, int N, int C) {
  RmsGrads g{std::vector<float>(static_cast<std::size_t>(N) * C, 0.0f),
             std::vector<float>(C, std::numeric_limits<float>::quiet_NaN())};
  rmsnorm_backward(pool, g.dx.data(), g.dw.data(), dout.data(), x.data(), w.data(), fwd.rstd.data(), N, C, false);
  return g;
}

// Float64 RMSNorm forward + backward, written independently of the kernel:
// y_c = w_c x_c s, s = (sum x^2 / C + eps)^(-1/2); dy/dx by the product rule.
struct RmsRef {
  std::vector<double> out, rstd, dx, dw;
};

RmsRef rms_reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dout, int N,
                     int C, double eps) {
  RmsRef r{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(x.size()),
           std::vector<double>(C, 0.0)};
  for (int n = 0; n < N; ++n) {
    const float* xr = x.data() + static_cast<std::size_t>(n) * C;
    const float* dy = dout.data() + static_cast<std::size_t>(n) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double s = 1.0 / std::sqrt(ss / C + eps);
    r.rstd[n] = s;
    double dot = 0.0;  // sum_c w_c dy_c x_c
    for (int c = 0; c < C; ++c) {
      r.out[static_cast<std::size_t>(n) * C + c] = static_cast<double>(w[c]) * xr[c] * s;
      r.dw[c] += static_cast<double>(dy[c]) * xr[c] * s;
      dot += static_cast<double>(w[c]) * dy[c] * xr[c];
    }
    // ds/dx_j = -s^3 x_j / C
    for (int c = 0; c < C; ++c)
      r.dx[static_cast<std::size_t>(n) * C + c] = static_cast<double>(w[c]) * dy[c] * s - dot * s * s * s * xr[c] / C;
  }
  return r;
}

// C = 300: 16-lane remainder (300 = 18*16 + 12) and three 128-column tiles in the weight-gradient
// kernel; N = 37 rows split unevenly over threads; inputs off-centre (rmsnorm does not subtract
// the mean); eps 1e-5 and 0.5. Measured: out 1.1e-7, rstd 3.9e-8, dx 1.4e-7, dw 1.0e-6 (sums of
// 37 rows). Bound 1e-5 (a mean subtraction, or eps outside the sqrt with eps = 0.5, is off by > 1e-2).
TEST(KernelRmsnorm, MatchesFloat64ReferenceAtOddShape) {
  const int N = 37, C = 300;
  test::TestRng rng(41);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 1.5, 0.7);
  const auto w = rng.normal_f32(C, 0.2, 1.0), dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  ThreadPool pool(2);
  for (float eps : {1e-5f, 0.5f}) {
    const RmsOut fwd = rms_forward(pool, x, w, N, C, eps);
    const RmsGrads grads = rms_backward(pool, dout, x, w, fwd, N, C);
    const RmsRef ref = rms_reference(x, w, dout, N, C, eps);
    const std::string tag = eps < 0.1f ? " eps 1e-5" : " eps 0.5";
    expect_close(fwd.out, ref.out, 1e-5, "out" + tag);
    expect_close(fwd.rstd, ref.rstd, 1e-5, "rstd" + tag);
    expect_close(grads.dx, ref.dx, 1e-5, "dx" + tag);
    expect_close(grads.dw, ref.dw, 1e-5, "dw" + tag);
  }
}

// J = sum w_ij out_ij, float forward, differences in double, h = 1e-2. Error budget as for
// layernorm: truncation ~1e-5, float rounding of J ~3e-5. Measured: dx 3.1e-5, dw 4.2e-6.
// Bound 3e-4 (dropping the d rstd / dx term gives errors of order 1e-1).
TEST(KernelRmsnorm, GradientsMatchFiniteDifferences) {
  const int N = 6, C = 20;
  test::TestRng rng(42);
  auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 1.0, 0.3);
  auto w = rng.normal_f32(C, 0.3, 1.0);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(N) * C);  // the weights of J, exact in float
  const std::vector<double> weights(dout.begin(), dout.end());
  ThreadPool pool(2);
  auto objective = [&] { return test::weighted_sum(rms_forward(pool, x, w, N, C, 1e-5f).out, weights); };
  const RmsGrads grads = rms_backward(pool, dout, x, w, rms_forward(pool, x, w, N, C, 1e-5f), N, C);
  test::expect_grad_matches_fd(x, grads.dx, 1e-2, 3e-4, "dx", objective);
  test::expect_grad_matches_fd(w, grads.dw, 1e-2, 3e-4, "dw", objective);
}

// dinp always accumulates; dw overwrites unless accumulate_params, then accumulates. The float
// additions are the kernel's own last step, so the results are exact sums of the fresh grads.
TEST(KernelRmsnorm, BackwardAccumulationContract) {
  const int N = 5, C = 33;
  test::TestRng rng(43);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C), w = rng.normal_f32(C, 0.1, 1.0);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  ThreadPool pool(2);
  const RmsOut fwd = rms_forward(pool, x, w, N, C, 1e-5f);
  const RmsGrads fresh = rms_backward(pool, dout, x, w, fwd, N, C);

  const auto dx0 = rng.normal_f32(x.size()), dw0 = rng.normal_f32(C);
  std::vector<float> dx = dx0, dw = dw0;
  rmsnorm_backward(pool, dx.data(), dw.data(), dout.data(), x.data(), w.data(), fwd.rstd.data(), N, C, true);
  for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], dx0[i] + fresh.dx[i]) << "dinp must accumulate, i=" << i;
  for (int c = 0; c < C; ++c) ASSERT_EQ(dw[c], dw0[c] + fresh.dw[c]) << "dw must accumulate, c=" << c;
  for (float v : fresh.dw) ASSERT_FALSE(std::isnan(v)) << "dw must be overwritten when !accumulate_params";
}

// Rows: min 8 per range, columns: min 32 per range; N = 37, C = 300 split for 2 and 3 threads.
TEST(KernelRmsnorm, ThreadCountIndependent) {
  const int N = 37, C = 300;
  test::TestRng rng(44);
  const auto x = rng.normal_f32(static_cast<std::size_t>(N) * C, 2.0), w = rng.normal_f32(C, 0.1, 1.0);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(N) * C);
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const RmsOut fwd = rms_forward(pool, x, w, N, C, 1e-5f);
        const RmsGrads g = rms_backward(pool, dout, x, w, fwd, N, C);
        return test::concat({&fwd.out, &fwd.rstd, &g.dx, &g.dw});
      },
      "rmsnorm");
}

// Per-head RMSNorm (Qwen3's q_norm / k_norm): 7 token rows of 3 heads of 20 floats (a 16-lane
// remainder of 4), rows 77 floats apart (17 floats after the heads that it must not touch, as k
// and v follow q in qkv). Forward in place, and the backward in place from d out to d in: the
// plain kernel's bits on the 21 gathered heads (dinp zeroed: 0 + v is v), in any thread count.
TEST(KernelRmsnorm, PerHeadFormGivesThePlainKernelsBitsInPlace) {
  const int n = 7, heads = 3, hd = 20, ld = heads * hd + 17, N = n * heads;
  test::TestRng rng(45);
  const auto x = rng.normal_f32(static_cast<std::size_t>(n) * ld, 1.5, 0.4), w = rng.normal_f32(hd, 0.1, 1.0);
  const auto dout = rng.normal_f32(static_cast<std::size_t>(n) * ld);
  auto gather = [&](const std::vector<float>& rows) {
    std::vector<float> g;
    for (int t = 0; t < n; ++t) g.insert(g.end(), rows.begin() + t * ld, rows.begin() + t * ld + heads * hd);
    return g;
  };
  ThreadPool pool(2);
  const RmsOut plain = rms_forward(pool, gather(x), w, N, hd, 1e-6f);
  const RmsGrads plain_g = rms_backward(pool, gather(dout), gather(x), w, plain, N, hd);
  test::expect_thread_count_independent(
      [&](ThreadPool& p) {
        std::vector<float> y = x, rstd(N), d = dout, dw(hd, 7.0f);
        rmsnorm_heads_forward(p, y.data(), ld, rstd.data(), w.data(), n, heads, hd, 1e-6f);
        rmsnorm_heads_backward(p, d.data(), x.data(), ld, dw.data(), w.data(), rstd.data(), n, heads, hd, false);
        EXPECT_EQ(gather(y), plain.out);
        EXPECT_EQ(rstd, plain.rstd);
        EXPECT_EQ(gather(d), plain_g.dx);
        EXPECT_EQ(dw, plain_g.dw);
        int moved = 0;
        for (int t = 0; t < n; ++t)
          for (int c = heads * hd; c < ld; ++c)  // the gaps: untouched
            moved += y[t * ld + c] != x[t * ld + c] || d[t * ld + c] != dout[t * ld + c];
        EXPECT_EQ(moved, 0);
        std::vector<float> dw_acc(hd, 1.0f), d2 = dout;  // accumulate_params adds to dw
        rmsnorm_heads_backward(p, d2.data(), x.data(), ld, dw_acc.data(), w.data(), rstd.data(), n, heads, hd, true);
        for (int c = 0; c < hd; ++c) EXPECT_EQ(dw_acc[c], 1.0f + plain_g.dw[c]);
        return test::concat({&y, &rstd, &d, &dw});
      },
      "rmsnorm heads");
}

}  // namespace
}  // namespace stratum
