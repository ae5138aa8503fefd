// Tests for src/kernels/cpu/swiglu (silu(gate) * up, and Gemma's GeGLU gelu_tanh(gate) * up):
// forward/backward against a float64 formula, a finite-difference check in double for dgate and
// dup, the overwrite contract and the in-place form (dgate == dout), and thread-count
// independence (Note [deterministic partition]).
#include "kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

// The gated activations' kernels (SwiGLU's, GeGLU's) as the helpers below take them.
using GluForward = void (*)(ThreadPool&, float*, const float*, const float*, std::size_t);
using GluBackward = void (*)(ThreadPool&, float*, float*, const float*, const float*, const float*, std::size_t);

std::vector<float> glu_fwd(ThreadPool& pool, const std::vector<float>& gate, const std::vector<float>& up,
                           GluForward kernel) {
  std::vector<float> out(gate.size(), std::numeric_limits<float>::quiet_NaN());  // must be overwritten
  kernel(pool, out.data(), gate.data(), up.data(), gate.size());
  return out;
}

struct SwigluGrads {
  std::vector<float> dgate, dup;
};

SwigluGrads glu_bwd(ThreadPool& pool, const std::vector<float>& dout, const std::vector<float>& gate,
                    const std::vector<float>& up, GluBackward kernel) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // must be overwritten
  SwigluGrads g{std::vector<float>(gate.size(), nan), std::vector<float>(gate.size(), nan)};
  kernel(pool, g.dgate.data(), g.dup.data(), dout.data(), gate.data(), up.data(), gate.size());
  return g;
}

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double silu_grad_ref(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s + x * s * (1.0 - s);
}

// Gates of several magnitudes including |x| up to 100 (exp clamps in simd::exp_f32: silu(-100)
// comes out ~-3e-37 instead of -4e-42, both 0 at this scale) and signed zeros.
// Measured (scaled error): out 1.3e-7, dgate 4.7e-7, dup 1.3e-7. Bound 2e-6 (silu = sigmoid,
// or the derivative without the x (1 - sig) term, is off by > 1e-1).
TEST(KernelSwiglu, MatchesFloat64Formula) {
  test::TestRng rng(51);
  std::vector<float> gate = rng.normal_f32(5000, 3.0);
  for (int i = 0; i < 200; ++i) gate.push_back(static_cast<float>(rng.uniform(-100.0, 100.0)));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 88.0f, -88.0f, 90.0f, -90.0f}) gate.push_back(v);
  const std::vector<float> up = rng.normal_f32(gate.size(), 2.0), dout = rng.normal_f32(gate.size());
  std::vector<double> out_ref(gate.size()), dgate_ref(gate.size()), dup_ref(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    out_ref[i] = silu_ref(gate[i]) * up[i];
    dgate_ref[i] = static_cast<double>(dout[i]) * up[i] * silu_grad_ref(gate[i]);
    dup_ref[i] = static_cast<double>(dout[i]) * silu_ref(gate[i]);
  }
  ThreadPool pool(2);
  expect_close(glu_fwd(pool, gate, up, swiglu_forward), out_ref, 2e-6, "out");
  const SwigluGrads g = glu_bwd(pool, dout, gate, up, swiglu_backward);
  expect_close(g.dgate, dgate_ref, 2e-6, "dgate");
  expect_close(g.dup, dup_ref, 2e-6, "dup");
}

// J = sum w_i silu(g_i) u_i with float forward, central differences in double, h = 1e-2.
// Budget: truncation h^2/6 |silu'''| |u| ~ 3e-5, rounding ~3e-5. Measured: dgate 9.2e-6,
// dup 3.5e-6. Bound 2e-4.
TEST(KernelSwiglu, GradientsMatchFiniteDifferences) {
  test::TestRng rng(52);
  std::vector<float> gate = rng.normal_f32(64, 2.0), up = rng.normal_f32(64);
  const std::vector<float> w = rng.normal_f32(gate.size());
  const std::vector<double> weights(w.begin(), w.end());
  ThreadPool pool(2);
  const SwigluGrads g = glu_bwd(pool, w, gate, up, swiglu_backward);
  auto objective = [&] { return test::weighted_sum(glu_fwd(pool, gate, up, swiglu_forward), weights); };
  test::expect_grad_matches_fd(gate, g.dgate, 1e-2, 2e-4, "dgate", objective);
  test::expect_grad_matches_fd(up, g.dup, 1e-2, 2e-4, "dup", objective);
}

// dgate may be dout itself (in place); so may dup. Results must equal the out-of-place ones.
TEST(KernelSwiglu, BackwardInPlace) {
  test::TestRng rng(53);
  const std::vector<float> gate = rng.normal_f32(5003, 2.0), up = rng.normal_f32(5003), dout = rng.normal_f32(5003);
  ThreadPool pool(2);
  const SwigluGrads ref = glu_bwd(pool, dout, gate, up, swiglu_backward);
  std::vector<float> buf = dout, dup(dout.size());
  swiglu_backward(pool, buf.data(), dup.data(), buf.data(), gate.data(), up.data(), buf.size());
  EXPECT_EQ(buf, ref.dgate) << "dgate aliasing dout";
  EXPECT_EQ(dup, ref.dup) << "dgate aliasing dout";
  std::vector<float> dgate(dout.size());
  buf = dout;
  swiglu_backward(pool, dgate.data(), buf.data(), buf.data(), gate.data(), up.data(), buf.size());
  EXPECT_EQ(dgate, ref.dgate) << "dup aliasing dout";
  EXPECT_EQ(buf, ref.dup) << "dup aliasing dout";
}

// min 4096 elements per range: n = 20000 splits for 2 and 3 threads (and has a 16-lane tail).
TEST(KernelSwiglu, ThreadCountIndependent) {
  test::TestRng rng(54);
  const std::vector<float> gate = rng.normal_f32(20000, 3.0), up = rng.normal_f32(20000), dout = rng.normal_f32(20000);
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const auto out = glu_fwd(pool, gate, up, swiglu_forward);
        const SwigluGrads g = glu_bwd(pool, dout, gate, up, swiglu_backward);
        return test::concat({&out, &g.dgate, &g.dup});
      },
      "swiglu");
}

// GeGLU (Note [gemma] in model/model_config.h), the same contracts.
// torch's gelu(x, approximate="tanh") and its derivative, in double.
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Bounds: out and dup 2e-6; dgate 2e-5, as GELU's own dx (kernel_gelu_test): simd::tanh_f32 is
// exactly -1 below x ~ -4.5, where gelu'(x) ~ -1e-5 is then 0 (measured 9.8e-6 at element 1515).
// SwiGLU's silu in GeGLU's place is off by > 1e-1, exact erf GELU by > 1e-4.
TEST(KernelGeglu, MatchesFloat64Formula) {
  test::TestRng rng(55);
  std::vector<float> gate = rng.normal_f32(5000, 3.0);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 8.0f, -8.0f, 30.0f, -30.0f}) gate.push_back(v);
  const std::vector<float> up = rng.normal_f32(gate.size(), 2.0), dout = rng.normal_f32(gate.size());
  std::vector<double> out_ref(gate.size()), dgate_ref(gate.size()), dup_ref(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    out_ref[i] = gelu_tanh_ref(gate[i]) * up[i];
    dgate_ref[i] = static_cast<double>(dout[i]) * up[i] * gelu_tanh_grad_ref(gate[i]);
    dup_ref[i] = static_cast<double>(dout[i]) * gelu_tanh_ref(gate[i]);
  }
  ThreadPool pool(2);
  expect_close(glu_fwd(pool, gate, up, geglu_forward), out_ref, 2e-6, "out");
  const SwigluGrads g = glu_bwd(pool, dout, gate, up, geglu_backward);
  expect_close(g.dgate, dgate_ref, 2e-5, "dgate");
  expect_close(g.dup, dup_ref, 2e-6, "dup");
}

TEST(KernelGeglu, GradientsMatchFiniteDifferences) {
  test::TestRng rng(56);
  std::vector<float> gate = rng.normal_f32(64, 2.0), up = rng.normal_f32(64);
  const std::vector<float> w = rng.normal_f32(gate.size());
  const std::vector<double> weights(w.begin(), w.end());
  ThreadPool pool(2);
  const SwigluGrads g = glu_bwd(pool, w, gate, up, geglu_backward);
  auto objective = [&] { return test::weighted_sum(glu_fwd(pool, gate, up, geglu_forward), weights); };
  test::expect_grad_matches_fd(gate, g.dgate, 1e-2, 2e-4, "dgate", objective);
  test::expect_grad_matches_fd(up, g.dup, 1e-2, 2e-4, "dup", objective);
}

TEST(KernelGeglu, BackwardInPlaceAndThreadCountIndependent) {
  test::TestRng rng(57);
  const std::vector<float> gate = rng.normal_f32(20000, 3.0), up = rng.normal_f32(20000), dout = rng.normal_f32(20000);
  ThreadPool pool(2);
  const SwigluGrads ref = glu_bwd(pool, dout, gate, up, geglu_backward);
  std::vector<float> buf = dout, dup(dout.size());
  geglu_backward(pool, buf.data(), dup.data(), buf.data(), gate.data(), up.data(), buf.size());
  EXPECT_EQ(buf, ref.dgate) << "dgate aliasing dout";
  EXPECT_EQ(dup, ref.dup) << "dgate aliasing dout";
  test::expect_thread_count_independent(
      [&](ThreadPool& p) {
        const auto out = glu_fwd(p, gate, up, geglu_forward);
        const SwigluGrads g = glu_bwd(p, dout, gate, up, geglu_backward);
        return test::concat({&out, &g.dgate, &g.dup});
      },
      "geglu");
}

}  // namespace
}  // namespace stratum
