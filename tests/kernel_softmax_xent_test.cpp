// Tests for src/kernels/cpu/softmax_xent: losses and dlogits against the PyTorch float64 golden
// file and a float64 reference (large logits, lane tails), a finite-difference check in double,
// in-place dlogits (aliasing logits), dlogits == null, masked rows over vocabulary blocks,
// softmax_row with temperature, and thread-count independence (Note [deterministic partition]).
#include "kernels/cpu/softmax_xent.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct Xent {
  std::vector<float> losses, dlogits;
};

Xent xent(ThreadPool& pool, const std::vector<float>& logits, const std::vector<std::int32_t>& targets, int N, int V,
          float dloss) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // every element must be written
  Xent r{std::vector<float>(N, nan), std::vector<float>(logits.size(), nan)};
  softmax_xent(pool, r.losses.data(), r.dlogits.data(), logits.data(), targets.data(), N, V, dloss);
  return r;
}

// Float64 losses and (softmax - onehot) * dloss.
struct XentRef {
  std::vector<double> losses, dlogits;
};

XentRef xent_reference(const std::vector<float>& logits, const std::vector<std::int32_t>& targets, int N, int V,
                       double dloss) {
  XentRef r{std::vector<double>(N), std::vector<double>(logits.size())};
  for (int n = 0; n < N; ++n) {
    const float* x = &logits[static_cast<std::size_t>(n) * V];
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(x[i]));
    for (int i = 0; i < V; ++i) sum += std::exp(x[i] - mx);
    r.losses[n] = mx + std::log(sum) - x[targets[n]];
    for (int i = 0; i < V; ++i)
      r.dlogits[static_cast<std::size_t>(n) * V + i] = (std::exp(x[i] - mx) / sum - (i == targets[n] ? 1.0 : 0.0)) * dloss;
  }
  return r;
}

std::vector<float> scaled(std::vector<float> x, float k) {
  for (float& v : x) v *= k;
  return x;
}

// N = 10 rows, V = 37 (two 16-lane blocks + tail), dloss = 1/N as for the mean loss.
// Measured: losses 7.3e-8, dlogits*N 3.9e-8, dlogits(dloss=1) vs probs - onehot 3.4e-8.
// Bound 1e-6 (dlogits are compared times N, so the bound is relative to O(1) values).
TEST(KernelSoftmaxXent, MatchesPytorchGolden) {
  test::GoldenFile g("softmax_xent");
  const int N = 10, V = 37;
  const auto logits = g.f32("logits", {2, 5, V});
  const auto targets = g.i32("targets", {2, 5});
  ThreadPool pool(2);
  const Xent mean_loss = xent(pool, logits, targets, N, V, 1.0f / N);
  expect_close(mean_loss.losses, g.f32("losses", {2, 5}), 1e-6, "losses");
  expect_close(scaled(mean_loss.dlogits, N), scaled(g.f32("dlogits", {2, 5, V}), N), 1e-6, "dlogits_x_N");
  double mean = 0.0;
  for (float l : mean_loss.losses) mean += l;
  EXPECT_NEAR(mean / N, g.f32("loss", {1})[0], 1e-6);

  std::vector<float> p_minus_onehot = g.f32("probs", {2, 5, V});
  for (int n = 0; n < N; ++n) p_minus_onehot[static_cast<std::size_t>(n) * V + targets[n]] -= 1.0f;
  expect_close(xent(pool, logits, targets, N, V, 1.0f).dlogits, p_minus_onehot, 1e-6, "dlogits_dloss1");
}

// V = 1000, logits of scale 10 plus rows shifted by +-80 (exp would overflow / underflow without
// the max subtraction), targets at both ends of the vocabulary.
// Measured: losses 8.8e-8 (scaled; |loss| up to ~60), dlogits 2.1e-8. Bound 1e-6.
TEST(KernelSoftmaxXent, MatchesFloat64ReferenceWithLargeLogits) {
  const int N = 7, V = 1000;
  test::TestRng rng(41);
  std::vector<float> logits = rng.normal_f32(static_cast<std::size_t>(N) * V, 10.0);
  for (int i = 0; i < V; ++i) {
    logits[1 * V + i] += 80.0f;
    logits[2 * V + i] -= 80.0f;
  }
  const std::vector<std::int32_t> targets = {0, V - 1, 5, 999, 512, 17, 0};
  ThreadPool pool(2);
  const Xent got = xent(pool, logits, targets, N, V, 0.25f);
  const XentRef ref = xent_reference(logits, targets, N, V, 0.25);
  for (float l : got.losses) ASSERT_TRUE(std::isfinite(l));
  expect_close(got.losses, ref.losses, 1e-6, "losses");
  expect_close(got.dlogits, ref.dlogits, 1e-6, "dlogits");
  for (int n = 0; n < N; ++n) {  // each dlogits row sums to ~0 (softmax sums to 1, minus the onehot)
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += got.dlogits[static_cast<std::size_t>(n) * V + i];
    EXPECT_NEAR(sum, 0.0, 1e-5) << "row " << n;
  }
}

// J = dloss * sum_r loss_r (the kernel takes one dloss for all rows, so the weights of J are
// all dloss); float forward, central differences in double, h = 1e-2. Measured 1.7e-5.
// Bound 1e-4 (a dlogits missing the onehot or the dloss factor is off by >= 0.2).
TEST(KernelSoftmaxXent, GradientMatchesFiniteDifferences) {
  const int N = 4, V = 19;
  const float dloss = 0.7f;
  test::TestRng rng(42);
  std::vector<float> logits = rng.normal_f32(static_cast<std::size_t>(N) * V, 2.0);
  const std::vector<std::int32_t> targets = {3, 0, 18, 7};
  ThreadPool pool(2);
  const std::vector<float> dlogits = xent(pool, logits, targets, N, V, dloss).dlogits;
  const std::vector<double> weights(N, static_cast<double>(dloss));
  std::vector<float> losses(N);
  test::expect_grad_matches_fd(logits, dlogits, 1e-2, 1e-4, "dlogits", [&] {
    softmax_xent(pool, losses.data(), nullptr, logits.data(), targets.data(), N, V, dloss);
    return test::weighted_sum(losses, weights);
  });
}

// Note [loss mask]: over vocabulary blocks (Note [online log-sum-exp]), a row whose target is -1
// gets zero dlogits and is left out of the mean; the other rows' values are the bits they have
// with every target real (rows are independent). All rows masked: loss 0.
TEST(KernelSoftmaxXent, MaskedRowsAddNothingToTheLossOrItsGradient) {
  const int N = 6, V = 37, n0 = 20;
  test::TestRng rng(47);
  const std::vector<float> logits = rng.normal_f32(static_cast<std::size_t>(N) * V, 3.0);
  const std::vector<std::int32_t> real = {3, 25, 0, 36, 19, 20};
  std::vector<std::int32_t> masked = real;
  masked[1] = masked[4] = -1;
  ThreadPool pool(2);
  struct Run {
    float loss;
    std::vector<float> dlogits;
  };
  auto run = [&](const std::vector<std::int32_t>& targets) {
    std::vector<float> run_max(N), run_sum(N, 0.0f), target_logit(N, 0.0f), lse(N);
    std::vector<float> blocks[2];
    for (int b = 0; b < 2; ++b) {
      const int v0 = b == 0 ? 0 : n0, n = b == 0 ? n0 : V - n0;
      for (int r = 0; r < N; ++r)
        blocks[b].insert(blocks[b].end(), logits.begin() + r * V + v0, logits.begin() + r * V + v0 + n);
      xent_chunk_forward(pool, run_max.data(), run_sum.data(), target_logit.data(), blocks[b].data(), targets.data(),
                         N, n, v0);
    }
    Run out{xent_loss_finish(lse.data(), run_max.data(), run_sum.data(), target_logit.data(), targets.data(), N), {}};
    for (int b = 0; b < 2; ++b) {
      const int v0 = b == 0 ? 0 : n0, n = b == 0 ? n0 : V - n0;
      std::vector<float> d(blocks[b].size(), std::numeric_limits<float>::quiet_NaN());
      xent_chunk_backward(pool, d.data(), blocks[b].data(), lse.data(), targets.data(), N, n, v0, 0.25f);
      out.dlogits.insert(out.dlogits.end(), d.begin(), d.end());
    }
    return out;
  };
  const Run all = run(real), some = run(masked);
  const XentRef ref = xent_reference(logits, real, N, V, 1.0);
  double want = 0.0;
  for (int r : {0, 2, 3, 5}) want += ref.losses[r];
  EXPECT_NEAR(some.loss, want / 4, 1e-6);
  EXPECT_NEAR(all.loss, (want + ref.losses[1] + ref.losses[4]) / 6, 1e-6);
  for (int b = 0; b < 2; ++b) {
    const std::size_t base = b == 0 ? 0 : static_cast<std::size_t>(N) * n0;
    const int n = b == 0 ? n0 : V - n0;
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < n; ++i) {
        const std::size_t at = base + static_cast<std::size_t>(r) * n + i;
        if (masked[r] < 0) EXPECT_EQ(some.dlogits[at], 0.0f) << "row " << r;
        else EXPECT_EQ(std::memcmp(&some.dlogits[at], &all.dlogits[at], sizeof(float)), 0) << "row " << r;
      }
  }
  EXPECT_EQ(run(std::vector<std::int32_t>(N, -1)).loss, 0.0f);
}

// Note [final softcapping]: logits of +-3 sigma 12 capped at 10 (the cap bends most of them) in two
// vocabulary blocks, 2 masked of 6 rows: logit_softcap against cap * tanh(l / cap) in double
// (1e-6 relative), the loss and the raw logits' gradient (in place, as the head runs it) against a
// float64 cross-entropy of the capped logits back through the cap (1e-6); the uncapped gradient is
// off by > 1e-2.
TEST(KernelSoftmaxXent, SoftcappedLogitsMatchFloat64Reference) {
  const int N = 6, V = 37, n0 = 20;
  const float cap = 10.0f;
  const double dloss = 0.25;
  test::TestRng rng(53);
  const std::vector<float> raw = rng.normal_f32(static_cast<std::size_t>(N) * V, 12.0);
  const std::vector<std::int32_t> targets = {3, -1, 0, 36, -1, 20};
  ThreadPool pool(2);
  std::vector<float> run_max(N), run_sum(N, 0.0f), target_logit(N, 0.0f), lse(N);
  std::vector<float> blocks[2];
  double max_cap_err = 0.0;
  for (int b = 0; b < 2; ++b) {
    const int v0 = b == 0 ? 0 : n0, n = b == 0 ? n0 : V - n0;
    for (int r = 0; r < N; ++r) blocks[b].insert(blocks[b].end(), raw.begin() + r * V + v0, raw.begin() + r * V + v0 + n);
    logit_softcap(pool, blocks[b].data(), N, n, n, cap);
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < n; ++i) {
        const double want = cap * std::tanh(static_cast<double>(raw[r * V + v0 + i]) / cap);
        max_cap_err = std::max(max_cap_err, std::abs(blocks[b][r * n + i] - want) / cap);
      }
    xent_chunk_forward(pool, run_max.data(), run_sum.data(), target_logit.data(), blocks[b].data(), targets.data(), N,
                       n, v0);
  }
  EXPECT_LT(max_cap_err, 1e-6);
  const float loss = xent_loss_finish(lse.data(), run_max.data(), run_sum.data(), target_logit.data(), targets.data(), N);
  // The float64 reference: the capped logits' cross-entropy, its gradient through the cap.
  double want_loss = 0.0;
  std::vector<double> want_d(raw.size(), 0.0), uncapped_d(raw.size(), 0.0);
  for (int r = 0; r < N; ++r) {
    if (targets[r] < 0) continue;
    std::vector<double> c(V);
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, c[i] = cap * std::tanh(static_cast<double>(raw[r * V + i]) / cap));
    for (int i = 0; i < V; ++i) sum += std::exp(c[i] - mx);
    want_loss += mx + std::log(sum) - c[targets[r]];
    for (int i = 0; i < V; ++i) {
      const double g = (std::exp(c[i] - mx) / sum - (i == targets[r] ? 1.0 : 0.0)) * dloss, t = c[i] / cap;
      want_d[r * V + i] = g * (1.0 - t * t);
      uncapped_d[r * V + i] = g;
    }
  }
  EXPECT_NEAR(loss, want_loss / 4, 1e-5);
  double err = 0.0, moved = 0.0;
  for (int b = 0; b < 2; ++b) {
    const int v0 = b == 0 ? 0 : n0, n = b == 0 ? n0 : V - n0;
    xent_chunk_backward(pool, blocks[b].data(), blocks[b].data(), lse.data(), targets.data(), N, n, v0,
                        static_cast<float>(dloss), cap);
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < n; ++i) {
        err = std::max(err, std::abs(blocks[b][r * n + i] - want_d[r * V + v0 + i]));
        moved = std::max(moved, std::abs(uncapped_d[r * V + v0 + i] - want_d[r * V + v0 + i]));
      }
  }
  EXPECT_LT(err, 1e-6);
  EXPECT_GT(moved, 1e-2);
  EXPECT_THROW(logit_softcap(pool, blocks[0].data(), N, n0, n0, 0.0f), Error);
}

// dlogits may alias logits; the in-place result must be bit-identical to the out-of-place one,
// and dlogits == null must give the same losses.
TEST(KernelSoftmaxXent, InPlaceAndNullDlogits) {
  const int N = 9, V = 517;
  test::TestRng rng(43);
  const std::vector<float> logits = rng.normal_f32(static_cast<std::size_t>(N) * V, 4.0);
  std::vector<std::int32_t> targets(N);
  for (auto& t : targets) t = rng.below(V);
  ThreadPool pool(2);
  const Xent ref = xent(pool, logits, targets, N, V, 1.0f / 3);

  std::vector<float> inplace = logits, losses(N);
  softmax_xent(pool, losses.data(), inplace.data(), inplace.data(), targets.data(), N, V, 1.0f / 3);
  EXPECT_EQ(std::memcmp(losses.data(), ref.losses.data(), N * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(inplace.data(), ref.dlogits.data(), inplace.size() * sizeof(float)), 0);

  std::vector<float> losses_only(N);
  softmax_xent(pool, losses_only.data(), nullptr, logits.data(), targets.data(), N, V, 1.0f / 3);
  EXPECT_EQ(std::memcmp(losses_only.data(), ref.losses.data(), N * sizeof(float)), 0);
}

// softmax_row(logits / T): measured <= 3.4e-8 for T = 1, 0.7, 3. Bound 1e-6; also sums to 1.
TEST(KernelSoftmaxXent, SoftmaxRowWithTemperature) {
  const int V = 101;
  test::TestRng rng(44);
  const std::vector<float> logits = rng.normal_f32(V, 5.0);
  for (float temperature : {1.0f, 0.7f, 3.0f}) {
    std::vector<float> probs(V);
    softmax_row(probs.data(), logits.data(), V, temperature);
    std::vector<double> ref(V);
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(logits[i] * (1.0f / temperature)));
    for (int i = 0; i < V; ++i) sum += (ref[i] = std::exp(static_cast<double>(logits[i] * (1.0f / temperature)) - mx));
    for (double& p : ref) p /= sum;
    expect_close(probs, ref, 1e-6, "probs_T" + std::to_string(temperature));
    double total = 0.0;
    for (float p : probs) total += p;
    EXPECT_NEAR(total, 1.0, 1e-6);
  }
}

// One row per work item: N = 11 rows split over 1, 2, 3 threads; also in place.
TEST(KernelSoftmaxXent, ThreadCountIndependent) {
  const int N = 11, V = 1000;
  test::TestRng rng(45);
  const std::vector<float> logits = rng.normal_f32(static_cast<std::size_t>(N) * V, 3.0);
  std::vector<std::int32_t> targets(N);
  for (auto& t : targets) t = rng.below(V);
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const Xent r = xent(pool, logits, targets, N, V, 1.0f / N);
        std::vector<float> inplace = logits, losses(N);
        softmax_xent(pool, losses.data(), inplace.data(), inplace.data(), targets.data(), N, V, 1.0f / N);
        return test::concat({&r.losses, &r.dlogits, &losses, &inplace});
      },
      "softmax_xent");
}

}  // namespace
}  // namespace stratum
