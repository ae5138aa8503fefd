// Tests for src/kernels/cpu/elementwise: add_f32 (exact, aliasing out with either input) and
// sum_squares (float64 accumulation vs a long double reference, across the 64 Ki chunk
// boundary of Note [fixed chunks]), both for thread-count independence. Neither op has a
// backward or a golden file: add is exact and sum_squares is checked against long double.
#include "kernels/cpu/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

TEST(KernelElementwise, AddIsExactAndMayAlias) {
  test::TestRng rng(81);
  const std::size_t n = 30001;  // min 8192 per range: splits for 2 and 3 threads; odd tail
  const auto a = rng.normal_f32(n), b = rng.normal_f32(n, 10.0);
  ThreadPool pool(2);
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  add_f32(pool, out.data(), a.data(), b.data(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  std::vector<float> into_a = a, into_b = b;
  add_f32(pool, into_a.data(), into_a.data(), b.data(), n);
  add_f32(pool, into_b.data(), a.data(), into_b.data(), n);
  EXPECT_EQ(into_a, out) << "out aliasing a";
  EXPECT_EQ(into_b, out) << "out aliasing b";
  test::expect_thread_count_independent(
      [&](ThreadPool& p) {
        std::vector<float> r(n), r_alias = a;
        add_f32(p, r.data(), a.data(), b.data(), n);
        add_f32(p, r_alias.data(), r_alias.data(), b.data(), n);
        return test::concat({&r, &r_alias});
      },
      "add_f32");
}

long double sum_squares_reference(const std::vector<float>& x, std::size_t n) {
  long double s = 0.0L;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<long double>(x[i]) * x[i];
  return s;
}

// Each x^2 is exact in double (24-bit x 24-bit), so the only error is the double summation.
// Measured relative error vs long double: <= 5.7e-15 for n up to 208953 (3 chunks + tail).
// Bound 1e-13 (a float accumulator would be off by ~1e-5; dropping the last element, 1e-6 of a
// ~1.9e6 total, by 5e-13).
TEST(KernelElementwise, SumSquaresMatchesLongDouble) {
  test::TestRng rng(82);
  const std::size_t n_max = 3 * 65536 + 12345;
  std::vector<float> x = rng.normal_f32(n_max, 3.0);
  x[n_max - 1] = 1e-3f;  // the last element is small but visible at 1e-13
  ThreadPool pool(2);
  double worst = 0.0;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{65535},
                        std::size_t{65536}, std::size_t{65537}, n_max}) {
    const long double want = sum_squares_reference(x, n);
    const double got = sum_squares(pool, x.data(), n);
    if (n == 0) {
      EXPECT_EQ(got, 0.0);
      continue;
    }
    const double rel = static_cast<double>(std::fabs((static_cast<long double>(got) - want) / want));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-13) << "n = " << n << ": got " << got << " want " << static_cast<double>(want);
  }
  test::record_measured("sum_squares_rel_err", worst);
  // The last element matters (catches an off-by-one in the chunk or lane tail).
  EXPECT_NE(sum_squares(pool, x.data(), n_max), sum_squares(pool, x.data(), n_max - 1));
}

// Note [fixed chunks]: 4 chunks of 64 Ki over 1, 2 and 3 threads give the same double.
TEST(KernelElementwise, SumSquaresThreadCountIndependent) {
  test::TestRng rng(83);
  const std::size_t n = 3 * 65536 + 12345;
  const auto x = rng.normal_f32(n, 2.0, 0.3);
  test::expect_thread_count_independent(
      [&](ThreadPool& p) {
        const double s = sum_squares(p, x.data(), n);
        std::vector<float> bits(2);
        std::memcpy(bits.data(), &s, sizeof s);  // the double's bytes, compared with memcmp
        return bits;
      },
      "sum_squares");
}

}  // namespace
}  // namespace stratum
