// The perturbation direction z of zeroth-order training (Note [zo noise]): a pure function of
// (run seed, step, tensor name, element index), so it is regenerated wherever and whenever it is
// needed and never stored. Does not apply it (Ops::zo_update does).
// Note [zo noise]: for step t (0-based) of a run with seed S and the element i (flat index in the
// whole Hugging Face tensor, row-major) of the tensor named N (its Hugging Face name, e.g.
// "transformer.h.0.attn.c_attn.weight"):
//   mix(x)         = SplitMix64's finaliser (splitmix64_mix in core/rng.h): x ^= x >> 30; x *= 0xBF58476D1CE4E5B9;
//                    x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31   (uint64, wrapping)
//   step_key(S, t) = mix(S + (t + 1) * 0x9E3779B97F4A7C15)
//   key            = mix(step_key ^ fnv1a64(N))     (FNV-1a, 64 bits, over N's bytes)
//   z              = Q[mix(key + (i + 1) * 0x9E3779B97F4A7C15) >> 48]
//   Q[j]           = float(x_j), x_j the root of 0.5 * erfc(-x / sqrt(2)) = (j + 0.5) / 65536,
//                    found by 64 bisection steps on [-9, 9] in double (0.5 * (lo + hi)).
// So z follows the standard normal quantised to 65536 equally likely levels (|z| <= 4.325,
// E[z^2] = 0.99998): what MeZO needs from z is a symmetric direction with unit variance per
// coordinate, and a table lookup costs a few nanoseconds where Box-Muller costs tens.
// tools/make_golden.py (--only zo) reproduces it in Python.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/rng.h"  // splitmix64_mix

namespace stratum {

inline std::uint64_t zo_step_key(std::uint64_t seed, long step) {
  return splitmix64_mix(seed + static_cast<std::uint64_t>(step + 1) * kSplitMix64Gamma);
}

std::uint64_t zo_tensor_key(std::uint64_t step_key, std::string_view hf_name);

// The 65536 levels Q (built once per process, thread-safe).
const float* zo_normal_table();

STRATUM_HOST_DEVICE inline float zo_z(const float* table, std::uint64_t key, std::uint64_t i) {
  return table[splitmix64_mix(key + (i + 1) * kSplitMix64Gamma) >> 48];
}

}  // namespace stratum
