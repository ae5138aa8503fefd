// The backward of causal grouped-query attention (kernels/cpu/attention.h), over the blocks of
// attention_blocks.h.
// Note [attention backward items]: a key's dk and dv sum over the group's query heads in
// increasing order, then over the query rows in increasing order (Note [attention row blocks]),
// so the natural work item is a (sequence, KV head) pair: it alone writes that head's dk and dv.
// When there are fewer pairs than threads (one sequence of a one-KV-head model: Gemma, Gemma 3
// 270M and 1B; or a few sequences on a many-core machine) the pairs would leave threads idle, so
// the backward splits instead into two passes with the same arithmetic per output element:
// - dq: one item per (sequence, query head, 32-row block): the block's replayed probabilities,
//   datt and dpre over its whole window and dq = dpre k, exactly as the pair's loop computes
//   them; each row's sum_j p_j datt_j is kept in the scratch's row sums;
// - dk, dv: one item per (sequence, KV head, range of kKeyRange keys): every block of every group
//   head in the pair's order, over the range's keys only: the probabilities and datt of those
//   keys (elementwise, so their bits are the whole row's), dpre from the kept row sum, and the
//   range's dk and dv rows summed over the same heads and rows in the same order.
// Both ways give every element the same bits (the kernel tests compare one thread's pairs with
// two and three threads' splits), at the cost of scoring each block twice (7 products a block
// instead of 5): taken only where pairs < threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/simd.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_blocks.h"
#include "ops/attention_rows.h"

namespace stratum {

namespace {
using namespace attention_detail;

// Keys per dk/dv item of the split backward (Note [attention backward items]).
constexpr int kKeyRange = 4 * kKeyTile;

// What a backward block reads and writes besides its rows (Note [attention backward items]).
struct BackwardArgs {
  const float* q;   // the block's first query row, rows W apart
  const float* dy;  // the block's first dout row, rows out_w apart
  std::size_t W, out_w;
  const float* kt;  // the packed keys (tiles from 0) and values
  const float* vt;
  const float* st;  // the head's (T, 2) softmax statistics
  int hd, ld;
  float* prow;  // (block rows, ld): the probabilities
  float* drow;  // (block rows, ld): datt, then dpre
  float* trow;  // (block rows, ld): Note [softcapping]'s tanh
  float scale;
  AttentionScores scores;
};

// One 32-row block of nb query rows at T0.. of one query head, against keys [ka, kb) (ka a
// multiple of kKeyTile at or after the block's first key; kb one too, or T0 + nb): the replayed
// probabilities and datt of those keys, then dpre. Each row's sum_j p_j datt_j: computed over the
// row's whole window into sums_out (the keys must then be the whole block's: ka its first key, kb
// T0 + nb), or (sums_out null) read from sums_in. dv, dk (null: not wanted): the rows of keys ka..
// at dv + (t2 - ka) * hd; dq (null: not wanted): row r at dq + r * W (kb must be T0 + nb), kbase:
// key 0's row (W apart).
STRATUM_INLINE void backward_block(const BackwardArgs& a, int T0, int nb, int ka, int kb, const float* sums_in,
                                   float* sums_out, float* dq, const float* kbase, float* dk, float* dv) {
  const int window = a.scores.window, ld = a.ld;
  const float cap = a.scores.softcap, scale = a.scale;
  // The forward's probabilities (Note [softmax row replay]), over the window (Note [sliding window]).
  block_scores(a.prow, a.q, a.W, T0, nb, a.kt, a.hd, ld, ka, kb);
  for (int r = 0; r < nb; ++r) {
    float* row = a.prow + static_cast<std::size_t>(r) * ld;
    // [z, e): the row's keys in [ka, kb); [ka, z): zeros, before its window (none past the row: causal)
    const int e = std::max(ka, std::min(kb, T0 + r + 1)), z = std::min(std::max(window_first(T0 + r, window), ka), e);
    std::fill(row + ka, row + z, 0.0f);
    scale_row(row + z, e - z, scale);
    if (cap > 0.0f) cap_row(row + z, e - z, cap, a.trow + static_cast<std::size_t>(r) * ld + z);  // Note [softcapping]
    exp_row(row + z, e - z, a.st[(T0 + r) * 2]);
    mul_row(row + z, e - z, a.st[(T0 + r) * 2 + 1]);
  }
  // datt[t2] = dy . v[t2];  dv[t2] += att[t][t2] * dy
  block_scores(a.drow, a.dy, a.out_w, T0, nb, a.vt, a.hd, ld, ka, kb);
  if (dv != nullptr) block_rank_update(dv, a.hd, a.prow, T0, nb, a.dy, a.out_w, a.hd, ld, ka, kb);
  // softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])
  for (int r = 0; r < nb; ++r) {
    const int lo = window_first(T0 + r, window);
    const int e = std::max(ka, std::min(kb, T0 + r + 1)), z = std::min(std::max(lo, ka), e);
    const float* pr = a.prow + static_cast<std::size_t>(r) * ld;
    const float* tr = a.trow + static_cast<std::size_t>(r) * ld;
    float* dr = a.drow + static_cast<std::size_t>(r) * ld;
    if (sums_out != nullptr) sums_out[r] = simd::dot_f32(pr + lo, dr + lo, T0 + r + 1 - lo);
    const float s = sums_out != nullptr ? sums_out[r] : sums_in[r];
    std::fill(dr + ka, dr + z, 0.0f);  // keys outside the window (Note [sliding window])
    if (cap > 0.0f)  // Note [softcapping]: back through the cap
      for (int t2 = z; t2 < e; ++t2) dr[t2] = pr[t2] * (dr[t2] - s) * cap * (1.0f - tr[t2] * tr[t2]) / cap * scale;
    else
      for (int t2 = z; t2 < e; ++t2) dr[t2] = pr[t2] * (dr[t2] - s) * scale;
  }
  // dq[t] = sum_t2 dpre[t2] k[t2];  dk[t2] += dpre[t2] * q[t]
  if (dq != nullptr) block_probs_times(dq, a.W, a.drow, T0, nb, kbase, a.W, a.hd, ld, ka);
  if (dk != nullptr) block_rank_update(dk, a.hd, a.drow, T0, nb, a.q, a.W, a.hd, ld, ka, kb);
}

// The arguments of query head h's block at T0 of sequence b (its packed keys and values in the slot).
BackwardArgs block_args(const float* qkv, const float* dout, const float* stats, float* scratch, int slot,
                        std::size_t b, const SeqRange& sr, int h, int T0, RowRange rr, QkvLayout lay, ScratchLayout sl,
                        AttentionScores scores) {
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * lay.hd, T = rr.T;
  const int ld = sl.ld();
  float* prow = sl.rows(scratch, slot);
  float* drow = prow + sl.block_rows() * ld;
  return BackwardArgs{qkv + (b * T + T0) * W + lay.q(h), dout + (sr.local0 + (T0 - sr.q0)) * out_w + lay.q(h), W,
                      out_w, sl.kt(scratch, slot), sl.vt(scratch, slot), stats + (b * lay.H + h) * T * 2, lay.hd, ld,
                      prow, drow, drow + sl.block_rows() * ld, 1.0f / std::sqrt(static_cast<float>(lay.hd)), scores};
}

// dk and dv of keys [k0, k1) of KV head kvh of sequence b into the slot's rows: continuing the
// sums earlier row ranges left in dqkv for the keys before q0 (Note [attention row ranges]), from
// 0 for the range's own keys.
void dkv_begin(float* dk, float* dv, const float* dbase, std::size_t W, QkvLayout lay, int kvh, int k0, int k1,
               int q0) {
  const std::size_t hd = static_cast<std::size_t>(lay.hd);
  for (int t = k0; t < k1; ++t) {
    float* dkr = dk + (t - k0) * hd;
    float* dvr = dv + (t - k0) * hd;
    if (t < q0) {
      std::copy_n(dbase + t * W + lay.k(kvh), hd, dkr);
      std::copy_n(dbase + t * W + lay.v(kvh), hd, dvr);
    } else {
      std::fill_n(dkr, hd, 0.0f);
      std::fill_n(dvr, hd, 0.0f);
    }
  }
}
void dkv_end(const float* dk, const float* dv, float* dbase, std::size_t W, QkvLayout lay, int kvh, int k0, int k1) {
  const std::size_t hd = static_cast<std::size_t>(lay.hd);
  for (int t = k0; t < k1; ++t) {
    std::copy_n(dk + (t - k0) * hd, hd, dbase + t * W + lay.k(kvh));
    std::copy_n(dv + (t - k0) * hd, hd, dbase + t * W + lay.v(kvh));
  }
}

// The (sequence, KV head) pairs p0..p1 (p = (b - first) * KV + kvh), each whole.
STRATUM_SIMD_CLONES
void attention_backward_pairs(float* dqkv, float* scratch, int slot, const float* dout, const float* qkv,
                              const float* stats, std::size_t p0, std::size_t p1, RowRange rr, QkvLayout lay,
                              ScratchLayout sl, AttentionScores scores) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const std::size_t W = lay.width(), T = rr.T;
  for (std::size_t p = p0; p < p1; ++p) {
    const SeqRange sr = rr.seq(static_cast<int>(p / lay.KV));
    const std::size_t b = rr.first + p / lay.KV;
    const int kvh = static_cast<int>(p % lay.KV);
    const int q0 = sr.q0, q1 = sr.q1;
    const float* base = qkv + b * T * W;
    float* dbase = dqkv + b * T * W;
    pack_head(sl.kt(scratch, slot), base + lay.k(kvh), W, q1, hd);
    pack_head(sl.vt(scratch, slot), base + lay.v(kvh), W, q1, hd);
    float* dk = sl.dkv(scratch, slot);  // every key's sums, contiguous, copied out at the end
    float* dv = dk + T * hd;
    dkv_begin(dk, dv, dbase, W, lay, kvh, 0, q1, q0);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int T0 = q0; T0 < q1; T0 += kBlockRows) {
        const BackwardArgs a = block_args(qkv, dout, stats, scratch, slot, b, sr, h, T0, rr, lay, sl, scores);
        const int first = block_first_key(T0, scores.window), nb = std::min(kBlockRows, q1 - T0);
        float sums[kBlockRows];
        backward_block(a, T0, nb, first, T0 + nb, nullptr, sums, dbase + T0 * W + lay.q(h), base + lay.k(kvh),
                       dk + static_cast<std::size_t>(first) * hd, dv + static_cast<std::size_t>(first) * hd);
      }
    }
    dkv_end(dk, dv, dbase, W, lay, kvh, 0, q1);
  }
}

// The split's dq items i0..i1 (Note [attention backward items]): i = (s * H + h) * J + j, the
// block interleaved(j, J) of sequence s's part of the range (J: the most blocks a part has); each
// row's sum_j p_j datt_j into row_sums (B, H, T).
STRATUM_SIMD_CLONES
void attention_backward_dq(float* dqkv, float* scratch, int slot, float* row_sums, const float* dout,
                           const float* qkv, const float* stats, std::size_t i0, std::size_t i1, int J, RowRange rr,
                           QkvLayout lay, ScratchLayout sl, AttentionScores scores) {
  const std::size_t W = lay.width(), T = rr.T;
  std::size_t packed = SIZE_MAX;  // the (b, kvh) whose keys and values the slot holds
  for (std::size_t i = i0; i < i1; ++i) {
    const int s = static_cast<int>(i / (static_cast<std::size_t>(lay.H) * J));
    const int h = static_cast<int>(i / J % lay.H), kvh = h / (lay.H / lay.KV);
    const SeqRange sr = rr.seq(s);
    const std::size_t b = rr.first + s;
    const int j = interleaved(static_cast<int>(i % J), J);
    if (j >= part_blocks(sr)) continue;
    const float* base = qkv + b * T * W;
    if (packed != b * lay.KV + kvh) {
      pack_head(sl.kt(scratch, slot), base + lay.k(kvh), W, sr.q1, lay.hd);
      pack_head(sl.vt(scratch, slot), base + lay.v(kvh), W, sr.q1, lay.hd);
      packed = b * lay.KV + kvh;
    }
    const int T0 = sr.q0 + j * kBlockRows, nb = std::min(kBlockRows, sr.q1 - T0);
    const BackwardArgs a = block_args(qkv, dout, stats, scratch, slot, b, sr, h, T0, rr, lay, sl, scores);
    backward_block(a, T0, nb, block_first_key(T0, scores.window), T0 + nb, nullptr, row_sums + (b * lay.H + h) * T + T0,
                   dqkv + (b * T + T0) * W + lay.q(h), base + lay.k(kvh), nullptr, nullptr);
  }
}

// The first key of sequence part sr's dk/dv items: the key range holding its first block's first key.
int first_key_range(const SeqRange& sr, int window) { return block_first_key(sr.q0, window) / kKeyRange * kKeyRange; }

// The split's dk/dv items i0..i1 (Note [attention backward items]): i = (s * KV + kvh) * R + j, the
// key range interleaved(j, R) of sequence s's part from first_key_range (R: the most ranges a
// part has); reads the dq items' row_sums.
STRATUM_SIMD_CLONES
void attention_backward_dkv(float* dqkv, float* scratch, int slot, const float* row_sums, const float* dout,
                            const float* qkv, const float* stats, std::size_t i0, std::size_t i1, int R, RowRange rr,
                            QkvLayout lay, ScratchLayout sl, AttentionScores scores) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const std::size_t W = lay.width(), T = rr.T;
  for (std::size_t i = i0; i < i1; ++i) {
    const int s = static_cast<int>(i / (static_cast<std::size_t>(lay.KV) * R));
    const int kvh = static_cast<int>(i / R % lay.KV);
    const SeqRange sr = rr.seq(s);
    const std::size_t b = rr.first + s;
    const int kmin = first_key_range(sr, scores.window), j = interleaved(static_cast<int>(i % R), R);
    const int k0 = kmin + j * kKeyRange, k1 = std::min(k0 + kKeyRange, sr.q1);
    if (sr.q0 >= sr.q1 || k0 >= k1) continue;
    const float* base = qkv + b * T * W;
    float* dbase = dqkv + b * T * W;
    pack_head(sl.kt(scratch, slot) + static_cast<std::size_t>(k0) * hd, base + k0 * W + lay.k(kvh), W, k1 - k0, hd);
    pack_head(sl.vt(scratch, slot) + static_cast<std::size_t>(k0) * hd, base + k0 * W + lay.v(kvh), W, k1 - k0, hd);
    float* dk = sl.dkv(scratch, slot);  // the range's keys' sums, contiguous
    float* dv = dk + T * hd;
    dkv_begin(dk, dv, dbase, W, lay, kvh, k0, k1, sr.q0);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      for (int T0 = sr.q0; T0 < sr.q1; T0 += kBlockRows) {
        const int nb = std::min(kBlockRows, sr.q1 - T0), first = block_first_key(T0, scores.window);
        if (T0 + nb <= k0) continue;  // no row of the block reaches the range
        if (first >= k1) break;       // nor of any later block: their windows start later still
        const int ka = std::max(first, k0), kb = std::min(k1, T0 + nb);
        const BackwardArgs a = block_args(qkv, dout, stats, scratch, slot, b, sr, h, T0, rr, lay, sl, scores);
        backward_block(a, T0, nb, ka, kb, row_sums + (b * lay.H + h) * T + T0, nullptr, nullptr,
                       nullptr, dk + static_cast<std::size_t>(ka - k0) * hd, dv + static_cast<std::size_t>(ka - k0) * hd);
      }
    }
    dkv_end(dk, dv, dbase, W, lay, kvh, k0, k1);
  }
}
}  // namespace

void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, int B, int T, int H, int KV, int hd, int r0, int n, AttentionScores scores) {
  attention_check_shape("attention_backward", B, T, H, KV, hd);
  attention_check_scores("attention_backward", scores);
  const RowRange rr = attention_row_range("attention_backward", B, T, r0, n);
  const QkvLayout lay{H, KV, hd};
  const ScratchLayout sl{std::size_t(T), std::size_t(hd)};
  const int threads = pool.num_threads();
  if (static_cast<std::size_t>(rr.seqs) * KV >= static_cast<std::size_t>(threads)) {  // a pair for every thread
    for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * KV, [&](int slot, std::size_t p0, std::size_t p1) {
      attention_backward_pairs(dqkv, scratch, slot, dout, qkv, stats, p0, p1, rr, lay, sl, scores);
    });
    return;
  }
  // Note [attention backward items]: dq (and each row's sum) first, then dk and dv by key ranges.
  const int J = most_part_blocks(rr);
  int R = 1;
  for (int s = 0; s < rr.seqs; ++s) {
    const SeqRange sr = rr.seq(s);
    R = std::max(R, (sr.q1 - first_key_range(sr, scores.window) + kKeyRange - 1) / kKeyRange);
  }
  float* row_sums = sl.row_sums(scratch, threads);
  for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * H * J, [&](int slot, std::size_t i0, std::size_t i1) {
    attention_backward_dq(dqkv, scratch, slot, row_sums, dout, qkv, stats, i0, i1, J, rr, lay, sl, scores);
  });
  for_each_slot(pool, static_cast<std::size_t>(rr.seqs) * KV * R, [&](int slot, std::size_t i0, std::size_t i1) {
    attention_backward_dkv(dqkv, scratch, slot, row_sums, dout, qkv, stats, i0, i1, R, rr, lay, sl, scores);
  });
}

}  // namespace stratum
