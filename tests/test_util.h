// Helpers shared by the kernel tests (tests/kernel_*_test.cpp): reading the PyTorch golden files
// in tests/golden/ops/, a small deterministic RNG, error metrics, central differences in double
// and the thread-count sweep of Note [deterministic partition] (src/core/thread_pool.h).
// Does not decide tolerances: each test states its own bound next to what it measured.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "stratum/error.h"

namespace stratum::test {

// One file of tests/golden/ops/ (see tools/README.md for what each tensor is).
class GoldenFile {
 public:
  explicit GoldenFile(const std::string& op)
      : file_(SafetensorsFile::open(std::string(STRATUM_SOURCE_DIR) + "/tests/golden/ops/" + op + ".safetensors")) {}

  // The F32 tensor `name`, checked to have exactly `shape`.
  std::vector<float> f32(const std::string& name, const std::vector<std::int64_t>& shape) const {
    const SafetensorsTensorInfo& t = info(name, shape, DType::F32);
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    file_.read_f32(t, out.data());
    return out;
  }

  std::vector<std::int32_t> i32(const std::string& name, const std::vector<std::int64_t>& shape) const {
    const SafetensorsTensorInfo& t = info(name, shape, DType::I32);
    std::vector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
    file_.read_raw(t, out.data());
    return out;
  }

  // A metadata scalar (stored as a string by make_golden.py).
  double meta(const std::string& key) const {
    auto it = file_.metadata().find(key);
    STRATUM_CHECK(it != file_.metadata().end(), "[test.golden] ", file_.path(), ": no metadata key '", key, "'");
    return std::stod(it->second);
  }

 private:
  const SafetensorsTensorInfo& info(const std::string& name, const std::vector<std::int64_t>& shape,
                                    DType dtype) const {
    const SafetensorsTensorInfo* t = file_.find(name);
    STRATUM_CHECK(t != nullptr, "[test.golden] ", file_.path(), ": no tensor '", name, "'");
    STRATUM_CHECK(t->shape == shape && t->dtype == dtype, "[test.golden] ", file_.path(), ": tensor '", name,
                  "' has an unexpected shape or dtype");
    return *t;
  }

  SafetensorsFile file_;
};

// splitmix64: tiny, seedable, identical on every platform (std::normal_distribution is not).
class TestRng {
 public:
  explicit TestRng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int below(int n) { return static_cast<int>(next_u64() % static_cast<std::uint64_t>(n)); }

  std::vector<float> normal_f32(std::size_t n, double scale = 1.0, double offset = 0.0) {
    std::vector<float> out(n);
    for (float& x : out) x = static_cast<float>(offset + scale * normal());
    return out;
  }

 private:
  std::uint64_t state_;
};

// Largest |got - ref| / (1 + |ref|) (absolute for small values, relative for large ones) and
// the element where it occurs; NaN on either side counts as infinite error.
struct ErrStats {
  double max_err = 0.0;
  std::size_t worst = 0;
};

template <class G, class R>
ErrStats scaled_err(const std::vector<G>& got, const std::vector<R>& ref) {
  ErrStats s;
  const std::size_t n = std::min(got.size(), ref.size());
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double e = std::isnan(g) || std::isnan(r) ? INFINITY : std::fabs(g - r) / (1.0 + std::fabs(r));
    if (e > s.max_err) s = {e, i};
  }
  return s;
}

// Records a measured error as a test property (visible with --gtest_output=xml).
inline void record_measured(const std::string& what, double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  ::testing::Test::RecordProperty(what, text);
}

// Expects max scaled error <= tol and records the measured value under `what`.
template <class G, class R>
void expect_close(const std::vector<G>& got, const std::vector<R>& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_FALSE(got.empty()) << what;
  const ErrStats s = scaled_err(got, ref);
  record_measured(what, s.max_err);
  EXPECT_LE(s.max_err, tol) << what << ": worst element " << s.worst << " got " << got[s.worst] << " want "
                            << ref[s.worst];
}

// J = sum_i w[i] * out[i] in double: the scalar objective of the finite-difference checks, whose
// gradient w.r.t. out is w (passed to the backward kernel as dout, rounded to float).
inline double weighted_sum(const std::vector<float>& out, const std::vector<double>& w) {
  double j = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) j += w[i] * static_cast<double>(out[i]);
  return j;
}

// dJ/dx[i] by central differences: x[i] is moved to the floats nearest x[i] +- h and the
// quotient uses the step actually taken. x[i] is restored. objective() reads x.
template <class Objective>
double central_diff(std::vector<float>& x, std::size_t i, double h, Objective&& objective) {
  const float saved = x[i];
  const float plus = static_cast<float>(saved + h), minus = static_cast<float>(saved - h);
  x[i] = plus;
  const double j_plus = objective();
  x[i] = minus;
  const double j_minus = objective();
  x[i] = saved;
  return (j_plus - j_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
}

// Central differences for every element of x (the shapes in these tests are small), compared to
// `analytic` with |an - fd| <= tol * (1 + |fd|). Also requires the gradient to be non-trivial
// (max |an| >= 0.05) so a kernel that writes zeros cannot pass.
template <class Objective>
void expect_grad_matches_fd(std::vector<float>& x, const std::vector<float>& analytic, double h, double tol,
                            const std::string& what, Objective&& objective) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<double> fd(x.size());
  double max_abs = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    fd[i] = central_diff(x, i, h, objective);
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(analytic[i])));
  }
  EXPECT_GE(max_abs, 0.05) << what << ": gradient is (nearly) zero everywhere";
  expect_close(analytic, fd, tol, what);
}

inline std::uint64_t fnv1a_bits(const std::vector<float>& x) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = reinterpret_cast<const unsigned char*>(x.data());
  for (std::size_t i = 0; i < x.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Note [deterministic partition]: runs `run(pool)` (which returns every output of the kernel,
// concatenated) with 1, 2 and 3 threads and expects bit-identical results. Callers pick sizes
// above 3x the kernel's min_items_per_range so each pool really splits the work. The bits' hash
// is recorded as a property so builds for different ISAs can be compared.
template <class Run>
void expect_thread_count_independent(Run&& run, const std::string& what) {
  std::vector<float> ref;
  {
    ThreadPool pool(1);
    ref = run(pool);
  }
  ASSERT_FALSE(ref.empty()) << what;
  ::testing::Test::RecordProperty(what + ".hash", std::to_string(fnv1a_bits(ref)));
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const std::vector<float> got = run(pool);
    ASSERT_EQ(got.size(), ref.size()) << what;
    if (std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) != 0) {
      std::size_t i = 0;
      while (std::memcmp(&got[i], &ref[i], sizeof(float)) == 0) ++i;
      ADD_FAILURE() << what << ": " << threads << " threads differ from 1 thread at element " << i << ": "
                    << got[i] << " vs " << ref[i];
    }
  }
}

// Concatenation of output buffers for expect_thread_count_independent.
inline std::vector<float> concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// bf16 copies of x by truncation (the upper half of each float's bits), every `subnormal_every`-th
// one (from the 6th) replaced by the smallest subnormal (0 = none); Note [bf16 weights] tests
// compare kernels on them against the same kernels on their exact widening (bf16_widen).
inline std::vector<std::uint16_t> bf16_truncate(const std::vector<float>& x, std::size_t subnormal_every = 0) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &x[i], 4);
    out[i] = static_cast<std::uint16_t>(bits >> 16);
    if (subnormal_every > 0 && i % subnormal_every == 5) out[i] = 0x0001;
  }
  return out;
}

}  // namespace stratum::test
