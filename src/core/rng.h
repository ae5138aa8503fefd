// Deterministic random numbers (SplitMix64 + Box-Muller), identical on every platform and
// compiler, unlike std::normal_distribution. Not cryptographic.
#pragma once

#include <cstdint>

namespace stratum {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  double uniform();                       // [0, 1)
  double normal();                        // N(0, 1)
  std::uint64_t below(std::uint64_t n);   // uniform integer in [0, n), n > 0
  std::uint64_t state() const { return state_; }

 private:
  std::uint64_t state_;
};

}  // namespace stratum
