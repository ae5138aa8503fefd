// The dropout mask of training (Note [dropout mask]): a pure function of (key, element index),
// so the backward regenerates the forward's mask instead of storing it, and any partition of the
// elements gives the same bits. Does not apply it (Ops::dropout does) or choose keys (Note [lora
// dropout] in model/lora.h does).
// Note [dropout mask]: with drop probability p, element i (flat, row-major index in the (M, n)
// input of one dropout) under key K is kept iff
//   mix(K + (i + 1) * 0x9E3779B97F4A7C15) >> 40  >=  P,    P = llround(p * 2^24)
// (mix: SplitMix64's finaliser, core/rng.h; uint64, wrapping), and a kept element is multiplied
// by float(1 / (1 - p)) (the quotient in double, rounded once to float), a dropped one is 0: the
// keep probability is 1 - P / 2^24 (p to within 3e-8), and the expectation is the input's, as
// torch.nn.Dropout in training mode. A run's step keys:
//   dropout_step_key(S, t) = mix((S ^ 0x44726F704F757421) + (t + 1) * 0x9E3779B97F4A7C15)
// for run seed S and step t (0-based); the salt keeps them apart from the zeroth-order noise's
// step keys (Note [zo noise]). tools/torch_lora.py reproduces the mask in numpy.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/rng.h"  // splitmix64_mix

namespace stratum {

inline std::uint64_t dropout_step_key(std::uint64_t seed, long step) {
  return splitmix64_mix((seed ^ 0x44726F704F757421ull) + static_cast<std::uint64_t>(step + 1) * kSplitMix64Gamma);
}
inline std::uint32_t dropout_threshold(float p) { return static_cast<std::uint32_t>(std::llround(p * 16777216.0)); }
inline float dropout_keep_scale(float p) { return static_cast<float>(1.0 / (1.0 - static_cast<double>(p))); }
STRATUM_HOST_DEVICE inline bool dropout_keep(std::uint64_t key, std::uint64_t i, std::uint32_t threshold) {
  return (splitmix64_mix(key + (i + 1) * kSplitMix64Gamma) >> 40) >= threshold;
}

}  // namespace stratum
