// Causal grouped-query attention of the CUDA backend: the semantics of kernels/cpu/attention.h
// (qkv rows [q (H*hd) | k (KV*hd) | v (KV*hd)], query head h reads kv head h / (H/KV), scores
// (q . k) * (1/sqrt(hd)), stats (B,H,T,2) = {maximum scaled score, 1 / sum of exps} per softmax
// row, the backward replaying the probabilities from them), and the KV-cache variant. Head sizes
// up to 128 (kernels compiled for 16, 32, 64, 128; a smaller hd runs the next size up). Does not
// allocate (the backward's scratch holds D, one float per query row, and with grouped heads each
// query head's dk/dv sums) and does not synchronise the stream. No (T, T) matrix.
//
// Note [cuda attention rows]: one thread owns one row — a query row in the forward, the cached
// variant and dq, a key row in dk/dv — and keeps its accumulators (the output, dq, dk, dv rows) in
// registers. A block of kRows = 64 threads stages its rows in shared memory and walks the other
// side in tiles of kTile = 32 rows (keys for the forward and dq, queries for dk/dv) that the block
// loads together. Every sum runs in a fixed order that depends on no launch parameter:
//  - a dot product over the head dimension starts from 0.0f with d increasing (the CPU's order, so
//    the scores are usually the CPU's bits; q.k and k.q are the same float products);
//  - the forward's softmax is online per key tile: m_new = max(m, tile max), alpha = exp(m -
//    m_new), l = l * alpha + sum of the tile's exp(s - m_new) (keys increasing), the output row
//    acc = acc * alpha + sum of p * v (keys increasing); finally out = acc * (1 / l), stats =
//    {m, 1 / l}. m is the exact maximum of the scaled scores (a maximum does not depend on the
//    order); l differs from the CPU's sum by rounding only;
//  - the backward replays p = exp(s * scale - m) * inv with the stats (the CPU's three passes),
//    D_i = sum_j p_ij * dP_ij (j increasing, dP_ij = dout_i . v_j; the CPU's dot of the rows),
//    dS_ij = p_ij * (dP_ij - D_i) * scale, dq_i = sum_j dS_ij k_j (j increasing), and for a key
//    row j dv_j = sum p_ij dout_i, dk_j = sum dS_ij q_i over queries i >= j increasing, per query
//    head, the group's heads then added in increasing order (Note [cuda attention group sums]);
//  - a row skips the key tiles past its position and the keys past it in its last tile, so its
//    arithmetic depends only on its own inputs, not on which rows share its block.
// Hence the bits depend only on the inputs and the GPU model (Note [cuda determinism]), and the
// cached variant, running the forward's row code on the cache, gives each row the forward's bits
// (Note [cached attention bits] in kernels/cpu/attention.h), for any past and any Tn.
//
// Shared-memory tiles are stored transposed, element (d, r) of a tile of R rows at
// tile_index<R>(d, r): a thread's own row is read one float per d without bank conflicts and a
// shared row as float4 broadcasts along r; the XOR swizzle of groups of 4 rows by d % 8 also
// keeps the coalesced loads (4 rows x 8 consecutive d per warp) free of conflicts.
#include <cmath>
#include <cstddef>

#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

constexpr int kRows = 64;    // threads per block = rows each block owns (Note [cuda attention rows])
constexpr int kTile = 32;    // rows of the other side per shared tile
constexpr int kWarps = kRows / 32;
constexpr int kMaxHeadDim = 128;

// ---- shared-memory tiles --------------------------------------------------------------------------

// Where element (d, r) of a transposed tile of R rows lives (R a multiple of 32).
template <int R>
__device__ __forceinline__ int tile_index(int d, int r) {
  static_assert(R % 32 == 0, "tiles of whole warps");
  return d * R + ((((r >> 2) ^ (d & 7))) << 2) + (r & 3);
}

// Rows 4g .. 4g+3 of dimension d of a transposed tile of R rows.
template <int R>
__device__ __forceinline__ float4 tile_row4(const float* t, int d, int g) {
  return *reinterpret_cast<const float4*>(t + d * R + ((g ^ (d & 7)) << 2));
}

// t (HD, R) transposed = rows [0, R) of src (row r at src + r * stride), zero for rows >= nvalid
// and dimensions >= hd. All threads of the block take part; the caller synchronises.
template <int HD, int R>
__device__ __forceinline__ void tile_load(float* t, const float* src, std::size_t stride, int nvalid, int hd) {
  static_assert(HD % 8 == 0, "whole groups of 8 dimensions");
  const int lane = threadIdx.x & 31;
  for (int s = threadIdx.x >> 5; s < (R / 4) * (HD / 8); s += kWarps) {
    const int r = 4 * (s % (R / 4)) + (lane >> 3), d = 8 * (s / (R / 4)) + (lane & 7);
    t[tile_index<R>(d, r)] = r < nvalid && d < hd ? src[static_cast<std::size_t>(r) * stride + d] : 0.0f;
  }
}

// Rows [0, nvalid) and dimensions [0, hd) of dst (row r at dst + r * stride) = the tile's.
template <int HD, int R>
__device__ __forceinline__ void tile_store(float* dst, std::size_t stride, const float* t, int nvalid, int hd) {
  const int lane = threadIdx.x & 31;
  for (int s = threadIdx.x >> 5; s < (R / 4) * (HD / 8); s += kWarps) {
    const int r = 4 * (s % (R / 4)) + (lane >> 3), d = 8 * (s / (R / 4)) + (lane & 7);
    if (r < nvalid && d < hd) dst[static_cast<std::size_t>(r) * stride + d] = t[tile_index<R>(d, r)];
  }
}

// ---- per-thread row arithmetic ----------------------------------------------------------------------

// s[j] = sum_{d < hd} a[d] * b_{J0 + j}[d] for j < N, d increasing from 0.0f: a = row r of the
// RA-row tile At (this thread's), b_i = row i of the kTile-row tile Bt.
template <int RA, int N = kTile, int J0 = 0>
__device__ __forceinline__ void row_dots(float (&s)[N], const float* At, int r, const float* Bt, int hd) {
  static_assert(N % 4 == 0 && J0 % 4 == 0 && J0 + N <= kTile, "whole groups of 4 rows of the tile");
#pragma unroll
  for (int j = 0; j < N; ++j) s[j] = 0.0f;
  for (int d = 0; d < hd; ++d) {
    const float a = At[tile_index<RA>(d, r)];
#pragma unroll
    for (int g = 0; g < N / 4; ++g) {
      const float4 b = tile_row4<kTile>(Bt, d, J0 / 4 + g);
      s[4 * g] += a * b.x;
      s[4 * g + 1] += a * b.y;
      s[4 * g + 2] += a * b.z;
      s[4 * g + 3] += a * b.w;
    }
  }
}

// row_dots for two pairs of tiles at once (s from At, Bt; t from Ct, Dt): the same sums.
template <int RA, int N = kTile, int J0 = 0>
__device__ __forceinline__ void row_dots2(float (&s)[N], const float* At, const float* Bt, float (&t)[N],
                                          const float* Ct, const float* Dt, int r, int hd) {
  static_assert(N % 4 == 0 && J0 % 4 == 0 && J0 + N <= kTile, "whole groups of 4 rows of the tile");
#pragma unroll
  for (int j = 0; j < N; ++j) s[j] = t[j] = 0.0f;
  for (int d = 0; d < hd; ++d) {
    const float a = At[tile_index<RA>(d, r)];
    const float c = Ct[tile_index<RA>(d, r)];
#pragma unroll
    for (int g = 0; g < N / 4; ++g) {
      const float4 b = tile_row4<kTile>(Bt, d, J0 / 4 + g);
      const float4 e = tile_row4<kTile>(Dt, d, J0 / 4 + g);
      s[4 * g] += a * b.x;
      s[4 * g + 1] += a * b.y;
      s[4 * g + 2] += a * b.z;
      s[4 * g + 3] += a * b.w;
      t[4 * g] += c * e.x;
      t[4 * g + 1] += c * e.y;
      t[4 * g + 2] += c * e.z;
      t[4 * g + 3] += c * e.w;
    }
  }
}

// acc[d] += sum_{j in [j0, j1)} coef[j] * x_j[d], j increasing, for every d < HD: coef[j] at
// coef[j * kRows + r] (this thread's column), x_j = row j of the kTile-row tile Xt. Groups of 4
// aligned rows read float4 broadcasts; the ends go one row at a time (same arithmetic).
template <int HD>
__device__ __forceinline__ void row_accumulate(float (&acc)[HD], const float* coef, int r, const float* Xt, int j0,
                                               int j1) {
  for (int j = j0; j < j1;) {
    if ((j & 3) == 0 && j + 4 <= j1) {
      const float c0 = coef[j * kRows + r], c1 = coef[(j + 1) * kRows + r];
      const float c2 = coef[(j + 2) * kRows + r], c3 = coef[(j + 3) * kRows + r];
      const int g = j >> 2;
#pragma unroll
      for (int d = 0; d < HD; ++d) {
        const float4 x = tile_row4<kTile>(Xt, d, g);
        acc[d] += c0 * x.x;
        acc[d] += c1 * x.y;
        acc[d] += c2 * x.z;
        acc[d] += c3 * x.w;
      }
      j += 4;
    } else {
      const float c = coef[j * kRows + r];
#pragma unroll
      for (int d = 0; d < HD; ++d) acc[d] += c * Xt[tile_index<kTile>(d, j)];
      ++j;
    }
  }
}

// ---- forward and cached variant ----------------------------------------------------------------------

template <int HD>
constexpr std::size_t forward_smem_floats() {
  return static_cast<std::size_t>(HD) * kRows + 2 * static_cast<std::size_t>(HD) * kTile + kTile * kRows;
}

// Where one block's rows and keys are (Note [cuda attention rows]).
struct RowBlock {
  const float* q;      // row r at q + r * q_stride
  std::size_t q_stride;
  const float* k;      // key t at k + t * kv_stride
  const float* v;      // value t at v + t * kv_stride
  std::size_t kv_stride;
  int nkeys;           // keys that exist (loaded); the rest of a tile is zero
  int pos0;            // row r is at position pos0 + r and attends to keys [0, pos0 + r]
  int nrows;           // rows of this block, <= kRows
  float* out;          // row r at out + r * out_stride
  std::size_t out_stride;
  float* stats;        // (nrows, 2) or null
};

// The forward of one block's rows: online softmax per key tile in registers, out and stats.
template <int HD>
__device__ __forceinline__ void forward_rows(float* sm, const RowBlock& rb, int hd, float scale) {
  float* Qt = sm;                                              // (HD, kRows) the block's query rows
  float* Kt = Qt + static_cast<std::size_t>(HD) * kRows;       // (HD, kTile) keys of the tile
  float* Vt = Kt + static_cast<std::size_t>(HD) * kTile;       // (HD, kTile) values of the tile
  float* P = Vt + static_cast<std::size_t>(HD) * kTile;        // (kTile, kRows) each thread's p column
  const int r = threadIdx.x;
  const int pos = rb.pos0 + r;
  const bool live = r < rb.nrows;
  tile_load<HD, kRows>(Qt, rb.q, rb.q_stride, rb.nrows, hd);
  float acc[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int keys_needed = rb.pos0 + rb.nrows;
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();  // Qt loaded; the previous tile consumed
    const int nk = min(kTile, rb.nkeys - key0);
    tile_load<HD, kTile>(Kt, rb.k + static_cast<std::size_t>(key0) * rb.kv_stride, rb.kv_stride, nk, hd);
    tile_load<HD, kTile>(Vt, rb.v + static_cast<std::size_t>(key0) * rb.kv_stride, rb.kv_stride, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;
    const int n = min(kTile, pos - key0 + 1);  // keys of this tile the row attends to
    float s[kTile];
    row_dots<kRows>(s, Qt, r, Kt, hd);
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < n) {
        s[j] *= scale;
        tile_max = fmaxf(tile_max, s[j]);
      }
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= alpha;
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < n) {
        const float p = expf(s[j] - m_new);
        l += p;
        P[j * kRows + r] = p;
      }
#pragma unroll
    for (int d = 0; d < HD; ++d) acc[d] *= alpha;
    row_accumulate<HD>(acc, P, r, Vt, 0, n);
    m = m_new;
  }
  __syncthreads();  // every thread done with Qt: it stages the output rows
  if (live) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HD; ++d) Qt[tile_index<kRows>(d, r)] = acc[d] * inv;
    if (rb.stats != nullptr) {
      rb.stats[2 * r] = m;
      rb.stats[2 * r + 1] = inv;
    }
  }
  __syncthreads();
  tile_store<HD, kRows>(rb.out, rb.out_stride, Qt, rb.nrows, hd);
}

// out (B,T,H*hd), stats (B,H,T,2) from qkv (B,T,(H+2KV)*hd). Block: kRows query rows of one
// (batch, head), the last row tiles first (they have the most keys).
template <int HD>
__global__ void __launch_bounds__(kRows)
    attention_forward_kernel(float* out, float* stats, const float* qkv, int B, int T, int H, int KV, int hd,
                             float scale) {
  extern __shared__ float4 attention_smem[];
  const int BH = B * H, row_tiles = (T + kRows - 1) / kRows;
  const int bh = blockIdx.x % BH, tile = row_tiles - 1 - static_cast<int>(blockIdx.x / BH);
  const int b = bh / H, h = bh % H, kvh = h / (H / KV);
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int t0 = tile * kRows;
  const float* base = qkv + static_cast<std::size_t>(b) * T * W;
  RowBlock rb;
  rb.q = base + t0 * W + static_cast<std::size_t>(h) * hd;
  rb.q_stride = W;
  rb.k = base + static_cast<std::size_t>(H + kvh) * hd;
  rb.v = base + static_cast<std::size_t>(H + KV + kvh) * hd;
  rb.kv_stride = W;
  rb.nkeys = T;
  rb.pos0 = t0;
  rb.nrows = min(kRows, T - t0);
  rb.out = out + (static_cast<std::size_t>(b) * T + t0) * out_w + static_cast<std::size_t>(h) * hd;
  rb.out_stride = out_w;
  rb.stats = stats == nullptr ? nullptr : stats + (static_cast<std::size_t>(bh) * T + t0) * 2;
  forward_rows<HD>(reinterpret_cast<float*>(attention_smem), rb, hd, scale);
}

// out (B,Tn,H*hd) from q (B,Tn,H*hd) and the caches (B,KV,max_T,hd); past (B) on the device. A
// sequence whose past is outside [0, max_T - Tn] gets NaN rows (the device cannot throw).
template <int HD>
__global__ void __launch_bounds__(kRows)
    attention_cached_kernel(float* out, const float* q, const float* kcache, const float* vcache, int B, int Tn,
                            const int* past, int max_T, int H, int KV, int hd, float scale) {
  extern __shared__ float4 attention_smem[];
  const int BH = B * H, row_tiles = (Tn + kRows - 1) / kRows;
  const int bh = blockIdx.x % BH, tile = row_tiles - 1 - static_cast<int>(blockIdx.x / BH);
  const int b = bh / H, h = bh % H, kvh = h / (H / KV);
  const std::size_t row_w = static_cast<std::size_t>(H) * hd;
  const int t0 = tile * kRows, nrows = min(kRows, Tn - t0);
  float* y = out + (static_cast<std::size_t>(b) * Tn + t0) * row_w + static_cast<std::size_t>(h) * hd;
  const int pb = past[b];
  if (pb < 0 || pb > max_T - Tn) {  // uniform over the block: no barrier is skipped by only some threads
    if (static_cast<int>(threadIdx.x) < nrows)
      for (int d = 0; d < hd; ++d) y[static_cast<std::size_t>(threadIdx.x) * row_w + d] = NAN;
    return;
  }
  const std::size_t cache = (static_cast<std::size_t>(b) * KV + kvh) * static_cast<std::size_t>(max_T) * hd;
  RowBlock rb;
  rb.q = q + (static_cast<std::size_t>(b) * Tn + t0) * row_w + static_cast<std::size_t>(h) * hd;
  rb.q_stride = row_w;
  rb.k = kcache + cache;
  rb.v = vcache + cache;
  rb.kv_stride = static_cast<std::size_t>(hd);
  rb.nkeys = pb + Tn;
  rb.pos0 = pb + t0;
  rb.nrows = nrows;
  rb.out = y;
  rb.out_stride = row_w;
  rb.stats = nullptr;
  forward_rows<HD>(reinterpret_cast<float*>(attention_smem), rb, hd, scale);
}

// ---- backward -----------------------------------------------------------------------------------------

template <int HD>
constexpr std::size_t dq_smem_floats() {
  return 2 * static_cast<std::size_t>(HD) * kRows + 2 * static_cast<std::size_t>(HD) * kTile + kTile * kRows;
}

// dq rows of dqkv and D (B,H,T) (the scratch) for kRows query rows of one (batch, head): first
// D_i over all its keys, then dq_i (Note [cuda attention rows]). The last row tiles first.
template <int HD>
__global__ void __launch_bounds__(kRows)
    attention_backward_dq_kernel(float* dqkv, float* Dbuf, const float* dout, const float* qkv, const float* stats,
                                 int B, int T, int H, int KV, int hd, float scale) {
  extern __shared__ float4 attention_smem[];
  float* Qt = reinterpret_cast<float*>(attention_smem);     // (HD, kRows) query rows, later dq rows
  float* dOt = Qt + static_cast<std::size_t>(HD) * kRows;   // (HD, kRows) dout rows
  float* Kt = dOt + static_cast<std::size_t>(HD) * kRows;   // (HD, kTile) keys of the tile
  float* Vt = Kt + static_cast<std::size_t>(HD) * kTile;    // (HD, kTile) values of the tile
  float* S = Vt + static_cast<std::size_t>(HD) * kTile;     // (kTile, kRows) each thread's dS column
  const int BH = B * H, row_tiles = (T + kRows - 1) / kRows;
  const int bh = blockIdx.x % BH, tile = row_tiles - 1 - static_cast<int>(blockIdx.x / BH);
  const int b = bh / H, h = bh % H, kvh = h / (H / KV);
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int t0 = tile * kRows, nrows = min(kRows, T - t0);
  const int r = threadIdx.x, pos = t0 + r;
  const bool live = r < nrows;
  const std::size_t row0 = static_cast<std::size_t>(b) * T + t0;
  const float* base = qkv + static_cast<std::size_t>(b) * T * W;
  const float* k = base + static_cast<std::size_t>(H + kvh) * hd;
  const float* v = base + static_cast<std::size_t>(H + KV + kvh) * hd;
  tile_load<HD, kRows>(Qt, qkv + row0 * W + static_cast<std::size_t>(h) * hd, W, nrows, hd);
  tile_load<HD, kRows>(dOt, dout + row0 * out_w + static_cast<std::size_t>(h) * hd, out_w, nrows, hd);
  const std::size_t st = static_cast<std::size_t>(bh) * T + pos;  // this row's index in (B,H,T)
  const float m = live ? stats[2 * st] : 0.0f, inv = live ? stats[2 * st + 1] : 0.0f;
  const int keys_needed = t0 + nrows;
  float s[kTile], dp[kTile];
  float D = 0.0f;
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();
    const int nk = min(kTile, T - key0);
    tile_load<HD, kTile>(Kt, k + key0 * W, W, nk, hd);
    tile_load<HD, kTile>(Vt, v + key0 * W, W, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;
    const int n = min(kTile, pos - key0 + 1);
    row_dots2<kRows>(s, Qt, Kt, dp, dOt, Vt, r, hd);
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < n) D += expf(s[j] * scale - m) * inv * dp[j];
  }
  float dq[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) dq[d] = 0.0f;
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();
    const int nk = min(kTile, T - key0);
    tile_load<HD, kTile>(Kt, k + key0 * W, W, nk, hd);
    tile_load<HD, kTile>(Vt, v + key0 * W, W, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;
    const int n = min(kTile, pos - key0 + 1);
    row_dots2<kRows>(s, Qt, Kt, dp, dOt, Vt, r, hd);
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < n) {
        const float p = expf(s[j] * scale - m) * inv;
        S[j * kRows + r] = p * (dp[j] - D) * scale;
      }
    row_accumulate<HD>(dq, S, r, Kt, 0, n);
  }
  if (live) Dbuf[st] = D;
  __syncthreads();
  if (live) {
#pragma unroll
    for (int d = 0; d < HD; ++d) Qt[tile_index<kRows>(d, r)] = dq[d];
  }
  __syncthreads();
  tile_store<HD, kRows>(dqkv + row0 * W + static_cast<std::size_t>(h) * hd, W, Qt, nrows, hd);
}

template <int HD>
constexpr std::size_t dkdv_smem_floats() {
  return 2 * static_cast<std::size_t>(HD) * kRows + 2 * static_cast<std::size_t>(HD) * kTile +
         2 * kTile * kRows + 3 * kTile;
}

// What the dk/dv kernels read and write. part: with grouped heads (H > KV) the scratch after D,
// (2, B, H, T, hd): each query head's own dk and dv sums (Note [cuda attention group sums]).
struct DkdvArgs {
  float* dqkv;
  float* part;
  const float* D;
  const float* dout;
  const float* qkv;
  const float* stats;
  int B, T, H, KV, hd;
  float scale;
};

// Note [cuda attention group sums]: a key row's dk and dv sum the contributions of its group's
// H / KV query heads. Summed by one thread over every head in turn, the longest chain would be
// (H / KV) * T query rows and only B * KV * T / kRows blocks would run, too few for an H100 with
// grouped heads (about twice as slow, measured). So each block takes one query head's rows; with
// H > KV it writes that head's sums to the scratch, and a second kernel adds the group's sums in
// increasing head order (the first sum plus the second, plus the third, ...). With H == KV the
// blocks write dqkv directly. Either way the order is fixed by the shape alone.

// This thread's column of p (kDV) and dS (kDK) for query rows [I0, I0 + kTile / 2) of the tile
// within [i_begin, i_end): P[i * kRows + r], S[i * kRows + r].
template <bool kDK, bool kDV, int I0>
__device__ __forceinline__ void dkdv_probs(float* P, float* S, const float* Kt, const float* Vt, const float* Qt,
                                           const float* dOt, const float* Ms, const float* Is, const float* Ds, int r,
                                           int hd, int i_begin, int i_end, float scale) {
  constexpr int N = kTile / 2;
  float s[N], dp[N];
  if constexpr (kDK)
    row_dots2<kRows, N, I0>(s, Kt, Qt, dp, Vt, dOt, r, hd);
  else
    row_dots<kRows, N, I0>(s, Kt, r, Qt, hd);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int i = I0 + k;
    if (i >= i_begin && i < i_end) {
      const float p = expf(s[k] * scale - Ms[i]) * Is[i];
      if constexpr (kDV) P[i * kRows + r] = p;
      if constexpr (kDK) S[i * kRows + r] = p * (dp[k] - Ds[i]) * scale;
    }
  }
}

// The dk rows (kDK) and/or the dv rows (kDV) for kRows key rows of one (batch, kv head) from one
// query head's rows, queries increasing (Note [cuda attention rows]): into dqkv when H == KV, into
// that head's sums in a.part otherwise (Note [cuda attention group sums]). Block `block` of
// B * H * ceil(T / kRows), the first key tiles first (they have the most queries).
template <int HD, bool kDK, bool kDV>
__device__ __forceinline__ void dkdv_rows(float* sm, const DkdvArgs& a, unsigned block) {
  float* Kt = sm;                                           // (HD, kRows) key rows, later dk rows
  float* Vt = Kt + static_cast<std::size_t>(HD) * kRows;    // (HD, kRows) value rows, later dv rows
  float* Qt = Vt + static_cast<std::size_t>(HD) * kRows;    // (HD, kTile) query rows of the tile
  float* dOt = Qt + static_cast<std::size_t>(HD) * kTile;   // (HD, kTile) their dout rows
  float* P = dOt + static_cast<std::size_t>(HD) * kTile;    // (kTile, kRows) each thread's p column
  float* S = P + kTile * kRows;                             // (kTile, kRows) each thread's dS column
  float* Ms = S + kTile * kRows;                            // (kTile) the query rows' max
  float* Is = Ms + kTile;                                   // (kTile) their 1 / sum
  float* Ds = Is + kTile;                                   // (kTile) their D
  const int T = a.T, H = a.H, KV = a.KV, hd = a.hd, group = H / KV;
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int bh = static_cast<int>(block % (a.B * H)), tile = static_cast<int>(block / (a.B * H));
  const int b = bh / H, h = bh % H, kvh = h / group;
  const int k0 = tile * kRows, nkeys = min(kRows, T - k0);
  const int r = threadIdx.x, kpos = k0 + r;
  const bool live = r < nkeys;
  const std::size_t row0 = static_cast<std::size_t>(b) * T;  // the batch's first row
  const std::size_t krow0 = row0 + k0;
  tile_load<HD, kRows>(Kt, a.qkv + krow0 * W + static_cast<std::size_t>(H + kvh) * hd, W, nkeys, hd);
  tile_load<HD, kRows>(Vt, a.qkv + krow0 * W + static_cast<std::size_t>(H + KV + kvh) * hd, W, nkeys, hd);
  float dk[kDK ? HD : 1], dv[kDV ? HD : 1];
#pragma unroll
  for (int d = 0; d < (kDK ? HD : 1); ++d) dk[d] = 0.0f;
#pragma unroll
  for (int d = 0; d < (kDV ? HD : 1); ++d) dv[d] = 0.0f;
  const std::size_t st0 = static_cast<std::size_t>(bh) * T;  // row 0 of this head in (B,H,T)
  for (int i0 = k0; i0 < T; i0 += kTile) {  // k0 is a multiple of kTile: query tiles from the block's first key
    __syncthreads();
    const int nq = min(kTile, T - i0);
    tile_load<HD, kTile>(Qt, a.qkv + (row0 + i0) * W + static_cast<std::size_t>(h) * hd, W, nq, hd);
    tile_load<HD, kTile>(dOt, a.dout + (row0 + i0) * out_w + static_cast<std::size_t>(h) * hd, out_w, nq, hd);
    if (r < kTile) {
      const bool q_live = r < nq;
      Ms[r] = q_live ? a.stats[2 * (st0 + i0 + r)] : 0.0f;
      Is[r] = q_live ? a.stats[2 * (st0 + i0 + r) + 1] : 0.0f;
      Ds[r] = q_live ? a.D[st0 + i0 + r] : 0.0f;
    }
    __syncthreads();
    if (!live || kpos >= i0 + nq) continue;  // no query of this tile attends to this key
    const int i_begin = max(0, kpos - i0), i_end = nq;
    // p and dS of the tile's two halves in turn (fewer live registers beside dk and dv).
    if (i_begin < kTile / 2)
      dkdv_probs<kDK, kDV, 0>(P, S, Kt, Vt, Qt, dOt, Ms, Is, Ds, r, hd, i_begin, i_end, a.scale);
    if (i_end > kTile / 2)
      dkdv_probs<kDK, kDV, kTile / 2>(P, S, Kt, Vt, Qt, dOt, Ms, Is, Ds, r, hd, i_begin, i_end, a.scale);
    if constexpr (kDV) row_accumulate<HD>(dv, P, r, dOt, i_begin, i_end);
    if constexpr (kDK) row_accumulate<HD>(dk, S, r, Qt, i_begin, i_end);
  }
  __syncthreads();
  if (live) {
    if constexpr (kDK) {
#pragma unroll
      for (int d = 0; d < HD; ++d) Kt[tile_index<kRows>(d, r)] = dk[d];
    }
    if constexpr (kDV) {
#pragma unroll
      for (int d = 0; d < HD; ++d) Vt[tile_index<kRows>(d, r)] = dv[d];
    }
  }
  __syncthreads();
  // Rows of dk at dk_out + r * stride, of dv at dv_out + r * stride.
  float *dk_out, *dv_out;
  std::size_t stride;
  if (group > 1) {
    const std::size_t part_floats = static_cast<std::size_t>(a.B) * H * T * hd;
    dk_out = a.part + (static_cast<std::size_t>(bh) * T + k0) * hd;
    dv_out = dk_out + part_floats;
    stride = static_cast<std::size_t>(hd);
  } else {
    dk_out = a.dqkv + krow0 * W + static_cast<std::size_t>(H + kvh) * hd;
    dv_out = a.dqkv + krow0 * W + static_cast<std::size_t>(H + KV + kvh) * hd;
    stride = W;
  }
  if constexpr (kDK) tile_store<HD, kRows>(dk_out, stride, Kt, nkeys, hd);
  if constexpr (kDV) tile_store<HD, kRows>(dv_out, stride, Vt, nkeys, hd);
}

// The dk rows (kDK) and/or the dv rows (kDV) of B * H * ceil(T / kRows) key blocks.
template <int HD, bool kDK, bool kDV>
__global__ void __launch_bounds__(kRows) attention_backward_dkdv_kernel(DkdvArgs a) {
  extern __shared__ float4 attention_smem[];
  dkdv_rows<HD, kDK, kDV>(reinterpret_cast<float*>(attention_smem), a, blockIdx.x);
}

// dk and dv of dqkv = the sums of the group's per-head sums in a.part, heads increasing (Note
// [cuda attention group sums]). One thread per element.
__global__ void attention_backward_group_sum_kernel(DkdvArgs a) {
  const std::size_t n = 2 * static_cast<std::size_t>(a.B) * a.T * a.KV * a.hd;
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= n) return;
  const int hd = a.hd, group = a.H / a.KV;
  const int d = static_cast<int>(idx % hd);
  const int kvh = static_cast<int>(idx / hd % a.KV);
  const std::size_t row = idx / (static_cast<std::size_t>(hd) * a.KV);  // (which, b, t)
  const std::size_t BT = static_cast<std::size_t>(a.B) * a.T;
  const int which = static_cast<int>(row / BT);  // 0: dk, 1: dv
  const std::size_t bt = row % BT, b = bt / a.T, t = bt % a.T;
  const float* src = a.part + which * static_cast<std::size_t>(a.B) * a.H * a.T * hd +
                     ((b * a.H + static_cast<std::size_t>(kvh) * group) * a.T + t) * hd + d;
  const std::size_t head_stride = static_cast<std::size_t>(a.T) * hd;
  float acc = src[0];
  for (int g = 1; g < group; ++g) acc += src[g * head_stride];
  const std::size_t W = static_cast<std::size_t>(a.H + 2 * a.KV) * hd;
  a.dqkv[bt * W + static_cast<std::size_t>(a.H + which * a.KV + kvh) * hd + d] = acc;
}

// ---- launches -----------------------------------------------------------------------------------------

void check_shape(const char* what, int B, int T, int H, int KV, int hd) {
  STRATUM_CHECK(B >= 0 && T >= 0, "[kernels.attention] ", what, ": B and T must be >= 0, got ", B, " and ", T);
  STRATUM_CHECK(H > 0 && KV > 0 && hd > 0, "[kernels.attention] ", what, ": H, KV, hd must be > 0, got ", H, ", ",
                KV, ", ", hd);
  STRATUM_CHECK(H % KV == 0, "[kernels.attention] ", what, ": query heads H=", H,
                " must be a multiple of the key/value heads KV=", KV);
  STRATUM_CHECK(hd <= kMaxHeadDim, "[kernels.attention] ", what, ": the CUDA backend supports head sizes up to ",
                kMaxHeadDim, ", got ", hd);
}

// The scale of the scores, computed as the CPU computes it (kernels/cpu/attention.cpp).
float score_scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }

// Launches kernel with `floats` of dynamic shared memory (opting in above the default 48 KiB).
template <class Kernel, class... Args>
void launch(const CudaContext& ctx, Kernel kernel, std::size_t blocks, std::size_t floats, Args... args) {
  const std::size_t bytes = floats * sizeof(float);
  STRATUM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<static_cast<unsigned>(blocks), kRows, bytes, ctx.stream>>>(args...);
  STRATUM_CUDA_LAUNCHED();
}

// fn.template operator()<HD>() for the smallest compiled head size HD >= hd.
template <class Fn>
void dispatch_head_dim(int hd, Fn&& fn) {
  if (hd <= 16)
    fn.template operator()<16>();
  else if (hd <= 32)
    fn.template operator()<32>();
  else if (hd <= 64)
    fn.template operator()<64>();
  else
    fn.template operator()<128>();
}

std::size_t row_blocks(int B, int heads, int rows) {
  return static_cast<std::size_t>(B) * heads * ((static_cast<std::size_t>(rows) + kRows - 1) / kRows);
}

void forward_launch(const CudaContext& ctx, float* out, float* stats, const float* qkv, int B, int T, int H, int KV,
                    int hd) {
  check_shape("attention_forward", B, T, H, KV, hd);
  const std::size_t blocks = row_blocks(B, H, T);
  if (blocks == 0) return;
  const float scale = score_scale(hd);
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_forward_kernel<HD>, blocks, forward_smem_floats<HD>(), out, stats, qkv, B, T, H, KV, hd,
           scale);
  });
}

void backward_launch(const CudaContext& ctx, float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* stats, int B, int T, int H, int KV, int hd) {
  check_shape("attention_backward", B, T, H, KV, hd);
  const std::size_t blocks = row_blocks(B, H, T);  // of the dq and of the dk/dv kernels
  if (blocks == 0) return;
  const float scale = score_scale(hd);
  DkdvArgs a{dqkv, scratch + static_cast<std::size_t>(B) * H * T, scratch, dout, qkv, stats, B, T, H, KV, hd, scale};
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_backward_dq_kernel<HD>, blocks, dq_smem_floats<HD>(), dqkv, scratch, dout, qkv, stats, B, T,
           H, KV, hd, scale);
    if constexpr (HD <= 64) {
      launch(ctx, attention_backward_dkdv_kernel<HD, true, true>, blocks, dkdv_smem_floats<HD>(), a);
    } else {  // dk and dv rows of 128 floats each do not fit one thread's registers together
      launch(ctx, attention_backward_dkdv_kernel<HD, false, true>, blocks, dkdv_smem_floats<HD>(), a);
      launch(ctx, attention_backward_dkdv_kernel<HD, true, false>, blocks, dkdv_smem_floats<HD>(), a);
    }
  });
  if (H > KV) {  // Note [cuda attention group sums]
    const std::size_t n = 2 * static_cast<std::size_t>(B) * T * KV * hd;
    attention_backward_group_sum_kernel<<<blocks_for(n, 256), 256, 0, ctx.stream>>>(a);
    STRATUM_CUDA_LAUNCHED();
  }
}

void cached_launch(const CudaContext& ctx, float* out, const float* q, const float* kcache, const float* vcache, int B,
                   int Tn, const int* past, int max_T, int H, int KV, int hd) {
  check_shape("attention_cached", B, Tn, H, KV, hd);
  STRATUM_CHECK(Tn <= max_T, "[kernels.attention] attention_cached: ", Tn, " new positions exceed the cache's max_T ",
                max_T);
  const std::size_t blocks = row_blocks(B, H, Tn);
  if (blocks == 0) return;
  const float scale = score_scale(hd);
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_cached_kernel<HD>, blocks, forward_smem_floats<HD>(), out, q, kcache, vcache, B, Tn, past,
           max_T, H, KV, hd, scale);
  });
}

}  // namespace

std::size_t CudaOps::attention_scratch_floats(int B, int T, int H, int KV, int hd) const {
  check_shape("attention_scratch_floats", B, T, H, KV, hd);
  // D (B,H,T) of the backward, then with grouped heads the per-head dk and dv sums (2,B,H,T,hd)
  // (Note [cuda attention group sums]); the forward needs none.
  const std::size_t rows = static_cast<std::size_t>(B) * H * T;
  return rows + (H > KV ? 2 * rows * hd : 0);
}

void CudaOps::attention_forward(float* out, float* stats, float* /*scratch*/, const float* qkv, int B, int T, int H,
                                int KV, int hd) const {
  forward_launch(*ctx_, out, stats, qkv, B, T, H, KV, hd);
}

void CudaOps::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* stats,
                                 int B, int T, int H, int KV, int hd) const {
  backward_launch(*ctx_, dqkv, scratch, dout, qkv, stats, B, T, H, KV, hd);
}

std::size_t CudaOps::attention_cached_scratch_floats(int hd, int max_T) const {
  STRATUM_CHECK(hd > 0 && hd <= kMaxHeadDim && max_T > 0,
                "[kernels.attention] attention_cached_scratch_floats: bad shape hd ", hd, " max_T ", max_T,
                " (the CUDA backend supports head sizes up to ", kMaxHeadDim, ")");
  return 0;  // everything lives in shared memory and registers
}

void CudaOps::attention_cached(float* out, float* /*scratch*/, const float* q, const float* kcache,
                               const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV,
                               int hd) const {
  cached_launch(*ctx_, out, q, kcache, vcache, B, Tn, past, max_T, H, KV, hd);
}

}  // namespace stratum
