// Tests for src/kernels/cpu/zo_update: each element gets exactly the fp32 arithmetic ZoUpdate
// documents (update, perturbation, both, neither) with z from the generator of Note [zo noise] at
// the element's index in its tensor (`first` + i), the same bits for any thread count, and a
// perturbation by +eps then -2 eps then the update's +eps restore lands within rounding of the
// start (MeZO's sequence is not exact in fp32, which is why the update folds the restore in).
#include "kernels/cpu/zo_update.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/rng.h"
#include "core/zo_noise.h"

namespace stratum {
namespace {

std::vector<float> random_weights(std::size_t n) {
  Rng rng(5);
  std::vector<float> w(n);
  for (float& x : w) x = static_cast<float>(rng.normal() * 0.5);
  return w;
}

ZoUpdate both() {
  ZoUpdate u;
  u.update = true;
  u.update_key = 0x1234;
  u.eps = 1e-3f;
  u.lr = 0.05f;
  u.g = -0.75f;
  u.weight_decay = 0.1f;
  u.perturb = true;
  u.perturb_key = 0x9876;
  u.scale = 1e-3f;
  return u;
}

TEST(KernelZoUpdate, AppliesTheDocumentedArithmeticAtTheTensorIndex) {
  const std::size_t n = 70001, first = 4096;
  const std::vector<float> w0 = random_weights(n);
  const float* q = zo_normal_table();
  ZoUpdate none;
  ZoUpdate only_update = both();
  only_update.perturb = false;
  ZoUpdate only_perturb = both();
  only_perturb.update = false;
  ThreadPool pool(2);
  for (const ZoUpdate& u : {none, only_update, only_perturb, both()}) {
    std::vector<float> w = w0;
    zo_update(pool, w.data(), n, first, u);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float p = w0[i];
      if (u.update) {
        const float z = zo_z(q, u.update_key, first + i);
        p = p + z * u.eps;
        p = p - u.lr * (u.g * z + u.weight_decay * p);
      }
      if (u.perturb) p = p + zo_z(q, u.perturb_key, first + i) * u.scale;
      mismatches += std::memcmp(&p, &w[i], sizeof p) != 0;
    }
    EXPECT_EQ(mismatches, 0u) << "update " << u.update << " perturb " << u.perturb;
  }
}

TEST(KernelZoUpdate, SameBitsForAnyThreadCountAndSplit) {
  const std::size_t n = 100003;
  const std::vector<float> w0 = random_weights(n);
  ThreadPool one(1), three(3);
  std::vector<float> a = w0, b = w0, c = w0;
  zo_update(one, a.data(), n, 0, both());
  zo_update(three, b.data(), n, 0, both());
  // In two calls, the second starting at its elements' index in the tensor: what a chunked
  // segment or a vocabulary block does.
  zo_update(three, c.data(), 40000, 0, both());
  zo_update(three, c.data() + 40000, n - 40000, 40000, both());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), n * sizeof(float)), 0);
}

TEST(KernelZoUpdate, PerturbAndRestoreStaysWithinRounding) {
  const std::size_t n = 50000;
  const std::vector<float> w0 = random_weights(n);
  std::vector<float> w = w0;
  ThreadPool pool(2);
  ZoUpdate plus;
  plus.perturb = true;
  plus.perturb_key = 77;
  plus.scale = 1e-3f;
  ZoUpdate minus = plus;
  minus.scale = -2e-3f;
  ZoUpdate restore;  // lr 0: the update is the restore alone
  restore.update = true;
  restore.update_key = 77;
  restore.eps = 1e-3f;
  zo_update(pool, w.data(), n, 0, plus);
  double moved = 0.0;
  for (std::size_t i = 0; i < n; ++i) moved = std::max(moved, std::abs(static_cast<double>(w[i]) - w0[i]));
  EXPECT_GT(moved, 3e-3) << "z reaches beyond 3 standard deviations in 50000 draws";
  zo_update(pool, w.data(), n, 0, minus);
  zo_update(pool, w.data(), n, 0, restore);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(w[i], w0[i], 4 * 6e-8 * std::max(1.0f, std::abs(w0[i]))) << i;
    changed += w[i] != w0[i];
  }
  EXPECT_GT(changed, 0u) << "fp32 rounding makes some elements differ (MeZO's drift)";
}

}  // namespace
}  // namespace stratum
