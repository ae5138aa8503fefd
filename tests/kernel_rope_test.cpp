// Tests for src/kernels/cpu/rope (rotate-half RoPE, Hugging Face Llama): inverse frequencies with
// no, linear and llama3 scaling against the formulas in double, the cos/sin tables' float32
// angle convention, the rotation against a float64 transcription of transformers'
// apply_rotary_pos_emb (strided rows, per-sequence start positions), position 0 = identity, the
// backward as the exact transpose (<rope(x), y> = <x, rope_backward(y)>) and by finite
// differences, argument errors, and thread-count independence.
#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "stratum/error.h"
#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

// 1 / theta^(2i/d) in double.
std::vector<double> inv_freq_ref(int head_dim, double theta) {
  std::vector<double> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) inv[i] = 1.0 / std::pow(theta, 2.0 * i / head_dim);
  return inv;
}

// transformers' _compute_llama3_parameters in double.
std::vector<double> llama3_ref(int head_dim, double theta, const RopeScaling& s) {
  std::vector<double> inv = inv_freq_ref(head_dim, theta);
  const double orig = s.original_max_position_embeddings;
  const double low_wl = orig / s.low_freq_factor, high_wl = orig / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wl) {
      f /= s.factor;
    } else if (wavelen >= high_wl) {
      const double sm = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - sm) * f / s.factor + sm * f;
    }
  }
  return inv;
}

// Largest |got/ref - 1|.
double max_rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double e = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(got[i] / ref[i] - 1.0));
  return e;
}

// Float rounding of the float32 steps (pow, 1/x, the band blend): a few ulp, 1 ulp = 6e-8.
// Measured: none 7.0e-8, linear 8.2e-8. Bound 5e-7 (a wrong exponent 2i/d -> i/d is off by 100%).
TEST(KernelRope, InvFreqMatchesFormula) {
  for (int d : {16, 64, 128}) {
    const std::vector<double> ref = inv_freq_ref(d, 10000.0);
    const std::vector<float> got = rope_inv_freq(d, 10000.0, RopeScaling{});
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LE(max_rel_err(got, ref), 5e-7) << "head_dim " << d;
    test::record_measured("none hd " + std::to_string(d), max_rel_err(got, ref));
  }
  RopeScaling linear;
  linear.type = RopeScaling::Type::Linear;
  linear.factor = 4.0;
  std::vector<double> ref = inv_freq_ref(64, 500000.0);
  for (double& f : ref) f /= 4.0;
  EXPECT_LE(max_rel_err(rope_inv_freq(64, 500000.0, linear), ref), 5e-7) << "linear";
  test::record_measured("linear", max_rel_err(rope_inv_freq(64, 500000.0, linear), ref));
}

// The brief's case (head_dim 16, theta 500000, factor 8, low 1, high 4, original 16): wavelength
// 2 pi of i = 0 lies in the medium band (4..16), every other one above 16 (divided by 8). A
// second configuration (original 64: bands 16 and 64) puts i = 0 in the high band (unchanged),
// i = 1 in the medium band and the rest in the low band. Hand check of case 1, i = 0: s =
// (16/2pi - 1)/3 = 0.5155, f = (1-s)/8 + s = 0.5761. Measured 8.2e-8. Bound 5e-7 (a wrong band
// is off by >= 10%).
TEST(KernelRope, InvFreqLlama3MatchesFormula) {
  RopeScaling s;
  s.type = RopeScaling::Type::Llama3;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 16;
  const std::vector<float> got = rope_inv_freq(16, 500000.0, s);
  const std::vector<double> ref = llama3_ref(16, 500000.0, s);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_NEAR(got[0], 0.5761, 1e-4);
  EXPECT_LE(max_rel_err(got, ref), 5e-7) << "original 16";
  test::record_measured("original 16", max_rel_err(got, ref));
  for (int i = 1; i < 8; ++i) EXPECT_NEAR(got[i] * 8.0 / std::pow(500000.0, -i / 8.0), 1.0, 5e-7) << i;

  s.original_max_position_embeddings = 64;
  const std::vector<float> got64 = rope_inv_freq(16, 500000.0, s);
  const std::vector<double> ref64 = llama3_ref(16, 500000.0, s);
  EXPECT_LE(max_rel_err(got64, ref64), 5e-7) << "original 64";
  test::record_measured("original 64", max_rel_err(got64, ref64));
  EXPECT_EQ(got64[0], 1.0f) << "high-frequency band unchanged";
  const double wavelen1 = 2.0 * std::numbers::pi * std::pow(500000.0, 1.0 / 8.0);
  ASSERT_TRUE(wavelen1 > 16.0 && wavelen1 < 64.0) << "i = 1 must be in the medium band";
  const double unscaled1 = std::pow(500000.0, -1.0 / 8.0);
  EXPECT_TRUE(got64[1] > unscaled1 / 8.0 * 1.01 && got64[1] < unscaled1 * 0.99) << "medium band is a blend";
  for (int i = 2; i < 8; ++i) EXPECT_NEAR(got64[i] * 8.0 / std::pow(500000.0, -i / 8.0), 1.0, 5e-7) << i;
}

// The table holds cos/sin of the float32 product inv_freq * pos (transformers' angles), so
// large positions follow the float angle, not the exact one. Checked for every entry against
// that definition (tolerance 1 ulp of the value) and, at small positions, against the exact
// double angle (float rounding of inv_freq: ~6e-8 * pos).
TEST(KernelRope, TableUsesFloat32Angles) {
  const int hd = 32, max_pos = 3000;
  const RopeTable table(hd, max_pos, 10000.0, RopeScaling{});
  ASSERT_EQ(table.head_dim(), hd);
  ASSERT_EQ(table.max_pos(), max_pos);
  const std::vector<float> inv = rope_inv_freq(hd, 10000.0, RopeScaling{});
  const std::vector<double> exact = inv_freq_ref(hd, 10000.0);
  for (int pos = 0; pos < max_pos; ++pos)
    for (int i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<float>(inv[i] * static_cast<float>(pos));
      ASSERT_NEAR(table.cos(pos)[i], std::cos(angle), 6e-8) << pos << " " << i;
      ASSERT_NEAR(table.sin(pos)[i], std::sin(angle), 6e-8) << pos << " " << i;
      if (pos < 8) {
        ASSERT_NEAR(table.cos(pos)[i], std::cos(exact[i] * pos), 1e-6) << pos << " " << i;
        ASSERT_NEAR(table.sin(pos)[i], std::sin(exact[i] * pos), 1e-6) << pos << " " << i;
      }
    }
}

struct RopeShape {
  int B, T, heads, hd;
  std::size_t stride;
  std::size_t size() const { return static_cast<std::size_t>(B) * T * stride; }
};

// transformers: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), rotate_half(q) = cat(-q2, q1),
// in double from the table's float cos/sin. Elements between a row's heads and its stride stay.
std::vector<double> rope_reference(const std::vector<float>& x, RopeShape s, const int* pos0, const RopeTable& table,
                                   double sign) {
  std::vector<double> out(x.begin(), x.end());
  const int half = s.hd / 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t) {
      const int pos = (pos0 ? pos0[b] : 0) + t;
      for (int h = 0; h < s.heads; ++h) {
        const std::size_t o = (static_cast<std::size_t>(b) * s.T + t) * s.stride + static_cast<std::size_t>(h) * s.hd;
        for (int j = 0; j < s.hd; ++j) {
          const double c = table.cos(pos)[j % half], sn = sign * table.sin(pos)[j % half];
          const double rot = j < half ? -static_cast<double>(x[o + j + half]) : static_cast<double>(x[o + j - half]);
          out[o + j] = x[o + j] * c + rot * sn;
        }
      }
    }
  return out;
}

std::vector<float> rope_fwd(ThreadPool& pool, std::vector<float> x, RopeShape s, const int* pos0,
                            const RopeTable& table) {
  rope_forward(pool, x.data(), s.B, s.T, s.heads, s.hd, s.stride, pos0, table);
  return x;
}

std::vector<float> rope_bwd(ThreadPool& pool, std::vector<float> dx, RopeShape s, const int* pos0,
                            const RopeTable& table) {
  rope_backward(pool, dx.data(), s.B, s.T, s.heads, s.hd, s.stride, pos0, table);
  return dx;
}

// hd = 40 (half 20: one 16-lane block plus a tail), 3 heads in rows of stride 131 (the gap must
// stay untouched), two sequences starting at positions 3 and 50, llama3-scaled table.
// Measured: forward 7.4e-8, backward 6.4e-8 (float rounding of two products and a sum).
// Bound 1e-6 (a swapped sign or the interleaved-pairs convention is off by ~1).
TEST(KernelRope, MatchesFloat64Reference) {
  RopeScaling sc;
  sc.type = RopeScaling::Type::Llama3;
  sc.factor = 8.0;
  sc.original_max_position_embeddings = 32;
  const RopeTable table(40, 64, 500000.0, sc);
  const RopeShape s{2, 9, 3, 40, 131};
  const int pos0[2] = {3, 50};
  test::TestRng rng(61);
  const auto x = rng.normal_f32(s.size());
  ThreadPool pool(2);
  const auto fwd = rope_fwd(pool, x, s, pos0, table);
  expect_close(fwd, rope_reference(x, s, pos0, table, 1.0), 1e-6, "forward");
  expect_close(rope_bwd(pool, x, s, pos0, table), rope_reference(x, s, pos0, table, -1.0), 1e-6, "backward");
  for (std::size_t r = 0; r < static_cast<std::size_t>(s.B) * s.T; ++r)
    for (std::size_t j = static_cast<std::size_t>(s.heads) * s.hd; j < s.stride; ++j)
      ASSERT_EQ(fwd[r * s.stride + j], x[r * s.stride + j]) << "gap element changed, row " << r;
}

// Position 0 rotates by angle 0: cos 1, sin 0 exactly, so x comes back bit for bit (pos0 null:
// row t is at position t, so only t = 0 rows are checked; with T = 1 every row is).
TEST(KernelRope, PositionZeroIsIdentity) {
  const RopeTable table(16, 8, 10000.0, RopeScaling{});
  test::TestRng rng(62);
  ThreadPool pool(2);
  const RopeShape one{5, 1, 4, 16, 64};
  const auto x = rng.normal_f32(one.size());
  EXPECT_EQ(rope_fwd(pool, x, one, nullptr, table), x);
  EXPECT_EQ(rope_bwd(pool, x, one, nullptr, table), x);
  const int zeros[5] = {0, 0, 0, 0, 0};
  EXPECT_EQ(rope_fwd(pool, x, one, zeros, table), x);
  const RopeShape seq{2, 4, 4, 16, 64};
  const auto y = rng.normal_f32(seq.size());
  const auto ry = rope_fwd(pool, y, seq, nullptr, table);
  for (int b = 0; b < seq.B; ++b)
    for (std::size_t j = 0; j < seq.stride; ++j) {
      const std::size_t i = static_cast<std::size_t>(b) * seq.T * seq.stride + j;
      ASSERT_EQ(ry[i], y[i]) << "row t = 0 of sequence " << b;
    }
  EXPECT_NE(ry, y) << "rows t > 0 must rotate";
}

// The backward is the transpose of the forward: <R x, y> = <x, R^T y> (float rounding only:
// measured 9.1e-10 relative; bound 1e-6 (the forward used twice is off by ~1e-1)), and R^T R x = x
// up to rounding (measured 1.1e-7, bound 1e-6).
TEST(KernelRope, BackwardIsTranspose) {
  const RopeTable table(24, 100, 10000.0, RopeScaling{});
  const RopeShape s{3, 7, 2, 24, 53};
  const int pos0[3] = {0, 17, 90};
  test::TestRng rng(63);
  const auto x = rng.normal_f32(s.size()), y = rng.normal_f32(s.size());
  ThreadPool pool(2);
  const auto rx = rope_fwd(pool, x, s, pos0, table), rty = rope_bwd(pool, y, s, pos0, table);
  double lhs = 0.0, rhs = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    lhs += static_cast<double>(rx[i]) * y[i];
    rhs += static_cast<double>(x[i]) * rty[i];
    norm += std::fabs(static_cast<double>(x[i]) * y[i]);
  }
  EXPECT_LE(std::fabs(lhs - rhs) / norm, 1e-6) << lhs << " vs " << rhs;
  test::record_measured("transpose", std::fabs(lhs - rhs) / norm);
  expect_close(rope_bwd(pool, rx, s, pos0, table), x, 1e-6, "round trip");
}

// J = sum w * rope(x), float forward, central differences in double (h = 1e-2; J is linear,
// so only rounding: ~1e-5). Measured 1.0e-5. Bound 1e-4.
TEST(KernelRope, GradientMatchesFiniteDifferences) {
  const RopeTable table(8, 16, 10000.0, RopeScaling{});
  const RopeShape s{2, 3, 2, 8, 16};
  const int pos0[2] = {2, 9};
  test::TestRng rng(64);
  auto x = rng.normal_f32(s.size());
  const auto w = rng.normal_f32(s.size());
  const std::vector<double> weights(w.begin(), w.end());
  ThreadPool pool(2);
  const auto dx = rope_bwd(pool, w, s, pos0, table);
  test::expect_grad_matches_fd(x, dx, 1e-2, 1e-4, "dx",
                               [&] { return test::weighted_sum(rope_fwd(pool, x, s, pos0, table), weights); });
}

TEST(KernelRope, RejectsBadArguments) {
  EXPECT_THROW(RopeTable(15, 8, 10000.0, RopeScaling{}), Error);
  EXPECT_THROW(rope_inv_freq(7, 10000.0, RopeScaling{}), Error);
  EXPECT_THROW(RopeTable(16, 0, 10000.0, RopeScaling{}), Error);
  const RopeTable table(16, 8, 10000.0, RopeScaling{});
  ThreadPool pool(1);
  std::vector<float> x(16 * 16, 1.0f);
  const int ok[2] = {0, 6}, past_end[2] = {0, 7};
  EXPECT_NO_THROW(rope_forward(pool, x.data(), 2, 2, 1, 16, 32, ok, table));
  EXPECT_THROW(rope_forward(pool, x.data(), 2, 2, 1, 16, 32, past_end, table), BugError);
  EXPECT_THROW(rope_backward(pool, x.data(), 2, 2, 1, 16, 32, past_end, table), BugError);
  EXPECT_THROW(rope_forward(pool, x.data(), 1, 9, 1, 16, 16, nullptr, table), BugError);
  EXPECT_THROW(rope_forward(pool, x.data(), 2, 2, 2, 8, 16, nullptr, table), Error) << "hd != table head_dim";
}

// Rows: min 16 per range; B*T = 80 rows split for 2 and 3 threads.
TEST(KernelRope, ThreadCountIndependent) {
  const RopeTable table(40, 128, 10000.0, RopeScaling{});
  const RopeShape s{2, 40, 3, 40, 120};
  const int pos0[2] = {5, 80};
  test::TestRng rng(65);
  const auto x = rng.normal_f32(s.size());
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const auto f = rope_fwd(pool, x, s, pos0, table), b = rope_bwd(pool, x, s, pos0, table);
        return test::concat({&f, &b});
      },
      "rope");
}

}  // namespace
}  // namespace stratum
