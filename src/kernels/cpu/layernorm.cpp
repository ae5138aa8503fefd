// LayerNorm forward/backward; rows in parallel, parameter gradients by column ranges so every
// sum runs over rows in order (Note [deterministic partition] in core/thread_pool.h).
#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/simd.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void layernorm_forward_rows(float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, std::size_t r0, std::size_t r1, int C, float eps) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    const float m = simd::sum_f32(x, C) / static_cast<float>(C);
    float acc[simd::kLanes] = {};
    int i = 0;
    for (; i + simd::kLanes <= C; i += simd::kLanes)
      for (int l = 0; l < simd::kLanes; ++l) {
        float d = x[i + l] - m;
        acc[l] += d * d;
      }
    for (int l = 0; i < C; ++i, ++l) {
      float d = x[i] - m;
      acc[l] += d * d;
    }
    const float var = simd::lanes_sum(acc) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

STRATUM_SIMD_CLONES
void layernorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* w,
                             const float* mean, const float* rstd, std::size_t r0, std::size_t r1, int C) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* dy = dout + r * C;
    const float* x = inp + r * C;
    float* dx = dinp + r * C;
    const float m = mean[r], s = rstd[r];
    float acc_d[simd::kLanes] = {}, acc_dx[simd::kLanes] = {};
    int i = 0;
    for (; i + simd::kLanes <= C; i += simd::kLanes)
      for (int l = 0; l < simd::kLanes; ++l) {
        float xhat = (x[i + l] - m) * s;
        float dnorm = w[i + l] * dy[i + l];
        acc_d[l] += dnorm;
        acc_dx[l] += dnorm * xhat;
      }
    for (int l = 0; i < C; ++i, ++l) {
      float xhat = (x[i] - m) * s;
      float dnorm = w[i] * dy[i];
      acc_d[l] += dnorm;
      acc_dx[l] += dnorm * xhat;
    }
    const float dnorm_mean = simd::lanes_sum(acc_d) / static_cast<float>(C);
    const float dnorm_xhat_mean = simd::lanes_sum(acc_dx) / static_cast<float>(C);
    for (int c = 0; c < C; ++c) {
      float xhat = (x[c] - m) * s;
      float dnorm = w[c] * dy[c];
      dx[c] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
    }
  }
}

STRATUM_SIMD_CLONES
void layernorm_param_grads_cols(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                const float* rstd, int N, int C, std::size_t c0, std::size_t c1,
                                bool accumulate) {
  constexpr std::size_t kTile = 128;
  float acc_w[kTile], acc_b[kTile];
  for (std::size_t t0 = c0; t0 < c1; t0 += kTile) {
    const std::size_t width = std::min(kTile, c1 - t0);
    for (std::size_t c = 0; c < width; ++c) acc_w[c] = acc_b[c] = 0.0f;
    for (int r = 0; r < N; ++r) {
      const float* dy = dout + static_cast<std::size_t>(r) * C + t0;
      const float* x = inp + static_cast<std::size_t>(r) * C + t0;
      const float m = mean[r], s = rstd[r];
      for (std::size_t c = 0; c < width; ++c) {
        acc_w[c] += dy[c] * ((x[c] - m) * s);
        acc_b[c] += dy[c];
      }
    }
    for (std::size_t c = 0; c < width; ++c) {
      dw[t0 + c] = accumulate ? dw[t0 + c] + acc_w[c] : acc_w[c];
      db[t0 + c] = accumulate ? db[t0 + c] + acc_b[c] : acc_b[c];
    }
  }
}
}  // namespace

void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C, float eps) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    layernorm_forward_rows(out, mean, rstd, inp, w, b, r0, r1, C, eps);
  }, 8);
}

void layernorm_backward(ThreadPool& pool, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd, int N, int C,
                        bool accumulate_params) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    layernorm_backward_rows(dinp, dout, inp, w, mean, rstd, r0, r1, C);
  }, 8);
  if (dw == nullptr) return;  // frozen (LoRA's base): no parameter gradients
  pool.parallel_for(static_cast<std::size_t>(C), [&](std::size_t c0, std::size_t c1) {
    layernorm_param_grads_cols(dw, db, dout, inp, mean, rstd, N, C, c0, c1, accumulate_params);
  }, 32);
}

}  // namespace stratum
