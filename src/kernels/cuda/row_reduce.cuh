// Fixed-order reductions shared by the row kernels of this folder (layernorm, rmsnorm,
// softmax_xent), Note [cuda determinism] in cuda_ops.h; no atomics. Included by .cu files only.
//  - Within a row (block_sum, block_max): each thread folds its own elements in increasing order,
//    then the 32 lanes of each warp combine by a butterfly (xor 16, 8, 4, 2, 1) and the warps'
//    partials by the same butterfly. The tree's shape depends only on kThreads, a compile-time
//    constant of each kernel, never on the data size or the grid.
//  - Down the columns (norm_param_grads_kernel): each column is summed by one thread over rows
//    0..N-1 in order, the CPU's order, with the rows staged through shared memory by the whole
//    block so that many loads are in flight.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

namespace stratum::cuda_reduce {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly over the warp: every lane ends with the same bits (a + b == b + a bitwise, and each
// level combines the same two operands on both partner lanes).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Shared memory one block reduction needs: a float per warp per reduced value.
template <int kThreads>
struct BlockScratch {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static constexpr int kWarps = kThreads / 32;
  float part[2][kWarps];
};

// Sum of v over the block's kThreads threads, returned to every thread (all with the same bits).
// Every thread of the block must call it; it ends with a barrier so `s` can be reused at once.
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, BlockScratch<kThreads>& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) s.part[0][warp] = v;
  __syncthreads();
  float w = lane < BlockScratch<kThreads>::kWarps ? s.part[0][lane] : 0.0f;
  w = warp_sum(w);
  __syncthreads();
  return w;
}

// Two sums at once (one pair of barriers): a and b become their block totals.
template <int kThreads>
__device__ __forceinline__ void block_sum2(float& a, float& b, BlockScratch<kThreads>& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {
    s.part[0][warp] = a;
    s.part[1][warp] = b;
  }
  __syncthreads();
  const bool live = lane < BlockScratch<kThreads>::kWarps;
  a = warp_sum(live ? s.part[0][lane] : 0.0f);
  b = warp_sum(live ? s.part[1][lane] : 0.0f);
  __syncthreads();
}

// Maximum of v over the block (exact, so order-free), returned to every thread.
template <int kThreads>
__device__ __forceinline__ float block_max(float v, BlockScratch<kThreads>& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  if (lane == 0) s.part[0][warp] = v;
  __syncthreads();
  float w = lane < BlockScratch<kThreads>::kWarps ? s.part[0][lane] : -INFINITY;
  w = warp_max(w);
  __syncthreads();
  return w;
}

// The parameter gradients of a norm: dw (C) = (or += when accumulate) sum_r dout[r,c] * xhat[r,c],
// and with kBias db (C) = (or +=) sum_r dout[r,c], where xhat = (inp - mean[r]) * rstd[r]
// (kCentered, layernorm) or inp * rstd[r] (rmsnorm; mean unused). Block b owns columns
// [b * kGradCols, (b + 1) * kGradCols): all its threads load kGradRows rows of them (the next
// step's loads in flight while this step is summed) into shared memory, and the first kGradCols
// threads add them, row by row in order, to their column's sums: the same additions as a
// sequential loop over rows, whatever the grid.
constexpr int kGradCols = 8;       // columns per block (32 bytes of each row: one whole sector)
constexpr int kGradRows = 256;     // rows staged per step
constexpr int kGradThreads = 256;  // threads per block
constexpr int kGradRowsPerPass = kGradThreads / kGradCols;
constexpr int kGradLoads = kGradRows / kGradRowsPerPass;  // rows each thread loads per step
static_assert(kGradThreads % kGradCols == 0 && kGradRows % kGradRowsPerPass == 0, "whole passes");

inline unsigned norm_param_grads_blocks(int C) { return static_cast<unsigned>((C + kGradCols - 1) / kGradCols); }

template <bool kCentered>
__device__ __forceinline__ void norm_param_grads_load(float (&dy)[kGradLoads], float (&xhat)[kGradLoads],
                                                      const float* dout, const float* inp, const float* mean,
                                                      const float* rstd, int r0, int N, int C, int c) {
  const int row_in_pass = threadIdx.x / kGradCols;
#pragma unroll
  for (int k = 0; k < kGradLoads; ++k) {
    const int r = r0 + row_in_pass + k * kGradRowsPerPass;
    dy[k] = 0.0f;
    xhat[k] = 0.0f;
    if (r < N && c < C) {
      const std::size_t i = static_cast<std::size_t>(r) * C + c;
      dy[k] = dout[i];
      xhat[k] = kCentered ? (inp[i] - mean[r]) * rstd[r] : inp[i] * rstd[r];
    }
  }
}

template <bool kCentered, bool kBias>
__global__ void __launch_bounds__(kGradThreads)
    norm_param_grads_kernel(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                            const float* rstd, int N, int C, bool accumulate) {
  __shared__ float s_dy[2][kGradRows][kGradCols];
  __shared__ float s_xhat[2][kGradRows][kGradCols];
  const int col = threadIdx.x % kGradCols;
  const int row_in_pass = threadIdx.x / kGradCols;
  const int c = blockIdx.x * kGradCols + col;
  float dy[kGradLoads], xhat[kGradLoads];
  norm_param_grads_load<kCentered>(dy, xhat, dout, inp, mean, rstd, 0, N, C, c);
  float acc_w = 0.0f, acc_b = 0.0f;
  int buf = 0;
  for (int r0 = 0; r0 < N; r0 += kGradRows) {
#pragma unroll
    for (int k = 0; k < kGradLoads; ++k) {
      const int rr = row_in_pass + k * kGradRowsPerPass;
      s_dy[buf][rr][col] = dy[k];
      s_xhat[buf][rr][col] = xhat[k];
    }
    if (r0 + kGradRows < N) norm_param_grads_load<kCentered>(dy, xhat, dout, inp, mean, rstd, r0 + kGradRows, N, C, c);
    // One barrier per step suffices: buffer `buf` is rewritten two steps later, and the summing
    // threads finish reading it before they reach the next step's barrier.
    __syncthreads();
    if (threadIdx.x < kGradCols) {
      const int rows = min(kGradRows, N - r0);
      for (int rr = 0; rr < rows; ++rr) {
        const float d = s_dy[buf][rr][col];
        acc_w += d * s_xhat[buf][rr][col];
        if (kBias) acc_b += d;
      }
    }
    buf ^= 1;
  }
  if (threadIdx.x < kGradCols && c < C) {
    dw[c] = accumulate ? dw[c] + acc_w : acc_w;
    if (kBias) db[c] = accumulate ? db[c] + acc_b : acc_b;
  }
}

// dst (N) (= or += when accumulate) the column sums of src (M, N): each column summed by one
// thread over rows 0..M-1 in order from 0 (kernels/cpu/matmul.h column_sum, the bias gradient),
// its rows staged through shared memory by the whole block as in norm_param_grads_kernel: the
// CPU's bits. Launch norm_param_grads_blocks(N) blocks of kGradThreads.
static __global__ void __launch_bounds__(kGradThreads)
    column_sums_kernel(float* dst, const float* src, int M, int N, bool accumulate) {
  __shared__ float s_rows[2][kGradRows][kGradCols];
  const int col = threadIdx.x % kGradCols;
  const int row_in_pass = threadIdx.x / kGradCols;
  const int c = blockIdx.x * kGradCols + col;
  float v[kGradLoads];
  auto load = [&](int r0) {
#pragma unroll
    for (int k = 0; k < kGradLoads; ++k) {
      const int r = r0 + row_in_pass + k * kGradRowsPerPass;
      v[k] = r < M && c < N ? src[static_cast<std::size_t>(r) * N + c] : 0.0f;
    }
  };
  load(0);
  float acc = 0.0f;
  int buf = 0;
  for (int r0 = 0; r0 < M; r0 += kGradRows) {
#pragma unroll
    for (int k = 0; k < kGradLoads; ++k) s_rows[buf][row_in_pass + k * kGradRowsPerPass][col] = v[k];
    if (r0 + kGradRows < M) load(r0 + kGradRows);
    __syncthreads();  // one per step: see norm_param_grads_kernel
    if (threadIdx.x < kGradCols) {
      const int rows = min(kGradRows, M - r0);
      for (int rr = 0; rr < rows; ++rr) acc += s_rows[buf][rr][col];
    }
    buf ^= 1;
  }
  if (threadIdx.x < kGradCols && c < N) dst[c] = accumulate ? dst[c] + acc : acc;
}

}  // namespace stratum::cuda_reduce
