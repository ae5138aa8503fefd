// What the C++ benchmarks share: a steady clock and the machine's sgemm rate, measured in the
// same run as the thing it is the baseline for.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/cpu/matmul.h"

namespace stratum::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The middle value (the upper one of an even count); v non-empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "1024,2048,4096" -> {1024, 2048, 4096}.
inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

// Best sgemm GFLOP/s over `shapes` ({M, N, K}, row-major, no transposes): one untimed product,
// then 5 timed ones each.
inline double sgemm_gflops(const std::vector<std::array<int, 3>>& shapes) {
  double best = 0.0;
  for (const auto& [m, n, k] : shapes) {
    AlignedBuffer a(sizeof(float) * m * k), b(sizeof(float) * k * n), c(sizeof(float) * m * n);
    std::fill(a.as_f32(), a.as_f32() + static_cast<std::size_t>(m) * k, 0.01f);
    std::fill(b.as_f32(), b.as_f32() + static_cast<std::size_t>(k) * n, 0.02f);
    sgemm(false, false, m, n, k, 1.0f, a.as_f32(), k, b.as_f32(), n, 0.0f, c.as_f32(), n);
    const int reps = 5;
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) sgemm(false, false, m, n, k, 1.0f, a.as_f32(), k, b.as_f32(), n, 0.0f, c.as_f32(), n);
    best = std::max(best, 2.0 * m * n * k * reps / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace stratum::bench
