// Causal grouped-query attention of the CUDA backend, the backward (the row arithmetic, tiles and
// launches: attention_rows.cuh): dq and D per query row, then dk and dv per key row (Note [cuda
// attention rows]), over query row ranges (Note [attention row ranges] in kernels/cpu/attention.h).
#include "kernels/cuda/attention_rows.cuh"

namespace stratum {

namespace {

// ---- backward -----------------------------------------------------------------------------------------

template <int HD>
constexpr std::size_t dq_smem_floats() {
  return 2 * static_cast<std::size_t>(HD) * kTile + kRows * kPStride;
}

// dq rows of dqkv and D (B,H,T) (the scratch) for kRows query rows of one (sequence, head) of the
// query rows rr (dout: the range's rows): first D_i over all its keys, then dq_i (Note [cuda
// attention rows]). The last row tiles first (RowRange).
template <int HD>
__global__ void __launch_bounds__(Lanes<HD>::NT)
    attention_backward_dq_kernel(float* dqkv, float* Dbuf, const float* dout, const float* qkv, const float* stats,
                                 RowRange rr, int H, int KV, int hd, float scale) {
  using G = Lanes<HD>;
  extern __shared__ float4 attention_smem[];
  float* Kt = reinterpret_cast<float*>(attention_smem);    // (kTile, HD) keys of the tile
  float* Vt = Kt + static_cast<std::size_t>(HD) * kTile;   // (kTile, HD) values of the tile
  const int r = threadIdx.x / G::L, g = threadIdx.x % G::L;
  float* S = Vt + static_cast<std::size_t>(HD) * kTile + r * kPStride;  // the group's dS row
  const unsigned mask = group_mask<G::L>();
  const QueryBlock qb = query_block(rr, H);
  if (qb.tile < 0) return;  // a partial sequence's spare blocks
  const int T = rr.T, b = qb.b, h = qb.h, tile = qb.tile;
  const SeqRange sr = qb.sr;
  const int bh = b * H + h, kvh = h / (H / KV);
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int t0 = sr.q0 + tile * kRows, nrows = min(kRows, sr.q1 - t0);
  const int pos = t0 + r;
  const bool live = r < nrows;
  const std::size_t row = static_cast<std::size_t>(b) * T + pos;  // this query row in (B,T)
  const float* base = qkv + static_cast<std::size_t>(b) * T * W;
  const float* k = base + static_cast<std::size_t>(H + kvh) * hd;
  const float* v = base + static_cast<std::size_t>(H + KV + kvh) * hd;
  float q[G::DL], dO[G::DL];
  lane_load<HD>(q, qkv + row * W + static_cast<std::size_t>(h) * hd, g, hd, live);
  lane_load<HD>(dO, dout + (sr.local0 + (pos - sr.q0)) * out_w + static_cast<std::size_t>(h) * hd, g, hd, live);
  const std::size_t st = static_cast<std::size_t>(bh) * T + pos;  // this row's index in (B,H,T)
  const float m = live ? stats[2 * st] : 0.0f, inv = live ? stats[2 * st + 1] : 0.0f;
  const int keys_needed = t0 + nrows;
  float s[G::NS], dp[G::NS];
  float D = 0.0f;  // this lane's keys, then the group's sum
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();
    const int nk = min(kTile, T - key0);
    tile_load<HD>(Kt, k + key0 * W, W, nk, hd);
    tile_load<HD>(Vt, v + key0 * W, W, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;
    const int n = min(kTile, pos - key0 + 1);
    tile_scores<HD>(s, q, Kt, g, mask);
    tile_scores<HD>(dp, dO, Vt, g, mask);
#pragma unroll
    for (int i = 0; i < G::NS; ++i)
      if (g + G::L * i < n) D += expf(s[i] * scale - m) * inv * dp[i];
  }
  if (live) D = group_sum<G::L>(D, mask);
  float dq[G::DL];
#pragma unroll
  for (int c = 0; c < G::DL; ++c) dq[c] = 0.0f;
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();
    const int nk = min(kTile, T - key0);
    tile_load<HD>(Kt, k + key0 * W, W, nk, hd);
    tile_load<HD>(Vt, v + key0 * W, W, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;
    const int n = min(kTile, pos - key0 + 1);
    tile_scores<HD>(s, q, Kt, g, mask);
    tile_scores<HD>(dp, dO, Vt, g, mask);
#pragma unroll
    for (int i = 0; i < G::NS; ++i) {
      const int j = g + G::L * i;
      const float p = expf(s[i] * scale - m) * inv;
      S[j] = j < n ? p * (dp[i] - D) * scale : 0.0f;
    }
    __syncwarp(mask);
    lane_accumulate<HD>(dq, S, Kt, g, 0, n);
    __syncwarp(mask);
  }
  if (!live) return;
  if (g == 0) Dbuf[st] = D;
  lane_store<HD>(dqkv + row * W + static_cast<std::size_t>(h) * hd, dq, g, hd);
}

template <int HD>
constexpr std::size_t dkdv_smem_floats() {
  return 2 * static_cast<std::size_t>(HD) * kTile + 2 * kRows * kPStride + 3 * kTile;
}

// What the dk/dv kernel reads and writes. part: with grouped heads (H > KV) the scratch after D,
// (2, B, H, T, hd): each query head's own dk and dv sums (Note [cuda attention group sums]).
struct DkdvArgs {
  float* dqkv;
  float* part;
  const float* D;
  const float* dout;  // the range's rows (Note [attention row ranges])
  const float* qkv;
  const float* stats;
  int B, T, H, KV, hd;
  float scale;
  RowRange rr;  // the query rows
};

// Note [cuda attention group sums]: a key row's dk and dv sum the contributions of its group's
// H / KV query heads. Summed by one thread over every head in turn, the longest chain would be
// (H / KV) * T query rows and only B * KV * T / kRows blocks would run, too few for an H100 with
// grouped heads (about twice as slow, measured). So each block takes one query head's rows; with
// H > KV it writes that head's sums to the scratch, and a second kernel adds the group's sums in
// increasing head order (the first sum plus the second, plus the third, ...). With H == KV the
// blocks write dqkv directly. Either way the order is fixed by the shape alone.

// The dk and dv rows for kRows key rows (below q1) of one (sequence b, kv head) from one query
// head's rows in [q0, q1) of the range, queries increasing (Note [cuda attention rows]),
// continuing the sums of the keys before q0: into dqkv when H == KV, into that head's sums in
// a.part otherwise (Note [cuda attention group sums]). Block: one per (sequence, head, key tile),
// the first key tiles first (they have the most queries; RowRange).
template <int HD>
__global__ void __launch_bounds__(Lanes<HD>::NT, 512 / Lanes<HD>::NT) attention_backward_dkdv_kernel(DkdvArgs a) {
  using G = Lanes<HD>;
  extern __shared__ float4 attention_smem[];
  float* Qt = reinterpret_cast<float*>(attention_smem);    // (kTile, HD) query rows of the tile
  float* dOt = Qt + static_cast<std::size_t>(HD) * kTile;  // (kTile, HD) their dout rows
  float* Ms = dOt + static_cast<std::size_t>(HD) * kTile;  // (kTile) the query rows' max
  float* Is = Ms + kTile;                                  // (kTile) their 1 / sum
  float* Ds = Is + kTile;                                  // (kTile) their D
  const int r = threadIdx.x / G::L, g = threadIdx.x % G::L;
  float* P = Ds + kTile + r * kPStride;                    // the group's p row
  float* S = P + kRows * kPStride;                         // the group's dS row
  const unsigned mask = group_mask<G::L>();
  const int T = a.T, H = a.H, KV = a.KV, hd = a.hd, group = H / KV;
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int SH = a.rr.seqs * H;
  const int si = static_cast<int>(blockIdx.x % SH) / H, h = static_cast<int>(blockIdx.x % SH) % H;
  const int b = a.rr.first + si, tile = static_cast<int>(blockIdx.x / SH);
  const SeqRange sr = a.rr.seq(si);
  const int q0 = sr.q0, q1 = sr.q1;
  if (tile * kRows >= q1) return;  // keys past the sequence's part of the range
  const int bh = b * H + h, kvh = h / group;
  const int k0 = tile * kRows, nkeys = min(kRows, q1 - k0);
  const int kpos = k0 + r;
  const bool live = r < nkeys;
  const std::size_t row0 = static_cast<std::size_t>(b) * T;  // the batch's first row
  const std::size_t krow = row0 + kpos;                      // this key row in (B,T)
  float kr[G::DL], vr[G::DL], dk[G::DL], dv[G::DL];
  lane_load<HD>(kr, a.qkv + krow * W + static_cast<std::size_t>(H + kvh) * hd, g, hd, live);
  lane_load<HD>(vr, a.qkv + krow * W + static_cast<std::size_t>(H + KV + kvh) * hd, g, hd, live);
  // This key row's dk at dk_out, dv at dv_out (Note [cuda attention group sums]).
  float *dk_out, *dv_out;
  if (group > 1) {
    const std::size_t part_floats = static_cast<std::size_t>(a.B) * H * T * hd;
    dk_out = a.part + (static_cast<std::size_t>(bh) * T + kpos) * hd;
    dv_out = dk_out + part_floats;
  } else {
    dk_out = a.dqkv + krow * W + static_cast<std::size_t>(H + kvh) * hd;
    dv_out = a.dqkv + krow * W + static_cast<std::size_t>(H + KV + kvh) * hd;
  }
  // A key before q0 continues the sums an earlier range left there; the range's own keys start at 0.
  lane_load<HD>(dk, dk_out, g, hd, live && kpos < q0);
  lane_load<HD>(dv, dv_out, g, hd, live && kpos < q0);
  const std::size_t st0 = static_cast<std::size_t>(bh) * T;  // row 0 of this head in (B,H,T)
  for (int i0 = max(k0, q0); i0 < q1; i0 += kTile) {  // no query before k0 or q0 attends to these keys
    __syncthreads();
    const int nq = min(kTile, q1 - i0);
    tile_load<HD>(Qt, a.qkv + (row0 + i0) * W + static_cast<std::size_t>(h) * hd, W, nq, hd);
    tile_load<HD>(dOt, a.dout + (sr.local0 + (i0 - q0)) * out_w + static_cast<std::size_t>(h) * hd, out_w, nq, hd);
    if (static_cast<int>(threadIdx.x) < kTile) {
      const int i = threadIdx.x;
      const bool q_live = i < nq;
      Ms[i] = q_live ? a.stats[2 * (st0 + i0 + i)] : 0.0f;
      Is[i] = q_live ? a.stats[2 * (st0 + i0 + i) + 1] : 0.0f;
      Ds[i] = q_live ? a.D[st0 + i0 + i] : 0.0f;
    }
    __syncthreads();
    if (!live || kpos >= i0 + nq) continue;  // no query of this tile attends to this key
    const int i_begin = max(0, kpos - i0), i_end = nq;
    float s[G::NS], dp[G::NS];
    tile_scores<HD>(s, kr, Qt, g, mask);
    tile_scores<HD>(dp, vr, dOt, g, mask);
#pragma unroll
    for (int t = 0; t < G::NS; ++t) {
      const int i = g + G::L * t;
      const bool in = i >= i_begin && i < i_end;
      const float p = expf(s[t] * a.scale - Ms[i]) * Is[i];
      P[i] = in ? p : 0.0f;
      S[i] = in ? p * (dp[t] - Ds[i]) * a.scale : 0.0f;
    }
    __syncwarp(mask);
    lane_accumulate<HD>(dv, P, dOt, g, i_begin, i_end);
    lane_accumulate<HD>(dk, S, Qt, g, i_begin, i_end);
    __syncwarp(mask);
  }
  if (!live) return;
  lane_store<HD>(dk_out, dk, g, hd);
  lane_store<HD>(dv_out, dv, g, hd);
}

// dk and dv of each range sequence's rows before its q1 in dqkv = the sums of the group's per-head
// sums in a.part, heads increasing (Note [cuda attention group sums]). One thread per element of
// (which, sequence, row < T, kv head, d); rows past the sequence's q1 do nothing.
__global__ void attention_backward_group_sum_kernel(DkdvArgs a) {
  const int T = a.T;
  const std::size_t n = 2 * static_cast<std::size_t>(a.rr.seqs) * T * a.KV * a.hd;
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= n) return;
  const int hd = a.hd, group = a.H / a.KV;
  const int d = static_cast<int>(idx % hd);
  const int kvh = static_cast<int>(idx / hd % a.KV);
  const std::size_t row = idx / (static_cast<std::size_t>(hd) * a.KV);  // (which, sequence, t)
  const int which = static_cast<int>(row / (static_cast<std::size_t>(a.rr.seqs) * T));  // 0: dk, 1: dv
  const int i = static_cast<int>(row / T % a.rr.seqs);
  const std::size_t t = row % T, b = static_cast<std::size_t>(a.rr.first) + i, bt = b * T + t;
  if (static_cast<int>(t) >= a.rr.seq(i).q1) return;
  const float* src = a.part + which * static_cast<std::size_t>(a.B) * a.H * a.T * hd +
                     ((b * a.H + static_cast<std::size_t>(kvh) * group) * a.T + t) * hd + d;
  const std::size_t head_stride = static_cast<std::size_t>(a.T) * hd;
  float acc = src[0];
  for (int g = 1; g < group; ++g) acc += src[g * head_stride];
  const std::size_t W = static_cast<std::size_t>(a.H + 2 * a.KV) * hd;
  a.dqkv[bt * W + static_cast<std::size_t>(a.H + which * a.KV + kvh) * hd + d] = acc;
}

void backward_launch(const CudaContext& ctx, float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* stats, int B, int T, int H, int KV, int hd, int r0, int n) {
  check_shape("attention_backward", B, T, H, KV, hd);
  const RowRange rr = attention_row_range("attention_backward", B, T, r0, n);
  const std::size_t sh = static_cast<std::size_t>(rr.seqs) * H;
  if (sh == 0) return;
  const float scale = score_scale(hd);
  const DkdvArgs a{dqkv, scratch + static_cast<std::size_t>(B) * H * T, scratch, dout, qkv, stats, B, T, H, KV, hd,
                   scale, rr};
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_backward_dq_kernel<HD>, sh * tiles_of(range_widest(rr, false)), Lanes<HD>::NT,
           dq_smem_floats<HD>(), dqkv, scratch, dout, qkv, stats, rr, H, KV, hd, scale);
    launch(ctx, attention_backward_dkdv_kernel<HD>, sh * tiles_of(range_widest(rr, true)), Lanes<HD>::NT,
           dkdv_smem_floats<HD>(), a);
  });
  if (H > KV) {  // Note [cuda attention group sums]
    const std::size_t elems = 2 * static_cast<std::size_t>(rr.seqs) * T * KV * hd;
    attention_backward_group_sum_kernel<<<blocks_for(elems, 256), 256, 0, ctx.stream>>>(a);
    STRATUM_CUDA_LAUNCHED();
  }
}

}  // namespace

std::size_t CudaOps::attention_scratch_floats(int B, int T, int H, int KV, int hd) const {
  check_shape("attention_scratch_floats", B, T, H, KV, hd);
  // D (B,H,T) of the backward, then with grouped heads the per-head dk and dv sums (2,B,H,T,hd)
  // (Note [cuda attention group sums]); the forward needs none.
  const std::size_t rows = static_cast<std::size_t>(B) * H * T;
  return rows + (H > KV ? 2 * rows * hd : 0);
}

void CudaOps::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* stats,
                                 int B, int T, int H, int KV, int hd, int r0, int n) const {
  backward_launch(*ctx_, dqkv, scratch, dout, qkv, stats, B, T, H, KV, hd, r0, n);
}

}  // namespace stratum
