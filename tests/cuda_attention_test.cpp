// Cross-backend tests of the CUDA attention (src/kernels/cuda/attention.cu, attention_backward.cu)
// against the CPU backend (the reference, Note [ops seam]) on the same random inputs: the forward's
// output and softmax row statistics and the backward's dqkv for the GPT-2 form (H == KV) and
// grouped-query attention (H = 4 on KV = 2 and KV = 1), odd sequence lengths (1, 7, 67, 130) and
// head sizes 4, 8, 64, 96, 128; a 1024-position sequence; sequences long enough that the products
// run in several query blocks and head batches (Note [cuda attention products]); the KV-cache
// variant against the CPU's and against the GPU's own forward, with a different past per
// sequence; run-to-run bit identity, whole and in row ranges (Note [cuda determinism]); head
// sizes above 128 refused. Outputs and scratch start as NaN on the device, so an element left
// unwritten or a scratch value read before it is written fails. Skipped where this build or
// machine has no CUDA.
// Tolerance (scaled error |got - ref| / (1 + |ref|)): 1e-5 for out, stats and dqkv. The
// differences are cuBLAS's sums over the head dimension, the keys and the queries against the
// CPU's running sums, the GPU's expf against the CPU's polynomial exp (a few ulp), and the
// cached variant's online softmax against the products' two passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cross_backend_util.h"
#include "stratum/error.h"
#include "test_util.h"

namespace stratum {
namespace {

using test::CrossBackend;
using test::DeviceVec;
using test::expect_close;
using test::expect_same_bits;
using test::TestRng;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kTol = 1e-5;

struct Shape {
  int B, T, H, KV, hd;
  std::size_t width() const { return static_cast<std::size_t>(H + 2 * KV) * hd; }
  std::size_t qkv() const { return static_cast<std::size_t>(B) * T * width(); }
  std::size_t out() const { return static_cast<std::size_t>(B) * T * H * hd; }
  std::size_t stats() const { return static_cast<std::size_t>(B) * H * T * 2; }
  std::string tag() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd);
  }
};

struct AttRun {
  std::vector<float> out, stats, dqkv;
};

// Query row ranges [first, second) in increasing order (Note [attention row ranges]); empty: one
// call for every row.
using Ranges = std::vector<std::pair<int, int>>;
Ranges whole(const Shape& s) { return {{0, s.B * s.T}}; }

AttRun cpu_run(const CrossBackend& xb, const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
               Ranges ranges = {}) {
  if (ranges.empty()) ranges = whole(s);
  AttRun r{std::vector<float>(s.out(), kNaN), std::vector<float>(s.stats(), kNaN), std::vector<float>(s.qkv(), kNaN)};
  std::vector<float> scratch(xb.cpu().attention_scratch_floats(s.B, s.T, s.H, s.KV, s.hd), kNaN);
  const std::size_t row = static_cast<std::size_t>(s.H) * s.hd;
  for (auto [r0, r1] : ranges)
    xb.cpu().attention_forward(r.out.data() + r0 * row, r.stats.data(), scratch.data(), qkv.data(), s.B, s.T, s.H,
                               s.KV, s.hd, r0, r1 - r0, {});
  for (auto [r0, r1] : ranges)
    xb.cpu().attention_backward(r.dqkv.data(), scratch.data(), dout.data() + r0 * row, qkv.data(), r.stats.data(), s.B,
                                s.T, s.H, s.KV, s.hd, r0, r1 - r0, {});
  return r;
}

// The GPU's forward and, from its own statistics, its backward.
AttRun gpu_run(const CrossBackend& xb, const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
               Ranges ranges = {}) {
  if (ranges.empty()) ranges = whole(s);
  const auto d_qkv = CrossBackend::up(qkv), d_dout = CrossBackend::up(dout);
  const auto d_out = CrossBackend::filled<float>(s.out(), kNaN), d_stats = CrossBackend::filled<float>(s.stats(), kNaN);
  const auto d_dqkv = CrossBackend::filled<float>(s.qkv(), kNaN);
  const auto d_scratch =
      CrossBackend::filled<float>(xb.gpu().attention_scratch_floats(s.B, s.T, s.H, s.KV, s.hd), kNaN);
  const std::size_t row = static_cast<std::size_t>(s.H) * s.hd;
  for (auto [r0, r1] : ranges)
    xb.gpu().attention_forward(d_out.d() + r0 * row, d_stats.d(), d_scratch.d(), d_qkv.d(), s.B, s.T, s.H, s.KV, s.hd,
                               r0, r1 - r0, {});
  for (auto [r0, r1] : ranges)
    xb.gpu().attention_backward(d_dqkv.d(), d_scratch.d(), d_dout.d() + r0 * row, d_qkv.d(), d_stats.d(), s.B, s.T,
                                s.H, s.KV, s.hd, r0, r1 - r0, {});
  return {CrossBackend::down(d_out), CrossBackend::down(d_stats), CrossBackend::down(d_dqkv)};
}

void expect_matches_cpu(const CrossBackend& xb, const Shape& s, TestRng& rng) {
  const std::vector<float> qkv = rng.normal_f32(s.qkv());
  const std::vector<float> dout = rng.normal_f32(s.out());
  const AttRun want = cpu_run(xb, s, qkv, dout);
  const AttRun got = gpu_run(xb, s, qkv, dout);
  expect_close(got.out, want.out, kTol, s.tag() + " out");
  expect_close(got.stats, want.stats, kTol, s.tag() + " stats");
  expect_close(got.dqkv, want.dqkv, kTol, s.tag() + " dqkv");
}

TEST(CudaAttention, Gpt2FormMatchesCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(301);
  for (int T : {1, 7, 67, 130})
    for (int hd : {4, 8, 64, 96, 128}) expect_matches_cpu(xb, {2, T, 2, 2, hd}, rng);
}

TEST(CudaAttention, GroupedQueryMatchesCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(302);
  for (int KV : {2, 1})
    for (int T : {1, 7, 67, 130})
      for (int hd : {4, 8, 64, 96, 128}) expect_matches_cpu(xb, {2, T, 4, KV, hd}, rng);
}

TEST(CudaAttention, LongSequenceMatchesCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(303);
  expect_matches_cpu(xb, {1, 1024, 2, 2, 64}, rng);
  expect_matches_cpu(xb, {1, 300, 4, 2, 128}, rng);
}

// Note [cuda attention products]: a sequence of 1300 positions runs in query blocks of 1024 and
// 276 rows (the second block's dk and dv continuing the first's sums, grouped heads included);
// one of 4096 positions in batches of 3 and 1 of its 4 kv heads.
TEST(CudaAttention, QueryBlocksAndHeadBatchesMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(307);
  expect_matches_cpu(xb, {1, 1300, 4, 2, 16}, rng);
  expect_matches_cpu(xb, {2, 1300, 2, 2, 32}, rng);
  expect_matches_cpu(xb, {1, 4096, 4, 4, 16}, rng);
}

TEST(CudaAttention, RunToRunBitsIdentical) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(304);
  for (const Shape& s : {Shape{2, 130, 4, 4, 64}, Shape{2, 130, 4, 2, 64}, Shape{1, 200, 4, 1, 128}}) {
    const std::vector<float> qkv = rng.normal_f32(s.qkv());
    const std::vector<float> dout = rng.normal_f32(s.out());
    const AttRun a = gpu_run(xb, s, qkv, dout);
    const AttRun b = gpu_run(xb, s, qkv, dout);
    expect_same_bits(b.out, a.out, s.tag() + " out");
    expect_same_bits(b.stats, a.stats, s.tag() + " stats");
    expect_same_bits(b.dqkv, a.dqkv, s.tag() + " dqkv");
  }
}

// Tn new positions per sequence at past[b].. against a cache holding the k/v of a full sequence of
// T positions (NaN past past[b] + Tn, which the op must not read): matches the CPU's cached
// variant and the GPU forward's row at that position (to rounding: Note [cuda attention rows]).
TEST(CudaAttention, CachedMatchesCpuAndForward) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(305);
  const int B = 2, T = 100, max_T = 104;
  for (const auto& [H, KV] : {std::pair{4, 2}, std::pair{2, 2}})
    for (int hd : {8, 64}) {
      const Shape s{B, T, H, KV, hd};
      const std::size_t W = s.width(), Q = static_cast<std::size_t>(H) * hd;
      const std::vector<float> qkv = rng.normal_f32(s.qkv());
      const AttRun full = gpu_run(xb, s, qkv, rng.normal_f32(s.out()));
      for (int Tn : {1, 3, 70}) {
        const std::vector<int> past = {T - Tn, std::max(0, T - Tn - 5)};
        const std::string tag = s.tag() + " Tn=" + std::to_string(Tn);
        std::vector<float> kcache(static_cast<std::size_t>(B) * KV * max_T * hd, kNaN), vcache(kcache.size(), kNaN);
        std::vector<float> q(static_cast<std::size_t>(B) * Tn * Q), want_fwd(q.size());
        for (int b = 0; b < B; ++b) {
          for (int j = 0; j < KV; ++j)
            for (int t = 0; t < past[b] + Tn; ++t) {
              const float* row = qkv.data() + (static_cast<std::size_t>(b) * T + t) * W;
              const std::size_t at = ((static_cast<std::size_t>(b) * KV + j) * max_T + t) * hd;
              std::copy_n(row + Q + static_cast<std::size_t>(j) * hd, hd, kcache.begin() + at);
              std::copy_n(row + Q + static_cast<std::size_t>(KV + j) * hd, hd, vcache.begin() + at);
            }
          for (int t = 0; t < Tn; ++t) {
            const std::size_t pos = static_cast<std::size_t>(b) * T + past[b] + t;
            const std::size_t r = (static_cast<std::size_t>(b) * Tn + t) * Q;
            std::copy_n(qkv.begin() + pos * W, Q, q.begin() + r);
            std::copy_n(full.out.begin() + pos * Q, Q, want_fwd.begin() + r);
          }
        }
        std::vector<float> want(q.size(), kNaN);
        std::vector<float> scratch(xb.cpu().attention_cached_scratch_floats(hd, max_T), kNaN);
        xb.cpu().attention_cached(want.data(), scratch.data(), q.data(), kcache.data(), vcache.data(), B, Tn,
                                  past.data(), max_T, H, KV, hd, {});
        const auto d_q = CrossBackend::up(q), d_k = CrossBackend::up(kcache), d_v = CrossBackend::up(vcache);
        const auto d_past = CrossBackend::up(past);
        const auto d_out = CrossBackend::filled<float>(q.size(), kNaN);
        const auto d_scratch = CrossBackend::filled<float>(xb.gpu().attention_cached_scratch_floats(hd, max_T), kNaN);
        xb.gpu().attention_cached(d_out.d(), d_scratch.d(), d_q.d(), d_k.d(), d_v.d(), B, Tn, d_past.d(), max_T, H,
                                  KV, hd, {});
        const std::vector<float> got = CrossBackend::down(d_out);
        expect_close(got, want, kTol, tag + " cached vs cpu");
        expect_close(got, want_fwd, kTol, tag + " cached vs gpu forward");
      }
    }
}

// The device cannot throw: a sequence whose past leaves no room for Tn new positions gets NaN
// rows, the others are computed as usual.
TEST(CudaAttention, CachedPastOutOfRangeGivesNaN) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(306);
  const int B = 2, Tn = 2, max_T = 8, H = 2, KV = 1, hd = 8;
  const std::size_t row = static_cast<std::size_t>(H) * hd;
  const auto d_q = CrossBackend::up(rng.normal_f32(B * Tn * row));
  const auto d_k = CrossBackend::up(rng.normal_f32(static_cast<std::size_t>(B) * KV * max_T * hd));
  const auto d_v = CrossBackend::up(rng.normal_f32(static_cast<std::size_t>(B) * KV * max_T * hd));
  const auto d_past = CrossBackend::up(std::vector<int>{3, max_T - Tn + 1});
  const auto d_out = CrossBackend::filled<float>(B * Tn * row, 0.0f);
  const auto d_scratch = CrossBackend::filled<float>(xb.gpu().attention_cached_scratch_floats(hd, max_T), kNaN);
  xb.gpu().attention_cached(d_out.d(), d_scratch.d(), d_q.d(), d_k.d(), d_v.d(), B, Tn, d_past.d(), max_T, H, KV, hd, {});
  const std::vector<float> out = CrossBackend::down(d_out);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i < Tn * row)
      EXPECT_FALSE(std::isnan(out[i])) << "sequence 0, element " << i;
    else
      EXPECT_TRUE(std::isnan(out[i])) << "sequence 1, element " << i;
  }
}

// Note [attention row ranges]: ranges in increasing order (splitting sequences inside a tile,
// across a sequence boundary, one row) give the whole pass's values (to rounding: the products'
// shapes differ, Note [cuda attention products]), grouped heads included, and the CPU's values;
// the same ranges give the same bits run to run; and the CPU's own ranges its whole-pass bits with
// KV == H.
TEST(CudaAttention, RowRangesMatchTheWholePass) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(317);
  for (const Shape& s : {Shape{2, 130, 2, 2, 64}, Shape{2, 130, 4, 2, 32}, Shape{3, 45, 8, 2, 16}}) {
    const int BT = s.B * s.T;
    const Ranges ranges{{0, 37}, {37, 38}, {38, s.T + 5}, {s.T + 5, BT - 3}, {BT - 3, BT}};
    const std::vector<float> qkv = rng.normal_f32(s.qkv());
    const std::vector<float> dout = rng.normal_f32(s.out());
    const AttRun all = gpu_run(xb, s, qkv, dout), ranged = gpu_run(xb, s, qkv, dout, ranges);
    expect_close(ranged.out, all.out, kTol, s.tag() + " out, ranged vs whole");
    expect_close(ranged.stats, all.stats, kTol, s.tag() + " stats, ranged vs whole");
    expect_close(ranged.dqkv, all.dqkv, kTol, s.tag() + " dqkv, ranged vs whole");
    const AttRun again = gpu_run(xb, s, qkv, dout, ranges);
    expect_same_bits(again.out, ranged.out, s.tag() + " out, ranged twice");
    expect_same_bits(again.stats, ranged.stats, s.tag() + " stats, ranged twice");
    expect_same_bits(again.dqkv, ranged.dqkv, s.tag() + " dqkv, ranged twice");
    const AttRun cpu = cpu_run(xb, s, qkv, dout, ranges);
    expect_close(ranged.out, cpu.out, kTol, s.tag() + " out");
    expect_close(ranged.dqkv, cpu.dqkv, kTol, s.tag() + " dqkv");
    if (s.H == s.KV) {
      EXPECT_EQ(cpu.dqkv, cpu_run(xb, s, qkv, dout).dqkv) << s.tag();
    }
  }
}

TEST(CudaAttention, RejectsHeadSizeAbove128) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  EXPECT_THROW(xb.gpu().attention_scratch_floats(1, 4, 2, 2, 129), Error);
  EXPECT_THROW(xb.gpu().attention_forward(nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 2, 129, 0, 4, AttentionScores{}), Error);
  EXPECT_THROW(xb.gpu().attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 2, 129, 0, 4, AttentionScores{}), Error);
  EXPECT_THROW(xb.gpu().attention_forward(nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 2, 64, 2, 3, AttentionScores{}), Error);  // rows
  EXPECT_THROW(xb.gpu().attention_cached_scratch_floats(129, 16), Error);
  EXPECT_THROW(xb.gpu().attention_forward(nullptr, nullptr, nullptr, nullptr, 1, 4, 3, 2, 64, 0, 4, AttentionScores{}), Error);  // H % KV
}

}  // namespace
}  // namespace stratum
