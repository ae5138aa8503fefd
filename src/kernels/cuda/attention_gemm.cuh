// The CUDA attention's training forward and backward as matrix products (Note [cuda attention
// products]): the query blocking, the scratch it needs, and the batched cuBLAS call. Included by
// attention.cu (the forward) and attention_backward.cu only.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace stratum {

namespace {

// Note [cuda attention products]: the training forward and backward of query rows [a0, a1) of
// one sequence against its keys [0, a1) run as matrix products per query head, as PyTorch's eager
// attention does, with the (a1 - a0, a1) score matrices in the scratch:
//   forward:  S = Q K^T;  m_i = max_{j<=i} S_ij * scale,  P_ij = exp(S_ij * scale - m_i) / l_i for
//             j <= i (l_i the sum of the exps), 0 after;  O = P V;  stats {m_i, inv_i = 1 / l_i};
//   backward: S = Q K^T,  dP = dO V^T;  P_ij = exp(S_ij * scale - m_i) * inv_i from the stats;
//             D_i = sum_j P_ij dP_ij,  dS_ij = P_ij (dP_ij - D_i) * scale (in place of S and dP);
//             dQ = dS K (written),  dK += dS^T Q,  dV += P^T dO.
// cuBLAS runs the products (strided batches over kv heads, fp32 without TF32; Note [cuda
// determinism]), one kernel the softmax rows: a block per row, each thread's keys in increasing
// order, then the block's fixed tree (row_reduce.cuh). The forward and the backward compute S by
// the same call, so the backward's P has the forward's bits. As per-row kernels in registers
// (Note [cuda attention rows], which the KV-cache variant still runs) the attention took 57 ms
// of GPT-2 small's 168 ms step (B4 T1024, H200), at 5-10% of the GPU's fp32 rate.
//
// The sums: a query head h of a group of H/KV shares its kv head's dK and dV rows, so the
// group's heads are taken in increasing order (j = h % (H/KV)), each product adding to what the
// previous heads left (beta 1), the first head writing the block's own keys (beta 0); a key
// before a0 adds to what earlier ranges (or blocks) left. Every element is one chain in a fixed
// order, cuBLAS's over each product's inner dimension and ours over the products, so the bits
// depend on the inputs, the query blocks and the GPU model only. The query blocks are fixed by
// the shape (attention_blocking) and the row ranges by the block's row chunks (Note [row chunks]
// in model/block_policy.h: a function of B*T alone), so every budget, policy and prefetch depth
// gets the same bits. Another partition of the rows into ranges gives other roundings of the same
// sums (and other products' shapes), unlike the row kernels of the KV-cache variant, whose rows
// therefore agree with the forward's to rounding, not bit for bit.

constexpr std::size_t kScratchCap = std::size_t{24} << 20;  // floats of S and dP together (96 MiB)
constexpr int kMaxQueryRows = 1024;                        // query rows per block of products
constexpr int kSoftmaxThreads = 256;

// How a sequence's query rows are blocked and its heads batched: blocks of at most `rows` query
// rows, `heads` kv heads' products per cuBLAS batch; both a function of T and KV alone.
struct Blocking {
  int T, rows, heads;
  // The scratch: S and dP of one batch.
  std::size_t floats() const { return 2 * static_cast<std::size_t>(heads) * rows * T; }
};

inline Blocking attention_blocking(int T, int KV) {
  Blocking bl{};
  bl.T = std::max(T, 1);
  const std::size_t per_row = 2 * static_cast<std::size_t>(bl.T);  // S and dP of one query row, one head
  std::size_t rows = std::min<std::size_t>(kMaxQueryRows, kScratchCap / per_row);
  rows = std::max<std::size_t>(32, rows / 32 * 32);
  bl.rows = static_cast<int>(std::min<std::size_t>(rows, bl.T));
  const std::size_t heads = kScratchCap / (per_row * bl.rows);
  bl.heads = static_cast<int>(std::clamp<std::size_t>(heads, 1, static_cast<std::size_t>(KV)));
  return bl;
}

// Row-major C = op(A) op(B) + beta C for `batch` matrices at the given strides (floats):
// column-major C^T = op(B)^T op(A)^T, so cuBLAS gets B first (as CudaOps::sgemm).
inline void gemm_batched(const CudaContext::Lane& ln, bool ta, bool tb, int M, int N, int K, const float* A, int lda,
                         long long sa, const float* B, int ldb, long long sb, float beta, float* C, int ldc,
                         long long sc, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const float alpha = 1.0f;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATUM_CUBLAS_CHECK(cublasSgemmStridedBatched(ln.blas, op_b, op_a, N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta,
                                                 C, ldc, sc, batch));
}

// One cuBLAS batch of a query block (Note [cuda attention products]): query rows [a0, a1) of
// sequence b, the group's j-th query head of kv heads kv0 .. kv0 + nb - 1 (query head h0 + c *
// group for batch item c), against keys [0, a1).
struct HeadBatch {
  const float* seq;  // the sequence's row 0 of qkv
  long long W;       // floats per qkv row
  long long qs;      // floats between the batch's query heads (in a qkv row and in a dout/out row)
  int hd, nq, nk, a0, h0, kv0, nb, H, KV;
  long long mat() const { return static_cast<long long>(nq) * nk; }
  const float* q() const { return seq + a0 * W + static_cast<long long>(h0) * hd; }
  const float* k() const { return seq + static_cast<long long>(H + kv0) * hd; }
  const float* v() const { return seq + static_cast<long long>(H + KV + kv0) * hd; }
  // S (nb, nq, nk) = Q K^T: the one call the forward and the backward share.
  void scores(const CudaContext::Lane& ln, float* S) const {
    gemm_batched(ln, false, true, nq, nk, hd, q(), static_cast<int>(W), qs, k(), static_cast<int>(W), hd, 0.0f, S,
                 nk, mat(), nb);
  }
};

// f(HeadBatch) for the block [a0, a1) of sequence b: the group's heads in increasing order, each
// over the kv heads in batches of bl.heads.
template <class F>
void for_each_head_batch(const Blocking& bl, const float* qkv, int T, int H, int KV, int hd, int b, int a0, int a1,
                         F&& f) {
  const int group = H / KV;
  HeadBatch hb{};
  hb.W = static_cast<long long>(H + 2 * KV) * hd;
  hb.seq = qkv + static_cast<long long>(b) * T * hb.W;
  hb.qs = static_cast<long long>(group) * hd;
  hb.hd = hd;
  hb.nq = a1 - a0;
  hb.nk = a1;
  hb.a0 = a0;
  hb.H = H;
  hb.KV = KV;
  for (int j = 0; j < group; ++j)
    for (int kv0 = 0; kv0 < KV; kv0 += bl.heads) {
      hb.kv0 = kv0;
      hb.nb = std::min(bl.heads, KV - kv0);
      hb.h0 = kv0 * group + j;
      f(static_cast<const HeadBatch&>(hb), j);
    }
}

// f(b, a0, a1, local) for each block [a0, a1) of query positions of sequence b among the rows rr,
// in increasing order; local: the block's first row within the range's rows.
template <class F>
void for_each_query_block(const RowRange& rr, const Blocking& bl, F&& f) {
  for (int si = 0; si < rr.seqs; ++si) {
    const SeqRange sr = rr.seq(si);
    for (int a0 = sr.q0; a0 < sr.q1; a0 += bl.rows)
      f(rr.first + si, a0, std::min(sr.q1, a0 + bl.rows), sr.local0 + static_cast<std::size_t>(a0 - sr.q0));
  }
}

// Note [attention lanes] (cuda_context.cuh): the lanes a launch over the range's sequences uses.
// f(b, a0, a1, local, lane, lane_scratch) as for_each_query_block, sequence b (its every block, in
// order) on lane (b - first) % lanes, with that lane's part of the scratch (bl.floats() each);
// forked after the main stream's work and joined back before returning.
template <class F>
void for_each_query_block_on_lanes(CudaContext& ctx, const RowRange& rr, const Blocking& bl, float* scratch, F&& f) {
  const int lanes = std::min(ctx.lanes_max, rr.seqs);
  if (lanes > 1) ctx.lanes_fork(lanes);
  for_each_query_block(rr, bl, [&](int b, int a0, int a1, std::size_t local) {
    const int li = (b - rr.first) % std::max(lanes, 1);
    f(b, a0, a1, local, ctx.lane(li), scratch + static_cast<std::size_t>(li) * bl.floats());
  });
  if (lanes > 1) ctx.lanes_join(lanes);
}

// Floats of the scratch for up to B sequences of up to T positions: a lane's (the most any length
// up to T needs: shorter ones can block into more) times the lanes.
inline std::size_t attention_scratch_floats_for(int B, int T, int KV, int lanes_max) {
  std::size_t most = 0;
  for (int t = 1; t <= T; ++t) most = std::max(most, attention_blocking(t, KV).floats());
  return most * static_cast<std::size_t>(std::clamp(B, 1, lanes_max));
}

}  // namespace

}  // namespace stratum
