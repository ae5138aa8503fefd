// RMSNorm forward/backward; rows in parallel, the weight gradient by column ranges so every sum
// runs over rows in order (Note [deterministic partition] in core/thread_pool.h), mirroring
// layernorm.cpp.
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "core/simd.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void rmsnorm_forward_rows(float* out, float* rstd, const float* inp, const float* w, std::size_t r0, std::size_t r1,
                          int C, float eps) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    const float ms = simd::dot_f32(x, x, C) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(ms + eps);
    for (int c = 0; c < C; ++c) y[c] = w[c] * (x[c] * s);
    rstd[r] = s;
  }
}

// y = w * x * s with s = (mean(x^2) + eps)^(-1/2): ds/dx_j = -s^3 x_j / C, so with
// xhat = x * s and g = w * dy:  dx = s * (g - xhat * mean(g * xhat)).
STRATUM_SIMD_CLONES
void rmsnorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                           std::size_t r0, std::size_t r1, int C) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* dy = dout + r * C;
    const float* x = inp + r * C;
    float* dx = dinp + r * C;
    const float s = rstd[r];
    float acc[simd::kLanes] = {};
    int i = 0;
    for (; i + simd::kLanes <= C; i += simd::kLanes)
      for (int l = 0; l < simd::kLanes; ++l) acc[l] += (w[i + l] * dy[i + l]) * (x[i + l] * s);
    for (int l = 0; i < C; ++i, ++l) acc[l] += (w[i] * dy[i]) * (x[i] * s);
    const float g_xhat_mean = simd::lanes_sum(acc) / static_cast<float>(C);
    for (int c = 0; c < C; ++c) dx[c] += s * (w[c] * dy[c] - (x[c] * s) * g_xhat_mean);
  }
}

STRATUM_SIMD_CLONES
void rmsnorm_weight_grad_cols(float* dw, const float* dout, const float* inp, const float* rstd, int N, int C,
                              std::size_t c0, std::size_t c1, bool accumulate) {
  constexpr std::size_t kTile = 128;
  float acc[kTile];
  for (std::size_t t0 = c0; t0 < c1; t0 += kTile) {
    const std::size_t width = std::min(kTile, c1 - t0);
    for (std::size_t c = 0; c < width; ++c) acc[c] = 0.0f;
    for (int r = 0; r < N; ++r) {
      const float* dy = dout + static_cast<std::size_t>(r) * C + t0;
      const float* x = inp + static_cast<std::size_t>(r) * C + t0;
      const float s = rstd[r];
      for (std::size_t c = 0; c < width; ++c) acc[c] += dy[c] * (x[c] * s);
    }
    for (std::size_t c = 0; c < width; ++c) dw[t0 + c] = accumulate ? dw[t0 + c] + acc[c] : acc[c];
  }
}
}  // namespace

void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    rmsnorm_forward_rows(out, rstd, inp, w, r0, r1, C, eps);
  }, 8);
}

void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, bool accumulate_params) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    rmsnorm_backward_rows(dinp, dout, inp, w, rstd, r0, r1, C);
  }, 8);
  if (dw == nullptr) return;  // frozen (LoRA's base): no weight gradient
  pool.parallel_for(static_cast<std::size_t>(C), [&](std::size_t c0, std::size_t c1) {
    rmsnorm_weight_grad_cols(dw, dout, inp, rstd, N, C, c0, c1, accumulate_params);
  }, 32);
}

}  // namespace stratum
