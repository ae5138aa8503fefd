// Causal grouped-query attention forward/backward and the KV-cache variant. Work items: the
// forward and the cached variant take one (batch, query head) pair each, the backward one
// (batch, kv head) pair (it alone writes that kv head's dk/dv, summing the group's query heads
// in increasing order). All sums inside an item run in a fixed order, so results do not depend
// on the thread count (Note [deterministic partition] in core/thread_pool.h). With KV == H the
// arithmetic is exactly that of the original GPT-2 kernel. No (T, T) matrix: the forward keeps
// two floats per row (Note [softmax row replay]) and both directions walk the sequence in
// 32-row query blocks against 32-key tiles (Note [attention row blocks]), so memory is
// O(T * head_dim) per head and the bits are those of the row-at-a-time kernel it replaced.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/simd.h"
#include "ops/attention_rows.h"

// The V16 helpers below are always inlined into their ISA clone: no vector crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace stratum {

namespace {
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

// y (hd) = sum_t2 row[t2] * v[t2], v row t2 at v + t2 * v_stride, t2 increasing.
inline void row_times_v(float* y, const float* row, int n, const float* v, std::size_t v_stride, int hd) {
  for (int i = 0; i < hd; ++i) y[i] = 0.0f;
  for (int t2 = 0; t2 < n; ++t2) {
    const float* vr = v + t2 * v_stride;
    const float a = row[t2];
    for (int i = 0; i < hd; ++i) y[i] += a * vr[i];
  }
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
};

// dst = the head's slice of rows [0, T) of src (row t2 at base + t2 * stride) in key tiles.
void pack_head(float* dst, const float* base, std::size_t stride, int T, int hd) {
  for (int c0 = 0; c0 < T; c0 += kKeyTile) {
    float* tile = dst + static_cast<std::size_t>(c0) * hd;
    const int w = std::min(kKeyTile, T - c0);
    for (int l = 0; l < kKeyTile; ++l)
      for (int i = 0; i < hd; ++i) tile[i * kKeyTile + l] = l < w ? base[(c0 + l) * stride + i] : 0.0f;
  }
}

// fn(slot, p0, p1) on pool.num_threads() contiguous ranges of [0, n) in order, one per scratch slot.
template <class Fn>
void for_each_slot(ThreadPool& pool, std::size_t n, const Fn& fn) {
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
// at least, into out (nb, ld); tiles: the packed keys; first: a multiple of kKeyTile.
STRATUM_INLINE void block_scores(float* out, const float* x, std::size_t x_stride, int T0, int nb,
                                 const float* tiles, int hd, int ld, int first) {
  for (int c0 = first; c0 < T0 + nb; c0 += kKeyTile) {
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

// dst[t2][i] += c[r][t2] * x[r][i] for t2 in [first, T0 + nb), the block's rows r with t2 <= T0 + r
// in increasing order (row r of c at c + r * ld, x[r] at x + r * x_stride, dst row t2 at dst + t2 *
// d_stride); the c of the keys before first are 0 (Note [sliding window]).
STRATUM_INLINE void block_rank_update(float* dst, std::size_t d_stride, const float* c, int T0, int nb,
                                      const float* x, std::size_t x_stride, int hd, int ld, int first) {
  auto first_row = [&](int t2) { return t2 > T0 ? t2 - T0 : 0; };
  int t2 = first;
  for (; t2 + 2 <= T0 + nb; t2 += 2) {
    float* d0 = dst + t2 * d_stride;
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
  for (; t2 < T0 + nb; ++t2) {
    float* d = dst + t2 * d_stride;
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
  block_scores(rows, x, x_stride, T0, nb, tiles, hd, ld, first);
  for (int r = 0; r < nb; ++r)
    softmax_row(rows + static_cast<std::size_t>(r) * ld, first, window_first(T0 + r, scores.window), T0 + r + 1, scale,
                scores.softcap, stats + 2 * r);
  block_probs_times(y, y_stride, rows, T0, nb, v, v_stride, hd, ld, first);
}

STRATUM_SIMD_CLONES
void attention_forward_pairs(float* out, float* stats, float* scratch, int slot, const float* qkv, std::size_t p0,
                             std::size_t p1, RowRange rr, QkvLayout lay, ScratchLayout sl, AttentionScores scores) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * hd, T = rr.T;
  for (std::size_t p = p0; p < p1; ++p) {  // p = (b - first) * H + h
    const SeqRange sr = rr.seq(static_cast<int>(p / lay.H));
    const std::size_t b = rr.first + p / lay.H;
    const int h = static_cast<int>(p % lay.H), kvh = h / group;
    const int q0 = sr.q0, q1 = sr.q1;
    const float* base = qkv + b * T * W;
    float* kt = sl.kt(scratch, slot);
    if (p == p0 || h % group == 0) pack_head(kt, base + lay.k(kvh), W, q1, hd);  // a new (batch, kv head)
    float* rows = sl.rows(scratch, slot);
    const int ld = sl.ld();
    for (int T0 = q0; T0 < q1; T0 += kBlockRows)
      forward_block(out + (sr.local0 + (T0 - q0)) * out_w + lay.q(h), out_w, stats + ((b * lay.H + h) * T + T0) * 2, rows,
                    base + T0 * W + lay.q(h), W, T0, std::min(kBlockRows, q1 - T0), kt, base + lay.v(kvh), W, hd, ld,
                    scale, scores);
  }
}

STRATUM_SIMD_CLONES
void attention_backward_pairs(float* dqkv, float* scratch, int slot, const float* dout, const float* qkv,
                              const float* stats, std::size_t p0, std::size_t p1, RowRange rr, QkvLayout lay,
                              ScratchLayout sl, AttentionScores scores) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * hd, T = rr.T;
  for (std::size_t p = p0; p < p1; ++p) {  // p = (b - first) * KV + kvh
    const SeqRange sr = rr.seq(static_cast<int>(p / lay.KV));
    const std::size_t b = rr.first + p / lay.KV;
    const int kvh = static_cast<int>(p % lay.KV);
    const int q0 = sr.q0, q1 = sr.q1;
    const float* base = qkv + b * T * W;
    float* dbase = dqkv + b * T * W;
    float* kt = sl.kt(scratch, slot);
    float* vt = sl.vt(scratch, slot);
    pack_head(kt, base + lay.k(kvh), W, q1, hd);
    pack_head(vt, base + lay.v(kvh), W, q1, hd);
    const int ld = sl.ld();
    float* prow = sl.rows(scratch, slot);             // (block rows, ld): the probabilities
    float* drow = prow + sl.block_rows() * ld;        // (block rows, ld): datt, then dpre
    float* trow = drow + sl.block_rows() * ld;        // (block rows, ld): Note [softcapping]'s tanh
    const float cap = scores.softcap;
    // dk and dv summed in contiguous rows (every block updates all its keys'), copied out at the
    // end. Keys before q0 continue the sums earlier row ranges left in dqkv (Note [attention row
    // ranges]); the range's own keys start from 0.
    float* dk = sl.dkv(scratch, slot);
    float* dv = dk + T * hd;
    for (int t = 0; t < q0; ++t) {
      std::copy_n(dbase + t * W + lay.k(kvh), hd, dk + static_cast<std::size_t>(t) * hd);
      std::copy_n(dbase + t * W + lay.v(kvh), hd, dv + static_cast<std::size_t>(t) * hd);
    }
    std::fill_n(dk + static_cast<std::size_t>(q0) * hd, static_cast<std::size_t>(q1 - q0) * hd, 0.0f);
    std::fill_n(dv + static_cast<std::size_t>(q0) * hd, static_cast<std::size_t>(q1 - q0) * hd, 0.0f);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      const float* st = stats + (b * lay.H + h) * T * 2;
      for (int T0 = q0; T0 < q1; T0 += kBlockRows) {
        const int nb = std::min(kBlockRows, q1 - T0);
        const float* q = base + T0 * W + lay.q(h);
        const float* dy = dout + (sr.local0 + (T0 - q0)) * out_w + lay.q(h);  // the block's rows of dout
        // The forward's probabilities (Note [softmax row replay]), over its window (Note [sliding window]).
        const int first = block_first_key(T0, scores.window);
        block_scores(prow, q, W, T0, nb, kt, hd, ld, first);
        for (int r = 0; r < nb; ++r) {
          float* row = prow + static_cast<std::size_t>(r) * ld;
          const int lo = window_first(T0 + r, scores.window), n = T0 + r + 1 - lo;
          std::fill(row + first, row + lo, 0.0f);
          scale_row(row + lo, n, scale);
          if (cap > 0.0f) cap_row(row + lo, n, cap, trow + static_cast<std::size_t>(r) * ld + lo);  // Note [softcapping]
          exp_row(row + lo, n, st[(T0 + r) * 2]);
          mul_row(row + lo, n, st[(T0 + r) * 2 + 1]);
        }
        // datt[t2] = dy . v[t2];  dv[t2] += att[t][t2] * dy
        block_scores(drow, dy, out_w, T0, nb, vt, hd, ld, first);
        block_rank_update(dv, hd, prow, T0, nb, dy, out_w, hd, ld, first);
        // softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])
        for (int r = 0; r < nb; ++r) {
          const int lo = window_first(T0 + r, scores.window);
          const float* pr = prow + static_cast<std::size_t>(r) * ld + lo;
          const float* tr = trow + static_cast<std::size_t>(r) * ld + lo;
          float* dr = drow + static_cast<std::size_t>(r) * ld;
          std::fill(dr + first, dr + lo, 0.0f);  // keys outside the window (Note [sliding window])
          dr += lo;
          const int n = T0 + r + 1 - lo;
          const float s = simd::dot_f32(pr, dr, n);
          if (cap > 0.0f)  // Note [softcapping]: back through the cap
            for (int t2 = 0; t2 < n; ++t2) dr[t2] = pr[t2] * (dr[t2] - s) * cap * (1.0f - tr[t2] * tr[t2]) / cap * scale;
          else
            for (int t2 = 0; t2 < n; ++t2) dr[t2] = pr[t2] * (dr[t2] - s) * scale;
        }
        // dq[t] = sum_t2 dpre[t2] k[t2];  dk[t2] += dpre[t2] * q[t]
        block_probs_times(dbase + T0 * W + lay.q(h), W, drow, T0, nb, base + lay.k(kvh), W, hd, ld, first);
        block_rank_update(dk, hd, drow, T0, nb, q, W, hd, ld, first);
      }
    }
    for (int t = 0; t < q1; ++t) {
      std::copy_n(dk + static_cast<std::size_t>(t) * hd, hd, dbase + t * W + lay.k(kvh));
      std::copy_n(dv + static_cast<std::size_t>(t) * hd, hd, dbase + t * W + lay.v(kvh));
    }
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
  return static_cast<std::size_t>(threads) * ScratchLayout{std::size_t(T), std::size_t(hd)}.slot_floats();
}

void attention_forward(ThreadPool& pool, float* out, float* stats, float* scratch, const float* qkv, int B, int T,
                       int H, int KV, int hd, int r0, int n, AttentionScores scores) {
  attention_check_shape("attention_forward", B, T, H, KV, hd);
  attention_check_scores("attention_forward", scores);
  const RowRange rr = attention_row_range("attention_forward", B, T, r0, n);
  const QkvLayout lay{H, KV, hd};
  const ScratchLayout sl{std::size_t(T), std::size_t(hd)};
  for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * H, [&](int slot, std::size_t p0, std::size_t p1) {
    attention_forward_pairs(out, stats, scratch, slot, qkv, p0, p1, rr, lay, sl, scores);
  });
}

void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, int B, int T, int H, int KV, int hd, int r0, int n, AttentionScores scores) {
  attention_check_shape("attention_backward", B, T, H, KV, hd);
  attention_check_scores("attention_backward", scores);
  const RowRange rr = attention_row_range("attention_backward", B, T, r0, n);
  const QkvLayout lay{H, KV, hd};
  const ScratchLayout sl{std::size_t(T), std::size_t(hd)};
  for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * KV, [&](int slot, std::size_t p0, std::size_t p1) {
    attention_backward_pairs(dqkv, scratch, slot, dout, qkv, stats, p0, p1, rr, lay, sl, scores);
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
