// Causal grouped-query attention forward and the KV-cache variant (the backward: attention_backward.cpp;
// the blocks both use: attention_blocks.h). Work items: the forward and the cached variant take one
// (batch, query head) pair each (the forward one 32-row block of a pair where there are fewer
// pairs than threads), the backward one (batch, kv head) pair (it alone writes that kv head's
// dk/dv, summing the group's query heads in increasing order), or splits where there are fewer
// pairs than threads (Note [attention backward items]). All sums inside an item run in a fixed
// order, so results do not depend on the thread count or on the items (Note [deterministic
// partition] in core/thread_pool.h). With KV == H the
// arithmetic is exactly that of the original GPT-2 kernel. No (T, T) matrix: the forward keeps
// two floats per row (Note [softmax row replay]) and both directions walk the sequence in
// 32-row query blocks against 32-key tiles (Note [attention row blocks]), so memory is
// O(T * head_dim) per head and the bits are those of the row-at-a-time kernel it replaced.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/simd.h"
#include "kernels/cpu/attention_blocks.h"
#include "ops/attention_rows.h"

namespace stratum {

namespace {
using namespace attention_detail;
// row[t2] = sum_i x[i] * rows[t2][i] for t2 in [0, n), rows (n, hd) row-major: the same sums in
// the same order as scores_rows (starting from 0, i increasing), computed kLanes rows at
// a time through a small transposed tile so the inner loop runs over contiguous lanes.
STRATUM_SIMD_CLONES
void row_times_rows(float* row, const float* x, const float* rows, int n, int hd) {
  constexpr int kTileI = 64;
  float tile[kTileI][simd::kLanes];  // (i, lane) slice of rows t0.. t0+kLanes, transposed
  for (int t0 = 0; t0 < n; t0 += simd::kLanes) {
    const int w = std::min(simd::kLanes, n - t0);
    float acc[simd::kLanes] = {};
    for (int i0 = 0; i0 < hd; i0 += kTileI) {
      const int iw = std::min(kTileI, hd - i0);
      for (int l = 0; l < simd::kLanes; ++l) {
        // Lanes past n repeat the last row; their sums are discarded.
        const float* src = rows + static_cast<std::size_t>(t0 + std::min(l, w - 1)) * hd + i0;
        for (int i = 0; i < iw; ++i) tile[i][l] = src[i];
      }
      for (int i = 0; i < iw; ++i) {
        const float xi = x[i0 + i];
        for (int l = 0; l < simd::kLanes; ++l) acc[l] += xi * tile[i][l];
      }
    }
    for (int l = 0; l < w; ++l) row[t0 + l] = acc[l];
  }
}

// y (hd) = sum_t2 row[t2] * v[t2], v row t2 at v + t2 * v_stride, t2 increasing.
inline void row_times_v(float* y, const float* row, int n, const float* v, std::size_t v_stride, int hd) {
  for (int i = 0; i < hd; ++i) y[i] = 0.0f;
  for (int t2 = 0; t2 < n; ++t2) {
    const float* vr = v + t2 * v_stride;
    const float a = row[t2];
    for (int i = 0; i < hd; ++i) y[i] += a * vr[i];
  }
}

// Forward items i0..i1: i = (s * H + h) * J + j. With J == 1 an item is every block of sequence
// s's part for query head h; with J > 1 (fewer such pairs than threads) it is the block
// interleaved(j, J) of that part (J: the most blocks a part has). The rows are independent, so
// either gives every row the same bits.
STRATUM_SIMD_CLONES
void attention_forward_items(float* out, float* stats, float* scratch, int slot, const float* qkv, std::size_t i0,
                             std::size_t i1, int J, RowRange rr, QkvLayout lay, ScratchLayout sl,
                             AttentionScores scores) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * hd, T = rr.T;
  std::size_t packed = SIZE_MAX;  // the (b, kvh) whose keys the slot holds
  for (std::size_t i = i0; i < i1; ++i) {
    const std::size_t p = i / J;  // p = (b - first) * H + h
    const SeqRange sr = rr.seq(static_cast<int>(p / lay.H));
    const std::size_t b = rr.first + p / lay.H;
    const int h = static_cast<int>(p % lay.H), kvh = h / group;
    const int q0 = sr.q0;
    int T0a = q0, q1 = sr.q1;  // the item's blocks: [T0a, q1)
    if (J > 1) {
      const int j = interleaved(static_cast<int>(i % J), J);
      if (j >= part_blocks(sr)) continue;
      T0a = q0 + j * kBlockRows;
      q1 = std::min(T0a + kBlockRows, sr.q1);
    }
    const float* base = qkv + b * T * W;
    float* kt = sl.kt(scratch, slot);
    if (packed != b * lay.KV + kvh) {  // a new (batch, kv head)
      pack_head(kt, base + lay.k(kvh), W, sr.q1, hd);
      packed = b * lay.KV + kvh;
    }
    float* rows = sl.rows(scratch, slot);
    const int ld = sl.ld();
    for (int T0 = T0a; T0 < q1; T0 += kBlockRows)
      forward_block(out + (sr.local0 + (T0 - q0)) * out_w + lay.q(h), out_w, stats + ((b * lay.H + h) * T + T0) * 2, rows,
                    base + T0 * W + lay.q(h), W, T0, std::min(kBlockRows, q1 - T0), kt, base + lay.v(kvh), W, hd, ld,
                    scale, scores);
  }
}

// A single new position (decoding) goes row by row against the cache as it is; several (a
// prompt's chunk) go in 32-row blocks against the (batch, kv head)'s keys packed into the slot's
// tiles, at absolute positions past + t. Either way each row's arithmetic is the forward's (Note
// [cached attention bits], Note [attention row blocks]).
STRATUM_SIMD_CLONES
void attention_cached_pairs(float* out, float* scratch, int slot, const float* q, const float* kcache,
                            const float* vcache, std::size_t p0, std::size_t p1, int Tn, const int* past, int max_T,
                            int H, int KV, int hd, ScratchLayout sl, AttentionScores scores) {
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t row_w = static_cast<std::size_t>(H) * hd;
  const int ld = sl.ld();
  float* kt = sl.kt(scratch, slot);
  float* rows = sl.rows(scratch, slot);
  for (std::size_t p = p0; p < p1; ++p) {  // p = b * H + h
    const std::size_t b = p / H;
    const int h = static_cast<int>(p % H), kvh = h / group;
    const std::size_t cache = (b * KV + kvh) * static_cast<std::size_t>(max_T) * hd;
    float stats[2 * kBlockRows];  // not kept
    if (Tn < kRows) {
      for (int t = 0; t < Tn; ++t) {  // Note [sliding window]: keys [lo, n) only
        const int lo = window_first(past[b] + t, scores.window), n = past[b] + t + 1 - lo;
        const std::size_t r = (b * Tn + t) * row_w + static_cast<std::size_t>(h) * hd;
        const std::size_t kv0 = cache + static_cast<std::size_t>(lo) * hd;
        row_times_rows(rows, q + r, kcache + kv0, n, hd);
        softmax_row(rows, 0, 0, n, scale, scores.softcap, stats);
        row_times_v(out + r, rows, n, vcache + kv0, static_cast<std::size_t>(hd), hd);
      }
      continue;
    }
    if (p == p0 || h % group == 0) pack_head(kt, kcache + cache, hd, past[b] + Tn, hd);  // a new (batch, kv head)
    for (int t0 = 0; t0 < Tn; t0 += kBlockRows) {
      const std::size_t r = (b * Tn + t0) * row_w + static_cast<std::size_t>(h) * hd;
      forward_block(out + r, row_w, stats, rows, q + r, row_w, past[b] + t0, std::min(kBlockRows, Tn - t0), kt,
                    vcache + cache, hd, hd, ld, scale, scores);
    }
  }
}
}  // namespace

std::size_t attention_scratch_floats(int B, int T, int H, int KV, int hd, int threads) {
  attention_check_shape("attention_scratch_floats", B, T, H, KV, hd);
  STRATUM_CHECK(threads >= 1, "[kernels.attention] attention_scratch_floats: threads must be >= 1, got ", threads);
  // The slots, then the split backward's row sums (Note [attention backward items]).
  return static_cast<std::size_t>(threads) * ScratchLayout{std::size_t(T), std::size_t(hd)}.slot_floats() +
         static_cast<std::size_t>(B) * H * T;
}

void attention_forward(ThreadPool& pool, float* out, float* stats, float* scratch, const float* qkv, int B, int T,
                       int H, int KV, int hd, int r0, int n, AttentionScores scores) {
  attention_check_shape("attention_forward", B, T, H, KV, hd);
  attention_check_scores("attention_forward", scores);
  const RowRange rr = attention_row_range("attention_forward", B, T, r0, n);
  const QkvLayout lay{H, KV, hd};
  const ScratchLayout sl{std::size_t(T), std::size_t(hd)};
  // The blocks of a (sequence, query head) pair are items too where pairs < threads.
  const int J = static_cast<std::size_t>(rr.seqs) * H < static_cast<std::size_t>(pool.num_threads())
                    ? most_part_blocks(rr)
                    : 1;
  for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * H * J, [&](int slot, std::size_t i0, std::size_t i1) {
    attention_forward_items(out, stats, scratch, slot, qkv, i0, i1, J, rr, lay, sl, scores);
  });
}

std::size_t attention_cached_scratch_floats(int hd, int max_T, int threads) {
  STRATUM_CHECK(hd > 0 && max_T > 0 && threads >= 1, "[kernels.attention] attention_cached_scratch_floats: bad shape hd ",
                hd, " max_T ", max_T, " threads ", threads);
  return static_cast<std::size_t>(threads) * ScratchLayout{std::size_t(max_T), std::size_t(hd)}.slot_floats();
}

void attention_cached(ThreadPool& pool, float* out, float* scratch, const float* q, const float* kcache,
                      const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV, int hd,
                      AttentionScores scores) {
  attention_check_shape("attention_cached", B, Tn, H, KV, hd);
  attention_check_scores("attention_cached", scores);
  for (int b = 0; b < B; ++b)
    STRATUM_CHECK(past[b] >= 0 && past[b] <= max_T - Tn, "[kernels.attention] attention_cached: sequence ", b,
                  " has ", past[b], " cached positions + ", Tn, " new ones, beyond the cache's max_T ", max_T);
  const ScratchLayout sl{std::size_t(max_T), std::size_t(hd)};
  for_each_slot(pool, static_cast<std::size_t>(B) * H, [&](int slot, std::size_t p0, std::size_t p1) {
    attention_cached_pairs(out, scratch, slot, q, kcache, vcache, p0, p1, Tn, past, max_T, H, KV, hd, sl, scores);
  });
}

}  // namespace stratum
