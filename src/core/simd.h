// Helpers for the CPU kernels: run-time ISA dispatch and vectorisable math.
// Note [simd lanes]: reductions use kLanes independent accumulators combined in a fixed tree,
// written as plain loops that GCC vectorises for whichever ISA clone runs (AVX-512, AVX2 or the
// SSE2 baseline). The lane structure, not the ISA, fixes the summation order, so every clone
// gives the same bits. Does not use -ffast-math or libm vector variants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

// Compiles the annotated function for AVX-512, AVX2 and baseline x86-64 and picks one at load
// time (GCC ifunc). An attribute, not code generation.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define STRATUM_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATUM_SIMD_CLONES
#endif

namespace stratum::simd {

inline constexpr int kLanes = 16;

STRATUM_HOST_DEVICE inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for float, ~1 ulp on [-87, 88], vectorisable (no libm call). Inputs are clamped:
// exp(x < -87.3) returns ~1.2e-38 instead of a denormal or 0; exp(x > 88.7) saturates.
STRATUM_HOST_DEVICE inline float exp_f32(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = (x * 1.44269504088896341f + round_magic) - round_magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as two exact power-of-two factors, so n = 128 (x > 127.5 ln 2) and n = -126 stay finite.
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t n1 = ni >> 1;
  const std::int32_t n2 = ni - n1;
  const float scale1 = bits_to_float(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float scale2 = bits_to_float(static_cast<std::uint32_t>(n2 + 127) << 23);
  return p * scale1 * scale2;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error ~1e-7, saturates to +-1.
STRATUM_HOST_DEVICE inline float tanh_f32(float x) { return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f); }

// Fixed-order combination of kLanes partial sums: ((0+8)+(4+12))+... a balanced tree.
inline float lanes_sum(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

inline double lanes_sum(double* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// Sum of x[0..n) with kLanes accumulators (element i goes to lane i % kLanes).
inline float sum_f32(const float* x, std::size_t n) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += x[i];
  return lanes_sum(acc);
}

// Dot product with the same lane order as sum_f32.
inline float dot_f32(const float* a, const float* b, std::size_t n) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return lanes_sum(acc);
}

inline float max_f32(const float* x, std::size_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -3.402823466e38f;
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > x[i + l] ? acc[l] : x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] = acc[l] > x[i] ? acc[l] : x[i];
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

}  // namespace stratum::simd
