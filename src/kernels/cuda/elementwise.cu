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

// One half warp per chunk: chunk c0 + (global half index).
__global__ void sum_squares_kernel(double* partial, const float* x, std::size_t n, std::size_t c0, std::size_t chunks) {
  const std::size_t half = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 16;
  const int lane = threadIdx.x % 16;
  const bool live = half < chunks;
  double acc = 0.0;
  if (live) {
    const std::size_t begin = (c0 + half) * kChunk;
    const std::size_t end = begin + kChunk < n ? begin + kChunk : n;
    for (std::size_t i = begin + lane; i < end; i += 16) {
      const double v = x[i];
      acc += v * v;
    }
  }
  for (int width = 8; width >= 1; width /= 2) acc += __shfl_down_sync(0xffffffffu, acc, width, 16);
  if (live && lane == 0) partial[half] = acc;
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
    sum_squares_kernel<<<blocks_for(count * 16, 256), 256, 0, ctx_->stream>>>(ctx_->scalars, x, n, c0, count);
    STRATUM_CUDA_LAUNCHED();
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(partial.data(), ctx_->scalars, count * sizeof(double), cudaMemcpyDeviceToHost,
                                       ctx_->stream));
    STRATUM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
    for (std::size_t c = 0; c < count; ++c) total += partial[c];
  }
  return total;
}

}  // namespace stratum
