// bfloat16 <-> float: a bf16 is the upper 16 bits of an IEEE float, so widening is exact.
// Note [bf16 weights] (infer/decoder.h) keeps bf16 checkpoints as stored and widens on use.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace stratum {

inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// float -> bfloat16, rounded to nearest, ties to even (as PyTorch's .to(torch.bfloat16)); a NaN
// stays a (quiet) NaN, infinities stay infinite, values beyond bf16's range round to infinity.
inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// A weight as fp32, whether stored as float or as bf16 (kernels templated on the weight type).
inline float to_f32(float w) { return w; }
inline float to_f32(std::uint16_t w) { return bf16_to_f32(w); }

inline void bf16_widen(float* dst, const std::uint16_t* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace stratum
