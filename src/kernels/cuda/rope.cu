// Rotary position embedding of the CUDA backend: the CPU's arithmetic (kernels/cpu/rope.h) on the
// device copy of the RopeTable (CudaContext::rope_copy), so the same bits. pos0 is device memory;
// positions are the caller's to keep below the table's max_pos (the model checks the context
// length), and a position outside the table leaves its row unrotated rather than read outside it.
#include "kernels/cuda/cuda_context.cuh"
#include "ops/elementwise_math.h"
#include "ops/rope_table.h"

namespace stratum {

namespace {

// One thread per (row, head, i < hd/2).
__global__ void rope_kernel(float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                            const float* cos_table, const float* sin_table, int max_pos, bool transpose) {
  const int half = hd / 2;
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t total = static_cast<std::size_t>(B) * T * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int h = static_cast<int>((idx / half) % heads);
  const std::size_t r = idx / (static_cast<std::size_t>(half) * heads);
  const std::size_t b = r / T, t = r % T;
  const int pos = (pos0 != nullptr ? pos0[b] : 0) + static_cast<int>(t);
  if (pos < 0 || pos >= max_pos) return;
  const float c = cos_table[static_cast<std::size_t>(pos) * half + i];
  const float s = sin_table[static_cast<std::size_t>(pos) * half + i];
  float* lo = x + r * row_stride + static_cast<std::size_t>(h) * hd;
  rope_rotate(lo[i], lo[i + half], c, s, transpose);
}

void rope_apply(CudaContext& ctx, float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                const RopeTable& table, bool transpose) {
  rope_check_shape(table, B, T, heads, hd, row_stride);
  const std::size_t total = static_cast<std::size_t>(B) * T * heads * (hd / 2);
  if (total == 0) return;
  const CudaContext::RopeCopy& c = ctx.rope_copy(table);
  rope_kernel<<<blocks_for(total, 256), 256, 0, ctx.stream>>>(x, B, T, heads, hd, row_stride, pos0, c.cos, c.sin,
                                                              c.max_pos, transpose);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace

void CudaOps::rope_forward(float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                           const RopeTable& table) const {
  rope_apply(*ctx_, x, B, T, heads, hd, row_stride, pos0, table, false);
}

void CudaOps::rope_backward(float* dx, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                            const RopeTable& table) const {
  rope_apply(*ctx_, dx, B, T, heads, hd, row_stride, pos0, table, true);
}

}  // namespace stratum
