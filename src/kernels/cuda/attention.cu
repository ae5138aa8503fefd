// Causal grouped-query attention of the CUDA backend, the forward and the KV-cache variant (the
// row arithmetic, tiles and launches: attention_rows.cuh; the backward: attention_backward.cu).
#include "kernels/cuda/attention_rows.cuh"

namespace stratum {

namespace {

// The outputs (out: the range's rows, H*hd each) and stats (B,H,T,2) of query rows rr from qkv
// (B,T,(H+2KV)*hd). Block: kRows query rows of one (sequence, head), the last row tiles first (they
// have the most keys; RowRange).
template <int HD>
__global__ void __launch_bounds__(Lanes<HD>::NT)
    attention_forward_kernel(float* out, float* stats, const float* qkv, RowRange rr, int H, int KV, int hd,
                             float scale) {
  extern __shared__ float4 attention_smem[];
  const QueryBlock qb = query_block(rr, H);
  if (qb.tile < 0) return;  // a partial sequence's spare blocks
  const int T = rr.T, b = qb.b, h = qb.h, tile = qb.tile;
  const SeqRange sr = qb.sr;
  const int kvh = h / (H / KV);
  const std::size_t W = static_cast<std::size_t>(H + 2 * KV) * hd, out_w = static_cast<std::size_t>(H) * hd;
  const int t0 = sr.q0 + tile * kRows;
  const float* base = qkv + static_cast<std::size_t>(b) * T * W;
  RowBlock rb;
  rb.q = base + t0 * W + static_cast<std::size_t>(h) * hd;
  rb.q_stride = W;
  rb.k = base + static_cast<std::size_t>(H + kvh) * hd;
  rb.v = base + static_cast<std::size_t>(H + KV + kvh) * hd;
  rb.kv_stride = W;
  rb.nkeys = sr.q1;
  rb.pos0 = t0;
  rb.nrows = min(kRows, sr.q1 - t0);
  rb.out = out + (sr.local0 + (t0 - sr.q0)) * out_w + static_cast<std::size_t>(h) * hd;
  rb.out_stride = out_w;
  rb.stats = stats == nullptr ? nullptr : stats + ((static_cast<std::size_t>(b) * H + h) * T + t0) * 2;
  forward_rows<HD>(reinterpret_cast<float*>(attention_smem), rb, hd, scale);
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

void forward_launch(const CudaContext& ctx, float* out, float* stats, const float* qkv, int B, int T, int H, int KV,
                    int hd, int r0, int n) {
  check_shape("attention_forward", B, T, H, KV, hd);
  const RowRange rr = attention_row_range("attention_forward", B, T, r0, n);
  const std::size_t blocks = static_cast<std::size_t>(rr.seqs) * H * tiles_of(range_widest(rr, false));
  if (blocks == 0) return;
  const float scale = score_scale(hd);
  dispatch_head_dim(hd, [&]<int HD>() {
    launch(ctx, attention_forward_kernel<HD>, blocks, Lanes<HD>::NT, forward_smem_floats<HD>(), out, stats, qkv, rr, H,
           KV, hd, scale);
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

void CudaOps::attention_forward(float* out, float* stats, float* /*scratch*/, const float* qkv, int B, int T, int H,
                                int KV, int hd, int r0, int n) const {
  forward_launch(*ctx_, out, stats, qkv, B, T, H, KV, hd, r0, n);
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
