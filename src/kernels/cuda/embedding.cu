// Embedding forward/backward on the GPU, the semantics of kernels/cpu/embedding.h: the forward
// is one float add per element (the same bits as the CPU's), the backward sums each output
// element over positions (or batch rows) in increasing order, as the CPU does, so it gives the
// CPU's bits too (Note [cuda determinism] in cuda_ops.h: one thread per output element, no
// atomics). Does not allocate; does not synchronise the stream.
#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

constexpr int kRowThreads = 256;  // forward: threads per (b,t) row, strided over C
constexpr int kPosThreads = 256;  // embedding_backward_positions: threads per block, one per (t,c)

// embedding_backward_block: a warp owns kLaneChannels * 32 channels and the vocabulary rows v
// with v % kSlices == its slice; it scans every position's token (staged kTile at a time in
// shared memory, 32 per step) in order and adds the rows it owns, so each output element (v, c)
// is summed by one thread over its positions in increasing order, whatever the grid.
constexpr int kBlockWarps = 8;
constexpr int kLaneChannels = 4;
constexpr int kWarpChannels = 32 * kLaneChannels;
constexpr int kSlices = 128;  // a power of two, a multiple of kBlockWarps
constexpr int kTile = 1024;   // tokens staged per pass
static_assert(kSlices % kBlockWarps == 0 && (kSlices & (kSlices - 1)) == 0, "slices: power of two, whole blocks");

__device__ __forceinline__ float widen(float w) { return w; }
__device__ __forceinline__ float widen(std::uint16_t w) {  // bf16 -> fp32 is exact
  return __uint_as_float(static_cast<unsigned>(w) << 16);
}

// out (B*T, C) = wpe[t]. Block r: row r = b*T + t.
__global__ void embedding_positions_kernel(float* out, const float* wpe, int T, int C) {
  const std::size_t r = blockIdx.x;
  const float* pe = wpe + static_cast<std::size_t>(r % T) * C;
  float* y = out + r * C;
  for (int c = threadIdx.x; c < C; c += kRowThreads) y[c] = pe[c];
}

// out[r] += wte_rows[tokens[r] - v0] for the tokens in [v0, v0 + n). Block r: row r.
template <typename E>
__global__ void embedding_block_kernel(float* out, const std::int32_t* tokens, const E* wte_rows, int v0, int n,
                                       int C) {
  const std::size_t r = blockIdx.x;
  const int row = tokens[r] - v0;
  if (row < 0 || row >= n) return;
  const E* te = wte_rows + static_cast<std::size_t>(row) * C;
  float* y = out + r * C;
  for (int c = threadIdx.x; c < C; c += kRowThreads) y[c] = widen(te[c]) + y[c];
}

// dwpe[t] += dout[b, t] for b = 0..B-1 in order. Thread e: element (t, c) = (e / C, e % C).
__global__ void embedding_backward_positions_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t e = static_cast<std::size_t>(blockIdx.x) * kPosThreads + threadIdx.x;
  const std::size_t TC = static_cast<std::size_t>(T) * C;
  if (e >= TC) return;
  float acc = dwpe[e];
  for (int b = 0; b < B; ++b) acc += dout[static_cast<std::size_t>(b) * TC + e];
  dwpe[e] = acc;
}

// dwte_rows[tokens[p] - v0] += dout[p] for the tokens in [v0, v0 + n), p = 0..BT-1 in order.
// grid (ceil(C / kWarpChannels), kSlices / kBlockWarps); block kBlockWarps warps.
__global__ void embedding_backward_block_kernel(float* dwte_rows, const float* dout, const std::int32_t* tokens,
                                                int v0, int n, int BT, int C) {
  __shared__ int tile[kTile];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slice = blockIdx.y * kBlockWarps + warp;
  const int c0 = blockIdx.x * kWarpChannels + lane;  // this lane's channels: c0, c0 + 32, ...
  for (int p0 = 0; p0 < BT; p0 += kTile) {
    const int len = min(kTile, BT - p0);
    __syncthreads();  // the previous tile is no longer read
    for (int j = threadIdx.x; j < len; j += kBlockWarps * 32) tile[j] = tokens[p0 + j] - v0;
    __syncthreads();
    // 32 tokens at a time: the lanes test one each, then the warp visits the matches in
    // increasing position (ascending bits of the ballot).
    for (int j0 = 0; j0 < len; j0 += 32) {
      const int row = j0 + lane < len ? tile[j0 + lane] : -1;
      unsigned mine = __ballot_sync(0xffffffffu, row >= 0 && row < n && (row & (kSlices - 1)) == slice);
      while (mine != 0) {
        const int bit = __ffs(static_cast<int>(mine)) - 1;
        mine &= mine - 1;
        const int j = j0 + bit;
        const float* dy = dout + static_cast<std::size_t>(p0 + j) * C;
        float* dte = dwte_rows + static_cast<std::size_t>(tile[j]) * C;
#pragma unroll
        for (int k = 0; k < kLaneChannels; ++k) {
          const int c = c0 + 32 * k;
          if (c < C) dte[c] += dy[c];
        }
      }
    }
  }
}

}  // namespace

void CudaOps::embedding_forward_positions(float* out, const float* wpe, int B, int T, int C) const {
  const long long rows = static_cast<long long>(B) * T;
  if (rows <= 0 || C <= 0) return;
  embedding_positions_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, context().stream>>>(out, wpe, T, C);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::embedding_forward_block(float* out, const std::int32_t* tokens, const float* wte_rows, int v0, int n,
                                      int B, int T, int C, float scale) const {
  if (scale != 1.0f) throw BugError("[cuda] bug: a scaled embedding (Gemma) on CUDA, which backend_check refuses");
  const long long rows = static_cast<long long>(B) * T;
  if (rows <= 0 || C <= 0 || n <= 0) return;
  embedding_block_kernel<float>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, context().stream>>>(out, tokens, wte_rows, v0, n, C);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::embedding_forward_block_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows,
                                           int v0, int n, int B, int T, int C, float scale) const {
  if (scale != 1.0f) throw BugError("[cuda] bug: a scaled embedding (Gemma) on CUDA, which backend_check refuses");
  const long long rows = static_cast<long long>(B) * T;
  if (rows <= 0 || C <= 0 || n <= 0) return;
  embedding_block_kernel<std::uint16_t>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, context().stream>>>(out, tokens, wte_rows, v0, n, C);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::embedding_backward_positions(float* dwpe, const float* dout, int B, int T, int C) const {
  const std::size_t TC = static_cast<std::size_t>(T) * C;
  if (B <= 0 || TC == 0) return;
  embedding_backward_positions_kernel<<<blocks_for(TC, kPosThreads), kPosThreads, 0, context().stream>>>(dwpe, dout,
                                                                                                      B, T, C);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::embedding_backward_block(float* dwte_rows, const float* dout, const std::int32_t* tokens, int v0, int n,
                                       int B, int T, int C, float scale) const {
  if (scale != 1.0f) throw BugError("[cuda] bug: a scaled embedding (Gemma) on CUDA, which backend_check refuses");
  const long long BT = static_cast<long long>(B) * T;
  if (BT <= 0 || C <= 0 || n <= 0) return;
  const dim3 grid(blocks_for(static_cast<std::size_t>(C), kWarpChannels), kSlices / kBlockWarps);
  embedding_backward_block_kernel<<<grid, kBlockWarps * 32, 0, context().stream>>>(dwte_rows, dout, tokens, v0, n,
                                                                                   static_cast<int>(BT), C);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
