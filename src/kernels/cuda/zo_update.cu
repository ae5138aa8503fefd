// Zeroth-order perturbation and update of the CUDA backend: z from the device copy of the CPU's
// table (CudaContext::zo_normal_table) through the same zo_z (core/zo_noise.h), and the CPU's
// expression (kernels/cpu/zo_update.h), so the same bits.
#include "core/zo_noise.h"
#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

__global__ void zo_kernel(float* x, std::size_t n, std::uint64_t first, const float* table, ZoUpdate u) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float p = x[i];
  if (u.update) {
    const float z = zo_z(table, u.update_key, first + i);
    p = p + z * u.eps;
    p = p - u.lr * (u.g * z + u.weight_decay * p);
  }
  if (u.perturb) p = p + zo_z(table, u.perturb_key, first + i) * u.scale;
  x[i] = p;
}

}  // namespace

void CudaOps::zo_update(float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) const {
  if (n == 0) return;
  const float* table = ctx_->zo_normal_table();
  zo_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(x, n, first, table, u);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
