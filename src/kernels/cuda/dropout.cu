// Dropout of the CUDA backend: the mask of Note [dropout mask] (core/dropout_mask.h, one
// definition for both backends) and the CPU's arithmetic, so the same bits.
#include "core/dropout_mask.h"
#include "kernels/cuda/cuda_context.cuh"

namespace stratum {

namespace {

__global__ void dropout_kernel(float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key,
                               std::uint32_t threshold, float scale, bool accumulate) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(M) * n) return;
  const std::size_t m = i / n, j = i % n;
  const float v = dropout_keep(key, i, threshold) ? x[m * ldx + j] * scale : 0.0f;
  float* out = y + m * ldy + j;
  *out = accumulate ? *out + v : v;
}

}  // namespace

void CudaOps::dropout(float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key, float p,
                      bool accumulate) const {
  const std::size_t total = static_cast<std::size_t>(M) * n;
  if (total == 0) return;
  dropout_kernel<<<blocks_for(total, 256), 256, 0, ctx_->stream>>>(y, ldy, x, ldx, M, n, key, dropout_threshold(p),
                                                                  dropout_keep_scale(p), accumulate);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
