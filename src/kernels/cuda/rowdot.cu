// Row dot products of the CUDA backend (Note [row dot products] in kernels/cpu/rowdot.h), with
// the CPU's exact arithmetic, so decoding gives the CPU's bits: rowdot_nt's dot puts element k in
// lane k % 16 of a half warp, each lane summing in order, and the lanes are added by the CPU's
// tree (8, 4, 2, 1 apart; simd::lanes_sum); rowdot_kn gives each output to one thread summing over
// k in order. Every output stands alone, so the bits do not depend on M or on the launch.
#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

__device__ __forceinline__ float load_w(const float* w, std::size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const std::uint16_t* w, std::size_t i) {
  return __uint_as_float(static_cast<unsigned>(w[i]) << 16);
}

template <typename W>
__global__ void nt_kernel(float* y, int ldy, const float* x, int ldx, const W* w, const float* bias, int M, int N,
                          int K) {
  const std::size_t half = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 16;
  const int lane = threadIdx.x % 16;
  const bool live = half < static_cast<std::size_t>(M) * N;
  const std::size_t m = live ? half / N : 0, n = live ? half % N : 0;
  float acc = 0.0f;
  if (live) {
    const float* xr = x + m * ldx;
    const std::size_t wr = n * static_cast<std::size_t>(K);
    for (int k = lane; k < K; k += 16) acc += xr[k] * load_w(w, wr + k);
  }
  for (int width = 8; width >= 1; width /= 2) acc += __shfl_down_sync(0xffffffffu, acc, width, 16);
  if (live && lane == 0) y[m * ldy + n] = bias != nullptr ? acc + bias[n] : acc;
}

template <typename W>
__global__ void kn_kernel(float* y, const float* x, const W* w, const float* bias, int M, int K, int N) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(M) * N) return;
  const std::size_t m = i / N, n = i % N;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += x[m * K + k] * load_w(w, static_cast<std::size_t>(k) * N + n);
  y[i] = bias != nullptr ? acc + bias[n] : acc;
}

template <typename W>
void nt_launch(cudaStream_t stream, float* y, int ldy, const float* x, int ldx, const W* w, const float* bias, int M,
               int N, int K) {
  const std::size_t threads = static_cast<std::size_t>(M) * N * 16;
  if (threads == 0) return;
  nt_kernel<<<blocks_for(threads, 256), 256, 0, stream>>>(y, ldy, x, ldx, w, bias, M, N, K);
  STRATUM_CUDA_LAUNCHED();
}

template <typename W>
void kn_launch(cudaStream_t stream, float* y, const float* x, const W* w, const float* bias, int M, int K, int N) {
  const std::size_t n = static_cast<std::size_t>(M) * N;
  if (n == 0) return;
  kn_kernel<<<blocks_for(n, 128), 128, 0, stream>>>(y, x, w, bias, M, K, N);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace

void CudaOps::rowdot_nt(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M, int N,
                        int K) const {
  nt_launch(ctx_->stream, y, ldy, x, ldx, w, bias, M, N, K);
}

void CudaOps::rowdot_nt_bf16(float* y, int ldy, const float* x, int ldx, const std::uint16_t* w, const float* bias,
                             int M, int N, int K) const {
  nt_launch(ctx_->stream, y, ldy, x, ldx, w, bias, M, N, K);
}

void CudaOps::rowdot_kn(float* y, const float* x, const float* w, const float* bias, int M, int K, int N) const {
  kn_launch(ctx_->stream, y, x, w, bias, M, K, N);
}

void CudaOps::rowdot_kn_bf16(float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                             int N) const {
  kn_launch(ctx_->stream, y, x, w, bias, M, K, N);
}

}  // namespace stratum
