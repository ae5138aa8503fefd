// The CUDA attention's row kernels (the KV-cache variant in attention.cu; the training forward
// and backward are matrix products, Note [cuda attention products] in attention_gemm.cuh): the
// row arithmetic of Note [cuda attention rows], tiles and launches, and the shape checks the
// products share.
// Causal grouped-query attention of the CUDA backend: the semantics of kernels/cpu/attention.h
// (qkv rows [q (H*hd) | k (KV*hd) | v (KV*hd)], query head h reads kv head h / (H/KV), scores
// (q . k) * (1/sqrt(hd)), stats (B,H,T,2) = {maximum scaled score, 1 / sum of exps} per softmax
// row, the backward replaying the probabilities from them), and the KV-cache variant. Head sizes
// up to 128 (kernels compiled for 16, 32, 64, 128; a smaller hd runs the next size up). Does not
// allocate and does not synchronise the stream.
//
// Note [cuda attention rows]: a group of L lanes of a warp (L = 4, or 8 for HD = 128) owns one
// query row. Lane g of the group owns the DL = HD / L dimensions d = 4 * (g + L * c) + e (c < DL
// / 4, e < 4) of the row: it keeps them of its q and of the output accumulator in registers, and
// it alone writes them. A block of kRows = 32 rows (32 * L threads) walks the keys in tiles of
// kTile = 32 rows that it loads together into shared memory, row-major. Every sum runs in a fixed
// order that depends on no launch parameter, only on the compile-time constants L, kTile and
// kChunk:
//  - a score q . k is, per lane, a sum over the lane's dimensions from 0.0f with d increasing,
//    then the group's partial sums combined by one fixed tree, ((p0 + p1) + (p2 + p3)) for L = 4
//    (and + ((p4 + p5) + (p6 + p7)) for L = 8): a reduce-scatter over kChunk rows of the tile at a
//    time by __shfl_xor (xor 1, 2, 4), after which lane g holds the scores of the tile rows j = g
//    + L * i. Float addition commutes, so the bits do not depend on which lane adds; every score
//    of every row uses the same tree;
//  - the lane owning a score computes its probability (no other lane does), p = exp(s * scale -
//    m_new), and writes it to its group's row of shared memory (a __syncwarp over the group),
//    from which every lane of the group reads them for its own dimensions;
//  - the softmax is online per key tile: m_new = max(m, tile max) (the exact maximum, by a group
//    max), alpha = exp(m - m_new), l = l * alpha + the tile's sum (each lane's own
//    probabilities, tile rows increasing, then the group tree), the output acc = acc * alpha +
//    sum of p * v (keys increasing); finally out = acc * (1 / l). m is the maximum the CPU finds;
//    l differs from the CPU's sum by rounding only;
//  - a row skips the tiles past its position and the keys it does not attend to (the masked
//    scores are computed and dropped), so its arithmetic depends only on its own inputs, not on
//    which rows share its block, its past or the number of new positions Tn.
// Hence the bits depend only on the inputs and the GPU model (Note [cuda determinism]). The
// training forward's products round otherwise, so a cached row agrees with the forward's row at
// its position to rounding (the CPU's variant gives the bits, Note [cached attention bits] in
// kernels/cpu/attention.h).
//
// Shared memory: a tile row j is read by a group as float4s at j * HD + 4 * (g + L * c), the
// groups of a warp on the same row (broadcasts; the L lanes read consecutive float4s). The
// per-row probability rows are kPStride = kTile + 4 floats apart, so the groups of a warp reading
// their float4s of p hit distinct banks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cuda/cuda_context.cuh"
#include "ops/attention_rows.h"

namespace stratum {

namespace {

constexpr int kRows = 32;              // rows each block owns (Note [cuda attention rows])
constexpr int kTile = 32;              // rows of the other side per shared tile
constexpr int kChunk = 16;             // tile rows whose scores are reduced together
constexpr int kPStride = kTile + 4;    // floats between the groups' probability rows
constexpr int kMaxHeadDim = 128;

// The lane split of a head size HD (Note [cuda attention rows]).
template <int HD>
struct Lanes {
  static_assert(HD % 16 == 0 && HD <= kMaxHeadDim, "compiled head sizes");
  static constexpr int L = HD >= 128 ? 8 : 4;  // lanes per row
  static constexpr int DL = HD / L;            // dimensions per lane
  static constexpr int NT = kRows * L;         // threads per block
  static constexpr int NS = kTile / L;         // scores each lane owns per tile
};

// The lanes of this thread's group of L.
template <int L>
__device__ __forceinline__ unsigned group_mask() {
  const unsigned lane = threadIdx.x & 31u;
  return ((1u << L) - 1u) << (lane & ~static_cast<unsigned>(L - 1));
}

// ---- per-lane row arithmetic --------------------------------------------------------------------------

// The lane's k-th dimension: 4 * (g + L * (k / 4)) + k % 4, increasing with k.
template <int L>
__device__ __forceinline__ int lane_dim(int g, int k) {
  return 4 * (g + L * (k / 4)) + k % 4;
}

// x = this lane's dimensions of row (zero past hd or for a dead row).
template <int HD>
__device__ __forceinline__ void lane_load(float (&x)[Lanes<HD>::DL], const float* row, int g, int hd, bool live) {
#pragma unroll
  for (int k = 0; k < Lanes<HD>::DL; ++k) {
    const int d = lane_dim<Lanes<HD>::L>(g, k);
    x[k] = live && d < hd ? row[d] : 0.0f;
  }
}

// This lane's dimensions (below hd) of row = x.
template <int HD>
__device__ __forceinline__ void lane_store(float* row, const float (&x)[Lanes<HD>::DL], int g, int hd) {
#pragma unroll
  for (int k = 0; k < Lanes<HD>::DL; ++k) {
    const int d = lane_dim<Lanes<HD>::L>(g, k);
    if (d < hd) row[d] = x[k];
  }
}

// sum over this lane's dimensions of x[d] * row[d], d increasing from 0.0f (row in shared memory).
template <int HD>
__device__ __forceinline__ float lane_dot(const float (&x)[Lanes<HD>::DL], const float* row, int g) {
  constexpr int L = Lanes<HD>::L;
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < Lanes<HD>::DL / 4; ++c) {
    const float4 b = *reinterpret_cast<const float4*>(row + 4 * (g + L * c));
    s += x[4 * c] * b.x;
    s += x[4 * c + 1] * b.y;
    s += x[4 * c + 2] * b.z;
    s += x[4 * c + 3] * b.w;
  }
  return s;
}

// acc[d] += a * row[d] for this lane's dimensions.
template <int HD>
__device__ __forceinline__ void lane_axpy(float (&acc)[Lanes<HD>::DL], float a, const float* row, int g) {
  constexpr int L = Lanes<HD>::L;
#pragma unroll
  for (int c = 0; c < Lanes<HD>::DL / 4; ++c) {
    const float4 b = *reinterpret_cast<const float4*>(row + 4 * (g + L * c));
    acc[4 * c] += a * b.x;
    acc[4 * c + 1] += a * b.y;
    acc[4 * c + 2] += a * b.z;
    acc[4 * c + 3] += a * b.w;
  }
}

// The group's maximum and sum of x (the xor tree; every lane gets the same bits).
template <int L>
__device__ __forceinline__ float group_max(float x, unsigned mask) {
#pragma unroll
  for (int b = 1; b < L; b <<= 1) x = fmaxf(x, __shfl_xor_sync(mask, x, b));
  return x;
}
template <int L>
__device__ __forceinline__ float group_sum(float x, unsigned mask) {
#pragma unroll
  for (int b = 1; b < L; b <<= 1) x += __shfl_xor_sync(mask, x, b);
  return x;
}

// v[j] (j < N) = this lane's partial sums of N items; on return v[t] (t < N / L) = the group's sum
// of item L * t + g, by the tree of Note [cuda attention rows]: at each level b = 1, 2, 4 the lane
// keeps the items whose bit b matches its own and adds its partner's partial sums of them.
template <int L, int N, int B = 1>
__device__ __forceinline__ void reduce_scatter(float (&v)[N], int g, unsigned mask) {
  if constexpr (B < L) {
    constexpr int n = N / B;  // items still held
    const bool hi = (g & B) != 0;
#pragma unroll
    for (int m = 0; m < n / 2; ++m) {
      const float keep = hi ? v[2 * m + 1] : v[2 * m];
      const float send = hi ? v[2 * m] : v[2 * m + 1];
      v[m] = keep + __shfl_xor_sync(mask, send, B);
    }
    reduce_scatter<L, N, 2 * B>(v, g, mask);
  }
}

// s[i] = x . row j of the tile Xt (kTile rows of HD floats) for j = g + L * i: the scores this lane
// owns (Note [cuda attention rows]).
template <int HD>
__device__ __forceinline__ void tile_scores(float (&s)[Lanes<HD>::NS], const float (&x)[Lanes<HD>::DL],
                                            const float* Xt, int g, unsigned mask) {
  constexpr int L = Lanes<HD>::L;
  static_assert(kTile % kChunk == 0 && kChunk % L == 0, "whole chunks");
#pragma unroll
  for (int c0 = 0; c0 < kTile; c0 += kChunk) {
    float part[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) part[j] = lane_dot<HD>(x, Xt + (c0 + j) * HD, g);
    reduce_scatter<L, kChunk>(part, g, mask);
#pragma unroll
    for (int t = 0; t < kChunk / L; ++t) s[c0 / L + t] = part[t];
  }
}

// acc[d] += sum_{j in [j0, j1)} coef[j] * row j of Xt, j increasing, this lane's dimensions; coef is
// the group's row of probabilities in shared memory.
template <int HD>
__device__ __forceinline__ void lane_accumulate(float (&acc)[Lanes<HD>::DL], const float* coef, const float* Xt,
                                                int g, int j0, int j1) {
  if (j0 == 0 && j1 == kTile) {
#pragma unroll 2
    for (int j = 0; j < kTile; j += 4) {
      const float4 c = *reinterpret_cast<const float4*>(coef + j);
      lane_axpy<HD>(acc, c.x, Xt + j * HD, g);
      lane_axpy<HD>(acc, c.y, Xt + (j + 1) * HD, g);
      lane_axpy<HD>(acc, c.z, Xt + (j + 2) * HD, g);
      lane_axpy<HD>(acc, c.w, Xt + (j + 3) * HD, g);
    }
  } else {
    for (int j = j0; j < j1; ++j) lane_axpy<HD>(acc, coef[j], Xt + j * HD, g);
  }
}

// ---- shared-memory tiles ----------------------------------------------------------------------------

// t (kTile, HD) row-major = rows [0, kTile) of src (row r at src + r * stride), zero for rows >=
// nvalid and dimensions >= hd. All NT threads of the block take part; the caller synchronises.
template <int HD>
__device__ __forceinline__ void tile_load(float* t, const float* src, std::size_t stride, int nvalid, int hd) {
  static_assert(kTile * HD % Lanes<HD>::NT == 0, "whole passes of the block");
#pragma unroll 4
  for (int it = 0; it < kTile * HD / Lanes<HD>::NT; ++it) {  // loads issued 4 at a time
    const int i = static_cast<int>(threadIdx.x) + it * Lanes<HD>::NT, r = i / HD, d = i % HD;
    t[i] = r < nvalid && d < hd ? src[static_cast<std::size_t>(r) * stride + d] : 0.0f;
  }
}

// ---- forward and cached variant ----------------------------------------------------------------------

template <int HD>
constexpr std::size_t forward_smem_floats() {
  return 2 * static_cast<std::size_t>(HD) * kTile + kRows * kPStride;
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
  using G = Lanes<HD>;
  float* Kt = sm;                                         // (kTile, HD) keys of the tile
  float* Vt = Kt + static_cast<std::size_t>(HD) * kTile;  // (kTile, HD) values of the tile
  const int r = threadIdx.x / G::L, g = threadIdx.x % G::L;
  float* P = Vt + static_cast<std::size_t>(HD) * kTile + r * kPStride;  // the group's p row
  const unsigned mask = group_mask<G::L>();
  const int pos = rb.pos0 + r;
  const bool live = r < rb.nrows;
  float q[G::DL], acc[G::DL];
  lane_load<HD>(q, rb.q + static_cast<std::size_t>(r) * rb.q_stride, g, hd, live);
#pragma unroll
  for (int k = 0; k < G::DL; ++k) acc[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int keys_needed = rb.pos0 + rb.nrows;
  for (int key0 = 0; key0 < keys_needed; key0 += kTile) {
    __syncthreads();  // the previous tile consumed
    const int nk = min(kTile, rb.nkeys - key0);
    tile_load<HD>(Kt, rb.k + static_cast<std::size_t>(key0) * rb.kv_stride, rb.kv_stride, nk, hd);
    tile_load<HD>(Vt, rb.v + static_cast<std::size_t>(key0) * rb.kv_stride, rb.kv_stride, nk, hd);
    __syncthreads();
    if (!live || key0 > pos) continue;  // uniform over the group
    const int n = min(kTile, pos - key0 + 1);  // keys of this tile the row attends to
    float s[G::NS];
    tile_scores<HD>(s, q, Kt, g, mask);
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < G::NS; ++i)
      if (g + G::L * i < n) {
        s[i] *= scale;
        tile_max = fmaxf(tile_max, s[i]);
      }
    const float m_new = fmaxf(m, group_max<G::L>(tile_max, mask));
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < G::NS; ++i) {
      const int j = g + G::L * i;
      const float p = j < n ? expf(s[i] - m_new) : 0.0f;
      tile_sum += p;
      P[j] = p;
    }
    l = l * alpha + group_sum<G::L>(tile_sum, mask);
    __syncwarp(mask);  // the group's p row written
#pragma unroll
    for (int k = 0; k < G::DL; ++k) acc[k] *= alpha;
    lane_accumulate<HD>(acc, P, Vt, g, 0, n);
    m = m_new;
    __syncwarp(mask);  // read before the next tile writes it
  }
  if (!live) return;  // no barrier follows
  const float inv = 1.0f / l;
#pragma unroll
  for (int k = 0; k < G::DL; ++k) acc[k] *= inv;
  lane_store<HD>(rb.out + static_cast<std::size_t>(r) * rb.out_stride, acc, g, hd);
  if (rb.stats != nullptr && g == 0) {
    rb.stats[2 * r] = m;
    rb.stats[2 * r + 1] = inv;
  }
}

// ---- launches -----------------------------------------------------------------------------------------

// attention_check_shape (ops/attention_rows.h), and head sizes this backend compiles kernels for.
void check_shape(const char* what, int B, int T, int H, int KV, int hd) {
  attention_check_shape(what, B, T, H, KV, hd);
  STRATUM_CHECK(hd <= kMaxHeadDim, "[kernels.attention] ", what, ": the CUDA backend supports head sizes up to ",
                kMaxHeadDim, ", got ", hd);
}

// The scale of the scores, computed as the CPU computes it (kernels/cpu/attention.cpp).
float score_scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }

// Launches kernel with `threads` per block and `floats` of dynamic shared memory (opting in above
// the default 48 KiB).
template <class Kernel, class... Args>
void launch(const CudaContext& ctx, Kernel kernel, std::size_t blocks, int threads, std::size_t floats,
            Args... args) {
  const std::size_t bytes = floats * sizeof(float);
  STRATUM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<static_cast<unsigned>(blocks), threads, bytes, ctx.stream>>>(args...);
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

// Blocks of kRows rows covering `rows`.
inline std::size_t tiles_of(int rows) { return (static_cast<std::size_t>(rows) + kRows - 1) / kRows; }

}  // namespace

}  // namespace stratum
