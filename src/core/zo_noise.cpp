// The zeroth-order perturbation's generator; see zo_noise.h, Note [zo noise].
#include "core/zo_noise.h"

#include <cmath>
#include <vector>

namespace stratum {

std::uint64_t zo_tensor_key(std::uint64_t step_key, std::string_view hf_name) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a 64
  for (unsigned char c : hf_name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return splitmix64_mix(step_key ^ h);
}

namespace {
std::vector<float> normal_table_make() {
  constexpr int kLevels = 1 << 16;
  std::vector<float> q(kLevels);
  const double root2 = std::sqrt(2.0);
  for (int j = 0; j < kLevels / 2; ++j) {  // the upper half mirrors the lower: Q[65535 - j] = -Q[j]
    const double p = (j + 0.5) / kLevels;
    double lo = -9.0, hi = 9.0;
    for (int k = 0; k < 64; ++k) {
      const double mid = 0.5 * (lo + hi);
      if (0.5 * std::erfc(-mid / root2) < p) lo = mid;
      else hi = mid;
    }
    q[j] = static_cast<float>(0.5 * (lo + hi));
    q[kLevels - 1 - j] = -q[j];
  }
  return q;
}
}  // namespace

const float* zo_normal_table() {
  static const std::vector<float> table = normal_table_make();
  return table.data();
}

}  // namespace stratum
