// The CPU attention kernels' shared pieces (kernels/cpu/attention.cpp: the forward and the
// KV-cache variant; attention_backward.cpp: the backward): the qkv row layout, the per-thread
// scratch, packed key tiles, the 32-row block helpers (Note [attention row blocks]) and the
// softmax row passes (Note [softmax row replay], Note [sliding window], Note [softcapping]). For
// those two files only: everything here is inlined into their SIMD clones.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/simd.h"
#include "core/thread_pool.h"
#include "ops/attention_rows.h"

// The V16 helpers below are always inlined into their ISA clone: no vector crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace stratum::attention_detail {
// The qkv row layout: [q (H*hd) | k (KV*hd) | v (KV*hd)].
struct QkvLayout {
  int H, KV, hd;
  std::size_t width() const { return static_cast<std::size_t>(H + 2 * KV) * hd; }
  std::size_t q(int h) const { return static_cast<std::size_t>(h) * hd; }
  std::size_t k(int kvh) const { return static_cast<std::size_t>(H + kvh) * hd; }
  std::size_t v(int kvh) const { return static_cast<std::size_t>(H + KV + kvh) * hd; }
};

// Query rows per block and per register sub-block (Note [attention row blocks]).
constexpr int kBlockRows = 32;
constexpr int kRows = 4;

// Note [softmax row replay]: a score row becomes probabilities in three elementwise passes (scale;
// exp of the difference to the row's maximum; times the inverse of the exps' sum) and two
// reductions (the maximum, the sum). The forward keeps the two reduction results per row (the
// (B,H,T,2) stats) instead of the probabilities; the backward recomputes the scores with the
// same arithmetic and replays the three passes with the kept values, so its probabilities are the
// forward's bit for bit (-ffp-contract=off: each pass is the same float operations in every
// clone) and no (T, T) matrix is ever held.
inline void scale_row(float* row, int n, float scale) {
  for (int t2 = 0; t2 < n; ++t2) row[t2] *= scale;
}
inline void exp_row(float* row, int n, float mx) {
  for (int t2 = 0; t2 < n; ++t2) row[t2] = simd::exp_f32(row[t2] - mx);
}
inline void mul_row(float* row, int n, float inv) {
  for (int t2 = 0; t2 < n; ++t2) row[t2] *= inv;
}

// Note [sliding window]: with a window W > 0 the query at position t attends to the keys lo(t) =
// max(0, t - W + 1) .. t only (Gemma 3's sliding layers: transformers' i - j < W). A block of rows
// T0.. starts at the key tile holding lo(T0), its first row's first key (block_first_key): the
// tiles before it are never read, so a sliding layer costs O(T * (W + 2 kKeyTile)) instead of
// O(T^2). Inside the tiles it reads, the keys before a row's lo(t) still get scores (the tiles are
// shared by the rows), but the softmax (and its replay) runs over [lo(t), t] and their
// probabilities are set to 0, so every product with them adds a zero to a sum that started from
// +0.0f and has only ever added zeros (still +0.0f, as if it started at the row's first key): the
// bits of attending to [lo(t), t] alone, whatever the blocking (the test compares each row with
// an unwindowed call on its window's keys alone), and a window of at least t + 1 keys gives
// exactly the unwindowed arithmetic.
inline int window_first(int t, int window) { return window > 0 && t >= window ? t - window + 1 : 0; }
// The first key (a multiple of kKeyTile) a block of rows from T0 reads: Note [sliding window].
constexpr int kKeyTile = 32;  // keys per packed tile (Note [attention row blocks])
inline int block_first_key(int T0, int window) { return window_first(T0, window) / kKeyTile * kKeyTile; }
static_assert(kCacheShiftAlign % kKeyTile == 0, "a shifted KV cache must keep the key tiles (Note [sliding KV cache])");

// Note [softcapping]: Gemma 2 caps every scaled score s at softcap * tanh(s / softcap) before the
// softmax (transformers' Gemma2Attention: divide, tanh, multiply; tanh by simd::tanh_f32, as GELU
// takes it). The forward's softmax and the backward's replay run cap_row after scale_row with the
// same operations, so the replayed probabilities stay the forward's bits; the replay also keeps
// each t = tanh(s / softcap) in a third block of rows (ScratchLayout::caps), and the softmax's
// gradient g of a capped score goes back through the cap in autograd's order, ((g * softcap) *
// (1 - t * t)) / softcap, before the scale. The cached variant caps as the forward does.
inline void cap_row(float* row, int n, float cap, float* tanh_out) {
  for (int t2 = 0; t2 < n; ++t2) {
    const float t = simd::tanh_f32(row[t2] / cap);
    if (tanh_out != nullptr) tanh_out[t2] = t;
    row[t2] = t * cap;
  }
}

// Scores of row[lo..n) -> softmax probabilities in place (Note [softmax row replay]), row[c0..lo)
// -> 0 (the keys outside the window its block still reads from c0, Note [sliding window]); stats
// receives {max of the scaled (and capped: cap > 0, Note [softcapping]) scores, 1 / sum of the
// exps}. Shared by the forward and the cached variant (Note [cached attention bits]).
inline void softmax_row(float* row, int c0, int lo, int n, float scale, float cap, float* stats) {
  std::fill(row + c0, row + lo, 0.0f);
  row += lo;
  n -= lo;
  scale_row(row, n, scale);
  if (cap > 0.0f) cap_row(row, n, cap, nullptr);
  const float mx = simd::max_f32(row, n);
  exp_row(row, n, mx);
  const float inv = 1.0f / simd::sum_f32(row, n);
  mul_row(row, n, inv);
  stats[0] = mx;
  stats[1] = inv;
}

// The scratch: one slot per thread (Note [deterministic partition]: parallel_for's ranges are
// contiguous and in order, one per thread), each [K tiles | V tiles | rows | dk dv]. The keys and
// values of the (batch, kv head) being worked on are packed in tiles of kKeyTile keys, tile j
// holding key j*kKeyTile + l's element i at i * kKeyTile + l (zeros past T), so a block of scores
// reads one contiguous tile per kKeyTile keys.
struct ScratchLayout {
  std::size_t T, hd;
  std::size_t padded() const { return (T + kKeyTile - 1) / kKeyTile * kKeyTile; }
  // Rows of ld >= T floats: min(kBlockRows, T) score rows for the forward, three times that
  // (probabilities, gradients, and the capped scores' tanh: Note [softcapping]) for the backward. ld is T rounded up to 16, plus 16 where that is
  // a multiple of 4 KiB: the rows of a block, read down a column, then fall into different cache
  // sets.
  std::size_t block_rows() const { return std::min<std::size_t>(kBlockRows, T); }
  int ld() const {
    const std::size_t r = (T + 15) / 16 * 16;
    return static_cast<int>(r % 1024 == 0 ? r + 16 : r);
  }
  std::size_t slot_floats() const { return 2 * hd * padded() + 3 * block_rows() * ld() + 2 * T * hd; }
  float* kt(float* s, int slot) const { return s + slot * slot_floats(); }
  float* vt(float* s, int slot) const { return kt(s, slot) + hd * padded(); }
  float* rows(float* s, int slot) const { return vt(s, slot) + hd * padded(); }
  // The backward's dk and dv sums of a (batch, kv head), (T, hd) each, contiguous.
  float* dkv(float* s, int slot) const { return rows(s, slot) + 3 * block_rows() * ld(); }
  // After the slots: the backward's (B, H, T) row sums sum_j p_j datt_j when it splits its items
  // (Note [attention backward items]).
  float* row_sums(float* s, int slots) const { return s + static_cast<std::size_t>(slots) * slot_floats(); }
};

// Item j of n in an order that pairs the cheapest with the dearest (0, n-1, 1, n-2, ...): causal
// blocks cost more the later they sit (query blocks) or the earlier (key ranges), and
// parallel_for hands each thread a contiguous range of items.
inline int interleaved(int j, int n) { return j % 2 == 0 ? j / 2 : n - 1 - j / 2; }

// The 32-row blocks of a sequence's part of a row range, and the most any part of rr has (at
// least 1): the block items' count per (sequence, head) where pairs are fewer than threads.
inline int part_blocks(const SeqRange& sr) { return (sr.q1 - sr.q0 + kBlockRows - 1) / kBlockRows; }
inline int most_part_blocks(const RowRange& rr) {
  int most = 1;
  for (int s = 0; s < rr.seqs; ++s) most = std::max(most, part_blocks(rr.seq(s)));
  return most;
}

// dst = the head's slice of rows [0, T) of src (row t2 at base + t2 * stride) in key tiles.
inline void pack_head(float* dst, const float* base, std::size_t stride, int T, int hd) {
  for (int c0 = 0; c0 < T; c0 += kKeyTile) {
    float* tile = dst + static_cast<std::size_t>(c0) * hd;
    const int w = std::min(kKeyTile, T - c0);
    for (int l = 0; l < kKeyTile; ++l)
      for (int i = 0; i < hd; ++i) tile[i * kKeyTile + l] = l < w ? base[(c0 + l) * stride + i] : 0.0f;
  }
}

// fn(slot, p0, p1) on pool.num_threads() contiguous ranges of [0, n) in order, one per scratch slot.
template <class Fn>
inline void for_each_slot(ThreadPool& pool, std::size_t n, const Fn& fn) {
  const std::size_t slots = static_cast<std::size_t>(pool.num_threads());
  pool.parallel_for(slots, [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s) {
      const std::size_t p0 = s * n / slots, p1 = (s + 1) * n / slots;
      if (p0 < p1) fn(static_cast<int>(s), p0, p1);
    }
  });
}

// Note [attention row blocks]: the forward and the backward take kBlockRows query rows at a time
// (FlashAttention's query tile) and walk the keys tile by tile (kKeyTile keys), each tile feeding
// every kRows-row sub-block of the block from registers while it sits in L1; a key's dk/dv rows
// are updated once per block, not once per row. No output element changes its float operations
// or their order: sums over the head dimension start from 0.0f with i increasing; sums over keys
// run with t2 increasing (a partial sum stored between tiles and reloaded is the same float); a
// key's dk/dv sum over query rows with t increasing, group heads in increasing order; mul and
// add round separately (-ffp-contract=off). So the blocking changes the speed and not the bits,
// and the cached variant (one row at a time) still matches the forward (Note [cached attention
// bits]).
using V16 = float __attribute__((vector_size(64)));  // GCC lowers it to what each clone has
static_assert(simd::kLanes == 16 && kKeyTile == 32);

#define STRATUM_INLINE inline __attribute__((always_inline))

STRATUM_INLINE V16 load16(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
STRATUM_INLINE void store16(float* p, V16 v) { std::memcpy(p, &v, sizeof v); }

// out[r][c0 + l] (row r at out + r * ld) = sum_i x[r][i] * key (c0 + l)'s element i, for the R rows
// x[r] = x + r * x_stride and l < w; tile: the packed key tile of c0 (pack_head). As
// row_times_rows does for the cached variant, each sum starts from 0.0f with i increasing.
template <int R>
STRATUM_INLINE void score_tile(float* out, const float* x, std::size_t x_stride, const float* tile, int c0, int w,
                               int hd, int ld) {
  V16 acc[R][2] = {};
  for (int i = 0; i < hd; ++i) {
    const V16 k0 = load16(tile + i * kKeyTile), k1 = load16(tile + i * kKeyTile + 16);
    for (int r = 0; r < R; ++r) {
      const float xi = x[r * x_stride + i];
      acc[r][0] += xi * k0;
      acc[r][1] += xi * k1;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = out + static_cast<std::size_t>(r) * ld + c0;
    if (w == kKeyTile) {
      store16(o, acc[r][0]);
      store16(o + 16, acc[r][1]);
    } else {
      float tmp[kKeyTile];
      store16(tmp, acc[r][0]);
      store16(tmp + 16, acc[r][1]);
      std::copy_n(tmp, w, o);
    }
  }
}

// Scores of the block's nb query rows T0.. (row r: x + r * x_stride) against keys [first, T0 + r]
// at least (below `last`), into out (nb, ld); tiles: the packed keys; first, and last where it is
// below T0 + nb: multiples of kKeyTile.
STRATUM_INLINE void block_scores(float* out, const float* x, std::size_t x_stride, int T0, int nb,
                                 const float* tiles, int hd, int ld, int first, int last) {
  for (int c0 = first; c0 < std::min(last, T0 + nb); c0 += kKeyTile) {
    const float* tile = tiles + static_cast<std::size_t>(c0) * hd;
    int r = 0;
    for (; r + kRows <= nb; r += kRows)
      if (c0 < T0 + r + kRows)
        score_tile<kRows>(out + static_cast<std::size_t>(r) * ld, x + r * x_stride, x_stride, tile, c0,
                          std::min(kKeyTile, T0 + r + kRows - c0), hd, ld);
    for (; r < nb; ++r)
      if (c0 <= T0 + r)
        score_tile<1>(out + static_cast<std::size_t>(r) * ld, x + r * x_stride, x_stride, tile, c0,
                      std::min(kKeyTile, T0 + r + 1 - c0), hd, ld);
  }
}

// y[r][i0 + i] (row r at y + r * y_stride) (+)= sum over t2 in [c0, c1) with t2 <= t0 + r of
// p[r][t2] * v[t2][i0 + i] for i < 16 * NV, t2 increasing (row r of p at p + r * ld, v row t2
// at v + t2 * v_stride); from 0.0f when `first`, else onto y's partial sums.
template <int R, int NV>
STRATUM_INLINE void probs_tile_vectors(float* y, std::size_t y_stride, const float* p, int t0, int c0, int c1,
                                       const float* v, std::size_t v_stride, int i0, int ld, bool first) {
  const int common = std::min(c1, t0 + 1);  // keys every row attends to
  V16 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = first ? V16{} : load16(y + r * y_stride + i0 + 16 * j);
  for (int t2 = c0; t2 < common; ++t2) {
    const float* vr = v + t2 * v_stride + i0;
    V16 vv[NV];
    for (int j = 0; j < NV; ++j) vv[j] = load16(vr + 16 * j);
    for (int r = 0; r < R; ++r) {
      const float a = p[static_cast<std::size_t>(r) * ld + t2];
      for (int j = 0; j < NV; ++j) acc[r][j] += a * vv[j];
    }
  }
  for (int r = 1; r < R; ++r)  // the causal triangle's rest
    for (int t2 = std::max(c0, t0 + 1); t2 < std::min(c1, t0 + r + 1); ++t2) {
      const float* vr = v + t2 * v_stride + i0;
      const float a = p[static_cast<std::size_t>(r) * ld + t2];
      for (int j = 0; j < NV; ++j) acc[r][j] += a * load16(vr + 16 * j);
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) store16(y + r * y_stride + i0 + 16 * j, acc[r][j]);
}

// probs_tile_vectors over the whole head dimension: 32 lanes at a time, then 16, then scalars.
template <int R>
STRATUM_INLINE void probs_tile(float* y, std::size_t y_stride, const float* p, int t0, int c0, int c1,
                               const float* v, std::size_t v_stride, int hd, int ld, bool first) {
  int i0 = 0;
  for (; i0 + 32 <= hd; i0 += 32) probs_tile_vectors<R, 2>(y, y_stride, p, t0, c0, c1, v, v_stride, i0, ld, first);
  for (; i0 + 16 <= hd; i0 += 16) probs_tile_vectors<R, 1>(y, y_stride, p, t0, c0, c1, v, v_stride, i0, ld, first);
  for (; i0 < hd; ++i0)
    for (int r = 0; r < R; ++r) {
      float acc = first ? 0.0f : y[r * y_stride + i0];
      for (int t2 = c0; t2 < std::min(c1, t0 + r + 1); ++t2)
        acc += p[static_cast<std::size_t>(r) * ld + t2] * v[t2 * v_stride + i0];
      y[r * y_stride + i0] = acc;
    }
}

// y rows of the block's nb query rows T0.. = their p rows times v (probs_tile), keys tile by tile
// from first (a multiple of kKeyTile: the p of the keys before it are 0, Note [sliding window]).
STRATUM_INLINE void block_probs_times(float* y, std::size_t y_stride, const float* p, int T0, int nb,
                                      const float* v, std::size_t v_stride, int hd, int ld, int first) {
  for (int c0 = first; c0 < T0 + nb; c0 += kKeyTile) {
    const int c1 = std::min(c0 + kKeyTile, T0 + nb);
    int r = 0;
    for (; r + kRows <= nb; r += kRows)
      if (c0 < T0 + r + kRows)
        probs_tile<kRows>(y + r * y_stride, y_stride, p + static_cast<std::size_t>(r) * ld, T0 + r, c0, c1, v,
                          v_stride, hd, ld, c0 == first);
    for (; r < nb; ++r)
      if (c0 <= T0 + r)
        probs_tile<1>(y + r * y_stride, y_stride, p + static_cast<std::size_t>(r) * ld, T0 + r, c0, c1, v, v_stride,
                      hd, ld, c0 == first);
  }
}

// Keys t2 and t2 + 1 of block_rank_update over the NV vectors of the head dimension at i0: two
// keys' rows at once give 2 * NV independent sums (each one still over r in increasing order),
// enough to hide the add latency. r0, r1: the first row of the block attending to t2, t2 + 1.
template <int NV>
STRATUM_INLINE void rank_update_pair(float* d0, float* d1, const float* c, int t2, int r0, int r1, int nb,
                                     const float* x, std::size_t x_stride, int i0, int ld) {
  V16 a0[NV], a1[NV];
  for (int j = 0; j < NV; ++j) a0[j] = load16(d0 + i0 + 16 * j), a1[j] = load16(d1 + i0 + 16 * j);
  for (int r = r0; r < r1; ++r) {  // rows that attend to t2 but not to t2 + 1
    const float c0 = c[static_cast<std::size_t>(r) * ld + t2];
    for (int j = 0; j < NV; ++j) a0[j] += c0 * load16(x + r * x_stride + i0 + 16 * j);
  }
  for (int r = r1; r < nb; ++r) {
    const float c0 = c[static_cast<std::size_t>(r) * ld + t2], c1 = c[static_cast<std::size_t>(r) * ld + t2 + 1];
    for (int j = 0; j < NV; ++j) {
      const V16 xv = load16(x + r * x_stride + i0 + 16 * j);
      a0[j] += c0 * xv;
      a1[j] += c1 * xv;
    }
  }
  for (int j = 0; j < NV; ++j) store16(d0 + i0 + 16 * j, a0[j]), store16(d1 + i0 + 16 * j, a1[j]);
}

// dst[t2][i] += c[r][t2] * x[r][i] for t2 in [first, min(last, T0 + nb)), the block's rows r with
// t2 <= T0 + r in increasing order (row r of c at c + r * ld, x[r] at x + r * x_stride, dst row t2
// at dst + (t2 - first) * d_stride); the c of the keys before first are 0 (Note [sliding window]).
STRATUM_INLINE void block_rank_update(float* dst, std::size_t d_stride, const float* c, int T0, int nb,
                                      const float* x, std::size_t x_stride, int hd, int ld, int first, int last) {
  auto first_row = [&](int t2) { return t2 > T0 ? t2 - T0 : 0; };
  const int end = std::min(last, T0 + nb);
  int t2 = first;
  for (; t2 + 2 <= end; t2 += 2) {
    float* d0 = dst + static_cast<std::size_t>(t2 - first) * d_stride;
    float* d1 = d0 + d_stride;
    const int r0 = first_row(t2), r1 = first_row(t2 + 1);
    int i0 = 0;
    for (; i0 + 64 <= hd; i0 += 64) rank_update_pair<4>(d0, d1, c, t2, r0, r1, nb, x, x_stride, i0, ld);
    for (; i0 + 16 <= hd; i0 += 16) rank_update_pair<1>(d0, d1, c, t2, r0, r1, nb, x, x_stride, i0, ld);
    for (; i0 < hd; ++i0) {
      for (int r = r0; r < nb; ++r) d0[i0] += c[static_cast<std::size_t>(r) * ld + t2] * x[r * x_stride + i0];
      for (int r = r1; r < nb; ++r) d1[i0] += c[static_cast<std::size_t>(r) * ld + t2 + 1] * x[r * x_stride + i0];
    }
  }
  for (; t2 < end; ++t2) {
    float* d = dst + static_cast<std::size_t>(t2 - first) * d_stride;
    for (int i0 = 0; i0 < hd; ++i0)
      for (int r = first_row(t2); r < nb; ++r) d[i0] += c[static_cast<std::size_t>(r) * ld + t2] * x[r * x_stride + i0];
  }
}

// The forward of one block of nb query rows at absolute positions T0.. (row r: x + r * x_stride)
// against keys and values 0..T0 + r (tiles: the packed keys; v row t2 at v + t2 * v_stride):
// scores into rows (nb, ld), softmax with row r's statistics to stats + 2 r, the output rows to
// y + r * y_stride. The full forward and the cached variant's prompt chunks both run it, so their
// rows have the same arithmetic (Note [cached attention bits]). scores: Note [sliding window], Note
// [softcapping].
STRATUM_INLINE void forward_block(float* y, std::size_t y_stride, float* stats, float* rows, const float* x,
                                  std::size_t x_stride, int T0, int nb, const float* tiles, const float* v,
                                  std::size_t v_stride, int hd, int ld, float scale, AttentionScores scores) {
  const int first = block_first_key(T0, scores.window);  // Note [sliding window]: keys [lo, T0 + r]
  block_scores(rows, x, x_stride, T0, nb, tiles, hd, ld, first, T0 + nb);
  for (int r = 0; r < nb; ++r)
    softmax_row(rows + static_cast<std::size_t>(r) * ld, first, window_first(T0 + r, scores.window), T0 + r + 1, scale,
                scores.softcap, stats + 2 * r);
  block_probs_times(y, y_stride, rows, T0, nb, v, v_stride, hd, ld, first);
}

}  // namespace stratum::attention_detail
