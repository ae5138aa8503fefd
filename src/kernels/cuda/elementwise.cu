// add, sum_squares and bf16_widen of the CUDA backend. sum_squares has the CPU's exact order
// (Note [fixed chunks] in kernels/cpu/elementwise.h): 64 Ki-element chunks, in each chunk element i
// to lane i % 16 summed in double in order, the lanes combined by the CPU's tree, chunk sums added
// in order (on the host), so it returns the CPU's bits.
#include <vector>

#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

constexpr std::size_t kChunk = 65536;

__global__ void add_kernel(float* out, const float* a, const float* b, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void widen_flat_kernel(float* out, const std::uint16_t* in, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(static_cast<unsigned>(in[i]) << 16);
}

// One block per chunk (chunk c0 + blockIdx.x). Each lane's sum is one chain of dependent double
// additions, so the chunk's 16 chains set the kernel's time; the block's other threads only fetch:
// the chunk passes through shared memory in pieces of kSqPiece floats, the next piece's loads in
// flight (registers) while lanes 0..15 sum the current one in order. Before, one half warp per chunk
// read global memory itself: a 2.4M-value tensor ran on 3 SMs, latency-bound, 240 us a call and
// 53 ms of GPT-2 small's 210 ms step on an H200 (ncu).
constexpr int kSqThreads = 256;
constexpr int kSqPer = 32;
constexpr int kSqPiece = kSqThreads * kSqPer;
static_assert(kChunk % kSqPiece == 0 && kSqPiece % 16 == 0, "pieces keep element i on lane i % 16");

__global__ void __launch_bounds__(kSqThreads) sum_squares_kernel(double* partial, const float* x, std::size_t n,
                                                                   std::size_t c0) {
  __shared__ float tile[kSqPiece];
  const std::size_t begin = (c0 + blockIdx.x) * kChunk;
  const std::size_t end = begin + kChunk < n ? begin + kChunk : n;
  const int t = threadIdx.x;
  float next[kSqPer];
  auto fetch = [&](std::size_t p0) {
#pragma unroll
    for (int k = 0; k < kSqPer; ++k) {
      const std::size_t i = p0 + static_cast<std::size_t>(k) * kSqThreads + t;
      next[k] = i < end ? x[i] : 0.0f;
    }
  };
  fetch(begin);
  double acc = 0.0;
  for (std::size_t p0 = begin; p0 < end; p0 += kSqPiece) {
    __syncthreads();  // the lanes are done with the previous piece
#pragma unroll
    for (int k = 0; k < kSqPer; ++k) tile[k * kSqThreads + t] = next[k];
    __syncthreads();
    if (p0 + kSqPiece < end) fetch(p0 + kSqPiece);
    if (t < 16) {
      const int len = end - p0 < static_cast<std::size_t>(kSqPiece) ? static_cast<int>(end - p0) : kSqPiece;
#pragma unroll 8
      for (int i = t; i < len; i += 16) {
        const double v = tile[i];
        acc += v * v;
      }
    }
  }
  if (t < 32) {  // the CPU's tree over the 16 lanes (threads 16..31 carry zeros)
    for (int width = 8; width >= 1; width /= 2) acc += __shfl_down_sync(0xffffffffu, acc, width, 16);
    if (t == 0) partial[blockIdx.x] = acc;
  }
}

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

}  // namespace

void CudaOps::fill(float* x, float value, std::size_t n) const {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(x, value, n);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::copy(float* dst, const float* src, std::size_t n) const {
  if (n == 0) return;
  STRATUM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx_->stream));
}

void CudaOps::add(float* out, const float* a, const float* b, std::size_t n) const {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(out, a, b, n);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::bf16_widen(float* out, const std::uint16_t* in, std::size_t n) const {
  if (n == 0) return;
  widen_flat_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(out, in, n);
  STRATUM_CUDA_LAUNCHED();
}

double CudaOps::sum_squares(const float* x, std::size_t n) const {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(CudaContext::kScalarSlots);
  double total = 0.0;
  for (std::size_t c0 = 0; c0 < chunks; c0 += CudaContext::kScalarSlots) {
    const std::size_t count = std::min(CudaContext::kScalarSlots, chunks - c0);
    sum_squares_kernel<<<static_cast<unsigned>(count), kSqThreads, 0, ctx_->stream>>>(ctx_->scalars, x, n, c0);
    STRATUM_CUDA_LAUNCHED();
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(partial.data(), ctx_->scalars, count * sizeof(double), cudaMemcpyDeviceToHost,
                                       ctx_->stream));
    STRATUM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
    for (std::size_t c = 0; c < count; ++c) total += partial[c];
  }
  return total;
}

}  // namespace stratum
