// Causal grouped-query attention of the CUDA backend, the backward: the score matrices of a
// query block against its keys in scratch, their products by cuBLAS (Note [cuda attention
// products] in attention_gemm.cuh), over query row ranges (Note [attention row ranges] in
// kernels/cpu/attention.h). The forward and the KV-cache variant: attention.cu.
#include "kernels/cuda/attention_gemm.cuh"

namespace stratum {

namespace {

// The backward's softmax rows (Note [cuda attention products]) for one batch: block (i, c) takes
// query row a0 + i of batch head c (query head h0 + c * group, its stats at stats + (c * group *
// T + a0 + i) * 2). S and dP: (heads, nq, nk); P replaces S, dS replaces dP.
__global__ void __launch_bounds__(kSoftmaxThreads)
    attention_backward_softmax_kernel(float* S, float* dP, const float* stats, int nq, int nk, int a0, int T,
                                      int group, float scale) {
  __shared__ cuda_reduce::BlockScratch<kSoftmaxThreads> red;
  const int i = blockIdx.x, c = blockIdx.y, pos = a0 + i;
  const std::size_t at = (static_cast<std::size_t>(c) * nq + i) * nk;
  float* s = S + at;
  float* dp = dP + at;
  const float* st = stats + (static_cast<std::size_t>(c) * group * T + pos) * 2;
  const float m = st[0], inv = st[1];
  const int keys = min(pos + 1, nk);  // keys this row attends to
  float D = 0.0f;
  for (int j = threadIdx.x; j < keys; j += kSoftmaxThreads) D += expf(s[j] * scale - m) * inv * dp[j];
  D = cuda_reduce::block_sum<kSoftmaxThreads>(D, red);
  for (int j = threadIdx.x; j < nk; j += kSoftmaxThreads) {
    if (j < keys) {
      const float p = expf(s[j] * scale - m) * inv;
      s[j] = p;
      dp[j] = p * (dp[j] - D) * scale;
    } else {
      s[j] = 0.0f;
      dp[j] = 0.0f;
    }
  }
}

// The backward of query rows [a0, a1) of sequence b (dout row of position a0 at dO0) against keys
// [0, a1): Note [cuda attention products].
void backward_block(const CudaContext::Lane& ln, const Blocking& bl, float* dqkv, float* scratch, const float* dO0,
                    const float* qkv, const float* stats, int T, int H, int KV, int hd, int b, int a0, int a1) {
  const int group = H / KV;
  const float scale = score_scale(hd);
  const long long out_w = static_cast<long long>(H) * hd;
  float* dseq = dqkv + static_cast<std::size_t>(b) * T * (H + 2 * KV) * hd;
  for_each_head_batch(bl, qkv, T, H, KV, hd, b, a0, a1, [&](const HeadBatch& x, int j) {
    const int nq = x.nq, nk = x.nk, W = static_cast<int>(x.W), ow = static_cast<int>(out_w);
    const long long mat = x.mat();
    float* S = scratch;
    float* dP = scratch + static_cast<std::size_t>(bl.heads) * mat;
    const float* dO = dO0 + static_cast<std::size_t>(x.h0) * hd;
    x.scores(ln, S);
    gemm_batched(ln, false, true, nq, nk, hd, dO, ow, x.qs, x.v(), W, hd, 0.0f, dP, nk, mat, x.nb);
    const float* st = stats + (static_cast<std::size_t>(b) * H + x.h0) * T * 2;
    attention_backward_softmax_kernel<<<dim3(static_cast<unsigned>(nq), static_cast<unsigned>(x.nb)), kSoftmaxThreads,
                                        0, ln.stream>>>(S, dP, st, nq, nk, a0, T, group, scale);
    STRATUM_CUDA_LAUNCHED();
    float* dQ = dseq + a0 * x.W + static_cast<long long>(x.h0) * hd;
    gemm_batched(ln, false, false, nq, hd, nk, dP, nk, mat, x.k(), W, hd, 0.0f, dQ, W, x.qs, x.nb);
    // dK and dV: the keys before a0 continue their sums; the block's own start with head 0.
    float* dK = dseq + static_cast<long long>(H + x.kv0) * hd;
    float* dV = dseq + static_cast<long long>(H + KV + x.kv0) * hd;
    gemm_batched(ln, true, false, a0, hd, nq, dP, nk, mat, x.q(), W, x.qs, 1.0f, dK, W, hd, x.nb);
    gemm_batched(ln, true, false, a0, hd, nq, S, nk, mat, dO, ow, x.qs, 1.0f, dV, W, hd, x.nb);
    const float beta = j > 0 ? 1.0f : 0.0f;
    gemm_batched(ln, true, false, nq, hd, nq, dP + a0, nk, mat, x.q(), W, x.qs, beta, dK + a0 * x.W, W, hd, x.nb);
    gemm_batched(ln, true, false, nq, hd, nq, S + a0, nk, mat, dO, ow, x.qs, beta, dV + a0 * x.W, W, hd, x.nb);
  });
}

void backward_launch(CudaContext& ctx, float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* stats, int B, int T, int H, int KV, int hd, int r0, int n) {
  check_shape("attention_backward", B, T, H, KV, hd);
  const RowRange rr = attention_row_range("attention_backward", B, T, r0, n);
  const Blocking bl = attention_blocking(T, KV);
  const std::size_t out_w = static_cast<std::size_t>(H) * hd;
  for_each_query_block_on_lanes(ctx, rr, bl, scratch, [&](int b, int a0, int a1, std::size_t local,
                                                          const CudaContext::Lane& ln, float* lane_scratch) {
    backward_block(ln, bl, dqkv, lane_scratch, dout + local * out_w, qkv, stats, T, H, KV, hd, b, a0, a1);
  });
}

}  // namespace

std::size_t CudaOps::attention_scratch_floats(int B, int T, int H, int KV, int hd) const {
  check_shape("attention_scratch_floats", B, T, H, KV, hd);
  // S and dP of one batch of the backward, the forward's S (Note [cuda attention products]), per
  // lane (Note [attention lanes]). The workspace is sized for the longest sequence and may serve
  // shorter ones, whose blocking can need more (fewer rows lost to rounding).
  return attention_scratch_floats_for(B, T, KV, ctx_->lanes_max);
}

void CudaOps::attention_lanes_limit(int lanes) {
  ctx_->lanes_max = std::clamp(lanes, 1, CudaContext::kLanes);
}

void CudaOps::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* stats,
                                 int B, int T, int H, int KV, int hd, int r0, int n, AttentionScores scores) const {
  if (!scores.plain_within(T))
    throw BugError("[cuda] bug: a sliding window that cuts keys or soft-capping on CUDA, which context(backend) and backend_check refuse");
  backward_launch(*ctx_, dqkv, scratch, dout, qkv, stats, B, T, H, KV, hd, r0, n);
}

}  // namespace stratum
