// Deterministic random numbers (SplitMix64 + Box-Muller), identical on every platform and
// compiler, unlike std::normal_distribution. Not cryptographic.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace stratum {

// SplitMix64's increment and finaliser (uint64, wrapping): Rng's outputs, and the hash of the
// zeroth-order noise (Note [zo noise] in core/zo_noise.h).
constexpr std::uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;
STRATUM_HOST_DEVICE inline std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  double uniform();                       // [0, 1)
  double normal();                        // N(0, 1)
  std::uint64_t below(std::uint64_t n);   // uniform integer in [0, n), n > 0
  std::uint64_t state() const { return state_; }
  // As if next_u64 had been called n times (SplitMix64 counts: the state moves by n gammas), so
  // the stream can be split into pieces made in parallel with the same values. normal() takes two.
  void skip(std::uint64_t n) { state_ += n * kSplitMix64Gamma; }

 private:
  std::uint64_t state_;
};

}  // namespace stratum
