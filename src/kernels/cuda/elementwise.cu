// add, sum_squares_many and bf16_widen of the CUDA backend. sum_squares_many has the CPU's exact order
// (Note [fixed chunks] in kernels/cpu/elementwise.h): 64 Ki-element chunks, in each chunk element i
// to lane i % 16 summed in double in order, the lanes combined by the CPU's tree, chunk sums added
// in order (on the host), so it returns the CPU's bits.
#include <algorithm>
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

// One block per chunk job: chunk `blockIdx.x` of the window, jobs[blockIdx.x] its first value
// and length (at most kChunk; a chunk is one vector's, so element i of the job is its chunk's
// element i and goes to lane i % 16 as on the CPU). Each lane's sum is one chain of dependent
// double additions, so a chunk's 16 chains set a block's time (about 72 us for a full chunk on an
// H200, ncu); the block's other threads only fetch: the chunk passes through shared memory in
// pieces of kSqPiece floats, the next piece's loads in flight (registers) while lanes 0..15 sum
// the current one in order. The chains of many chunks, of many vectors, run side by side: one
// launch for a whole gradient's chunks (Note [norm in one pass] in exec/executor.h). Before, one
// launch per vector ran its few chunks' chains one vector after another: 221 launches and 9.2 ms
// of GPT-2 small's 122 ms step on an H200.
constexpr int kSqThreads = 256;
constexpr int kSqPer = 32;
constexpr int kSqPiece = kSqThreads * kSqPer;
static_assert(kChunk % kSqPiece == 0 && kSqPiece % 16 == 0, "pieces keep element i on lane i % 16");

struct SqJob {
  const float* x;   // the chunk's first value
  std::size_t len;  // its values, 1..kChunk
};
static_assert(sizeof(SqJob) == 2 * sizeof(void*), "CudaContext::sq_jobs is sized for it (cuda_ops.cu)");

__global__ void __launch_bounds__(kSqThreads) sum_squares_kernel(double* partial, const SqJob* jobs) {
  __shared__ float tile[kSqPiece];
  const SqJob job = jobs[blockIdx.x];
  const float* const x = job.x;
  const std::size_t end = job.len;
  const int t = threadIdx.x;
  float next[kSqPer];
  auto fetch = [&](std::size_t p0) {
#pragma unroll
    for (int k = 0; k < kSqPer; ++k) {
      const std::size_t i = p0 + static_cast<std::size_t>(k) * kSqThreads + t;
      next[k] = i < end ? x[i] : 0.0f;
    }
  };
  fetch(0);
  double acc = 0.0;
  for (std::size_t p0 = 0; p0 < end; p0 += kSqPiece) {
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

void CudaOps::sum_squares_many(double* out, const float* const* xs, const std::size_t* ns, std::size_t count) const {
  // Every vector's chunks as jobs, in vector and chunk order, run in windows of kScalarSlots
  // blocks (one window for GPT-2 small's whole gradient); each vector's chunk sums are added in
  // chunk order on the host, as the CPU adds them.
  std::vector<SqJob> jobs;
  std::vector<std::size_t> owner;  // the vector of each job
  for (std::size_t v = 0; v < count; ++v) {
    out[v] = 0.0;
    for (std::size_t begin = 0; begin < ns[v]; begin += kChunk) {
      jobs.push_back({xs[v] + begin, std::min(kChunk, ns[v] - begin)});
      owner.push_back(v);
    }
  }
  std::vector<double> partial(CudaContext::kScalarSlots);
  for (std::size_t j0 = 0; j0 < jobs.size(); j0 += CudaContext::kScalarSlots) {
    const std::size_t window = std::min(CudaContext::kScalarSlots, jobs.size() - j0);
    // From pageable memory: staged before the call returns, so `jobs` may change after it.
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(ctx_->sq_jobs, jobs.data() + j0, window * sizeof(SqJob), cudaMemcpyHostToDevice,
                                       ctx_->stream));
    sum_squares_kernel<<<static_cast<unsigned>(window), kSqThreads, 0, ctx_->stream>>>(
        ctx_->scalars, static_cast<const SqJob*>(ctx_->sq_jobs));
    STRATUM_CUDA_LAUNCHED();
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(partial.data(), ctx_->scalars, window * sizeof(double), cudaMemcpyDeviceToHost,
                                       ctx_->stream));
    STRATUM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
    for (std::size_t j = 0; j < window; ++j) out[owner[j0 + j]] += partial[j];
  }
}

}  // namespace stratum
