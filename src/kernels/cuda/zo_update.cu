// Zeroth-order perturbation and update of the CUDA backend: z from the device copy of the CPU's
// table (CudaContext::zo_normal_table) and the CPU's element expression (ops/elementwise_math.h), so
// the same bits.
#include "core/zo_noise.h"
#include "kernels/cuda/cuda_context.cuh"
#include "ops/elementwise_math.h"

namespace stratum {

namespace {

__global__ void zo_kernel(float* x, std::size_t n, std::uint64_t first, const float* table, ZoUpdate u) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  x[i] = zo_element(x[i], table, first + i, u);
}

}  // namespace

void CudaOps::zo_update(float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) const {
  if (n == 0) return;
  const float* table = ctx_->zo_normal_table();
  zo_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(x, n, first, table, u);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
