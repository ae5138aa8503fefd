// Tests for src/kernels/cpu/dropout (Note [dropout mask]): every element is the documented
// function of (key, m * n + j) with strided rows, overwrite and accumulate; the same bits for any
// thread count; the kept fraction is 1 - p; p = 0 is the identity; another key, another mask.
#include "kernels/cpu/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dropout_mask.h"
#include "core/rng.h"

namespace stratum {
namespace {

std::vector<float> random_values(std::size_t n) {
  Rng rng(11);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

TEST(KernelDropout, AppliesTheDocumentedMaskToStridedRows) {
  const int M = 37, n = 1001, ldx = 1013, ldy = 1009;
  const float p = 0.1f;
  const std::uint64_t key = dropout_step_key(1337, 4) ^ 0xABCD;
  const std::vector<float> x = random_values(static_cast<std::size_t>(M) * ldx);
  const std::vector<float> y0 = random_values(static_cast<std::size_t>(M) * ldy + 7);
  const std::uint32_t threshold = dropout_threshold(p);
  EXPECT_EQ(threshold, 1677722u);  // llround(0.1f * 2^24)
  const float scale = dropout_keep_scale(p);
  for (bool accumulate : {false, true}) {
    std::vector<float> want = y0;
    std::size_t kept = 0;
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < n; ++j) {
        const bool keep = dropout_keep(key, static_cast<std::uint64_t>(m) * n + j, threshold);
        kept += keep;
        const float v = keep ? x[m * ldx + j] * scale : 0.0f;
        float& w = want[static_cast<std::size_t>(m) * ldy + j];
        w = accumulate ? w + v : v;
      }
    const double fraction = static_cast<double>(kept) / (M * n);
    EXPECT_NEAR(fraction, 1.0 - p, 0.01);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y = y0;
      dropout_rows(pool, y.data(), ldy, x.data(), ldx, M, n, key, p, accumulate);
      EXPECT_EQ(y, want) << "threads " << threads << " accumulate " << accumulate;  // padding untouched too
    }
  }
}

TEST(KernelDropout, ZeroIsTheIdentityAndKeysDiffer) {
  const int M = 8, n = 300;
  const std::vector<float> x = random_values(static_cast<std::size_t>(M) * n);
  ThreadPool pool(2);
  std::vector<float> y(x.size(), 5.0f);
  dropout_rows(pool, y.data(), n, x.data(), n, M, n, 42, 0.0f, false);
  EXPECT_EQ(y, x);
  std::vector<float> a(x.size()), b(x.size());
  dropout_rows(pool, a.data(), n, x.data(), n, M, n, 42, 0.5f, false);
  dropout_rows(pool, b.data(), n, x.data(), n, M, n, 43, 0.5f, false);
  std::size_t differ = 0, zeros = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    differ += (a[i] == 0.0f) != (b[i] == 0.0f);
    zeros += a[i] == 0.0f;
    if (a[i] != 0.0f) {
      EXPECT_EQ(a[i], x[i] * 2.0f);
    }
  }
  EXPECT_GT(differ, x.size() / 3);
  EXPECT_NEAR(static_cast<double>(zeros) / x.size(), 0.5, 0.05);
  EXPECT_NE(dropout_step_key(1, 0), dropout_step_key(1, 1));
}

}  // namespace
}  // namespace stratum
