// bfloat16 <-> float: a bf16 is the upper 16 bits of an IEEE float, so widening is exact.
// Note [bf16 weights] (infer/decoder.h) keeps bf16 checkpoints as stored and widens on use.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace stratum {

inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// A weight as fp32, whether stored as float or as bf16 (kernels templated on the weight type).
inline float to_f32(float w) { return w; }
inline float to_f32(std::uint16_t w) { return bf16_to_f32(w); }

inline void bf16_widen(float* dst, const std::uint16_t* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace stratum
