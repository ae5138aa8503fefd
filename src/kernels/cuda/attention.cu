// Causal grouped-query attention of the CUDA backend: the training forward as matrix products
// (Note [cuda attention products] in attention_gemm.cuh) and the KV-cache variant as row kernels
// (Note [cuda attention rows] in attention_rows.cuh); the backward: attention_backward.cu.
#include "kernels/cuda/attention_gemm.cuh"

namespace stratum {

namespace {

// The forward's softmax rows (Note [cuda attention products]) for one batch: block (i, c) takes
// query row a0 + i of batch head c (query head h0 + c * group, its stats at stats + (c * group * T
// + a0 + i) * 2; null: none). S (heads, nq, nk) becomes P.
__global__ void __launch_bounds__(kSoftmaxThreads)
    attention_forward_softmax_kernel(float* S, float* stats, int nq, int nk, int a0, int T, int group, float scale) {
  __shared__ cuda_reduce::BlockScratch<kSoftmaxThreads> red;
  const int i = blockIdx.x, c = blockIdx.y, pos = a0 + i;
  float* s = S + (static_cast<std::size_t>(c) * nq + i) * nk;
  const int keys = min(pos + 1, nk);  // keys this row attends to
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < keys; j += kSoftmaxThreads) mx = fmaxf(mx, s[j] * scale);
  const float m = cuda_reduce::block_max<kSoftmaxThreads>(mx, red);
  float l = 0.0f;
  for (int j = threadIdx.x; j < keys; j += kSoftmaxThreads) {
    const float e = expf(s[j] * scale - m);
    s[j] = e;
    l += e;
  }
  const float inv = 1.0f / cuda_reduce::block_sum<kSoftmaxThreads>(l, red);
  for (int j = threadIdx.x; j < nk; j += kSoftmaxThreads) s[j] = j < keys ? s[j] * inv : 0.0f;
  if (threadIdx.x == 0 && stats != nullptr) {
    float* st = stats + (static_cast<std::size_t>(c) * group * T + pos) * 2;
    st[0] = m;
    st[1] = inv;
  }
}

// out (B,Tn,H*hd) from q (B,Tn,H*hd) and the caches (B,KV,max_T,hd); past (B) on the device. A
// sequence whose past is outside [0, max_T - Tn] gets NaN rows (the device cannot throw).
template <int HD>
__global__ void __launch_bounds__(Lanes<HD>::NT)
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
    for (int i = threadIdx.x; i < nrows * hd; i += Lanes<HD>::NT)
      y[static_cast<std::size_t>(i / hd) * row_w + i % hd] = NAN;
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

void forward_launch(CudaContext& ctx, float* out, float* stats, float* scratch, const float* qkv, int B, int T,
                    int H, int KV, int hd, int r0, int n) {
  check_shape("attention_forward", B, T, H, KV, hd);
  const RowRange rr = attention_row_range("attention_forward", B, T, r0, n);
  const Blocking bl = attention_blocking(T, KV);
  const int group = H / KV, ow = H * hd;
  const float scale = score_scale(hd);
  for_each_query_block_on_lanes(ctx, rr, bl, scratch, [&](int b, int a0, int a1, std::size_t local,
                                                          const CudaContext::Lane& ln, float* lane_scratch) {
    for_each_head_batch(bl, qkv, T, H, KV, hd, b, a0, a1, [&](const HeadBatch& x, int) {
      float* S = lane_scratch;
      x.scores(ln, S);
      float* st = stats == nullptr ? nullptr : stats + (static_cast<std::size_t>(b) * H + x.h0) * T * 2;
      attention_forward_softmax_kernel<<<dim3(static_cast<unsigned>(x.nq), static_cast<unsigned>(x.nb)),
                                         kSoftmaxThreads, 0, ln.stream>>>(S, st, x.nq, x.nk, a0, T, group, scale);
      STRATUM_CUDA_LAUNCHED();
      float* O = out + local * ow + static_cast<std::size_t>(x.h0) * hd;
      gemm_batched(ln, false, false, x.nq, hd, x.nk, S, x.nk, x.mat(), x.v(), static_cast<int>(x.W), hd, 0.0f, O, ow,
                   x.qs, x.nb);
    });
  });
}

void cached_launch(const CudaContext& ctx, float* out, const float* q, const float* kcache, const float* vcache, int B,
                   int Tn, const int* past, int max_T, int H, int KV, int hd) {
  check_shape("attention_cached", B, Tn, H, KV, hd);
  STRATUM_CHECK(Tn <= max_T, "[kernels.attention] attention_cached: ", Tn, " new positions exceed the cache's max_T ",
                max_T);
  const std::size_t blocks = static_cast<std::size_t>(B) * H * tiles_of(Tn);
  if (blocks == 0) return;
  const float scale = score_scale(hd);
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_cached_kernel<HD>, blocks, Lanes<HD>::NT, forward_smem_floats<HD>(), out, q, kcache, vcache,
           B, Tn, past, max_T, H, KV, hd, scale);
  });
}

}  // namespace

void CudaOps::attention_forward(float* out, float* stats, float* scratch, const float* qkv, int B, int T, int H,
                                int KV, int hd, int r0, int n, AttentionScores scores) const {
  if (!scores.plain_within(T))
    throw BugError("[cuda] bug: a sliding window that cuts keys or soft-capping on CUDA, which context(backend) and backend_check refuse");
  forward_launch(*ctx_, out, stats, scratch, qkv, B, T, H, KV, hd, r0, n);
}

std::size_t CudaOps::attention_cached_scratch_floats(int hd, int max_T) const {
  STRATUM_CHECK(hd > 0 && hd <= kMaxHeadDim && max_T > 0,
                "[kernels.attention] attention_cached_scratch_floats: bad shape hd ", hd, " max_T ", max_T,
                " (the CUDA backend supports head sizes up to ", kMaxHeadDim, ")");
  return 0;  // everything lives in shared memory and registers
}

void CudaOps::attention_cached(float* out, float* /*scratch*/, const float* q, const float* kcache,
                               const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV,
                               int hd, AttentionScores scores) const {
  if (!scores.plain_within(max_T))
    throw BugError("[cuda] bug: a sliding window that cuts keys or soft-capping on CUDA, which context(backend) and backend_check refuse");
  cached_launch(*ctx_, out, q, kcache, vcache, B, Tn, past, max_T, H, KV, hd);
}

}  // namespace stratum
