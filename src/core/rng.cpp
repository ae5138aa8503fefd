// Rng; see rng.h.
#include "core/rng.h"

#include <cmath>

namespace stratum {

std::uint64_t Rng::next_u64() { return splitmix64_mix(state_ += kSplitMix64Gamma); }

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  double u1 = uniform();
  const double u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::uint64_t Rng::below(std::uint64_t n) {
  // Rejection sampling keeps the result exactly uniform.
  const std::uint64_t limit = ~0ull - (~0ull % n);
  for (;;) {
    const std::uint64_t x = next_u64();
    if (x < limit) return x % n;
  }
}

}  // namespace stratum
