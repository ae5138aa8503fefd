// RMSNorm forward/backward; rows in parallel, the weight gradient by column ranges so every sum
// runs over rows in order (Note [deterministic partition] in core/thread_pool.h), mirroring
// layernorm.cpp. The per-head form (Note [qk norm] in model/llama_block.h) is the same code over
// rows that are heads of strided token rows (Rows).
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "core/simd.h"

namespace stratum {

namespace {
// Where row i of a norm's input starts: N rows of C (per = 1, ld = C), or n token rows of `per`
// heads of C floats each, token rows ld floats apart (row i = token i / per, head i % per).
struct Rows {
  int per = 1;
  std::size_t ld = 0;
  int C = 0;
  std::size_t at(std::size_t i) const { return per == 1 ? i * ld : (i / per) * ld + (i % per) * static_cast<std::size_t>(C); }
};

STRATUM_SIMD_CLONES
void rmsnorm_forward_rows(float* out, float* rstd, const float* inp, const float* w, std::size_t r0, std::size_t r1,
                          Rows rows, float eps) {
  const int C = rows.C;
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = inp + rows.at(r);
    float* y = out + rows.at(r);
    const float ms = simd::dot_f32(x, x, C) / static_cast<float>(C);
    const float s = 1.0f / std::sqrt(ms + eps);
    for (int c = 0; c < C; ++c) y[c] = w[c] * (x[c] * s);  // y may be x: each element read before written
    rstd[r] = s;
  }
}

// y = w * x * s with s = (mean(x^2) + eps)^(-1/2): ds/dx_j = -s^3 x_j / C, so with
// xhat = x * s and g = w * dy:  dx = s * (g - xhat * mean(g * xhat)); added to dx, or written
// over it (overwrite: dx may then be dy, each element read before it is written).
STRATUM_SIMD_CLONES
void rmsnorm_backward_rows(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                           std::size_t r0, std::size_t r1, Rows rows, bool overwrite) {
  const int C = rows.C;
  for (std::size_t r = r0; r < r1; ++r) {
    const float* dy = dout + rows.at(r);
    const float* x = inp + rows.at(r);
    float* dx = dinp + rows.at(r);
    const float s = rstd[r];
    float acc[simd::kLanes] = {};
    int i = 0;
    for (; i + simd::kLanes <= C; i += simd::kLanes)
      for (int l = 0; l < simd::kLanes; ++l) acc[l] += (w[i + l] * dy[i + l]) * (x[i + l] * s);
    for (int l = 0; i < C; ++i, ++l) acc[l] += (w[i] * dy[i]) * (x[i] * s);
    const float g_xhat_mean = simd::lanes_sum(acc) / static_cast<float>(C);
    if (overwrite) {
      for (int c = 0; c < C; ++c) dx[c] = s * (w[c] * dy[c] - (x[c] * s) * g_xhat_mean);
    } else {
      for (int c = 0; c < C; ++c) dx[c] += s * (w[c] * dy[c] - (x[c] * s) * g_xhat_mean);
    }
  }
}

STRATUM_SIMD_CLONES
void rmsnorm_weight_grad_cols(float* dw, const float* dout, const float* inp, const float* rstd, std::size_t N, Rows rows,
                              std::size_t c0, std::size_t c1, bool accumulate) {
  constexpr std::size_t kTile = 128;
  float acc[kTile];
  for (std::size_t t0 = c0; t0 < c1; t0 += kTile) {
    const std::size_t width = std::min(kTile, c1 - t0);
    for (std::size_t c = 0; c < width; ++c) acc[c] = 0.0f;
    for (std::size_t r = 0; r < N; ++r) {
      const float* dy = dout + rows.at(r) + t0;
      const float* x = inp + rows.at(r) + t0;
      const float s = rstd[r];
      for (std::size_t c = 0; c < width; ++c) acc[c] += dy[c] * (x[c] * s);
    }
    for (std::size_t c = 0; c < width; ++c) dw[t0 + c] = accumulate ? dw[t0 + c] + acc[c] : acc[c];
  }
}

void weight_grad(ThreadPool& pool, float* dw, const float* dout, const float* inp, const float* rstd, std::size_t N,
                 Rows rows, bool accumulate_params) {
  if (dw == nullptr) return;  // frozen (LoRA's base): no weight gradient
  pool.parallel_for(static_cast<std::size_t>(rows.C), [&](std::size_t c0, std::size_t c1) {
    rmsnorm_weight_grad_cols(dw, dout, inp, rstd, N, rows, c0, c1, accumulate_params);
  }, 32);
}
}  // namespace

void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps) {
  const Rows rows{1, static_cast<std::size_t>(C), C};
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    rmsnorm_forward_rows(out, rstd, inp, w, r0, r1, rows, eps);
  }, 8);
}

void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, bool accumulate_params) {
  const Rows rows{1, static_cast<std::size_t>(C), C};
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    rmsnorm_backward_rows(dinp, dout, inp, w, rstd, r0, r1, rows, false);
  }, 8);
  weight_grad(pool, dw, dout, inp, rstd, static_cast<std::size_t>(N), rows, accumulate_params);
}

void rmsnorm_heads_forward(ThreadPool& pool, float* x, int ld, float* rstd, const float* w, int n, int heads, int hd,
                           float eps) {
  const Rows rows{heads, static_cast<std::size_t>(ld), hd};
  pool.parallel_for(static_cast<std::size_t>(n) * heads, [&](std::size_t r0, std::size_t r1) {
    rmsnorm_forward_rows(x, rstd, x, w, r0, r1, rows, eps);
  }, 32);
}

void rmsnorm_heads_backward(ThreadPool& pool, float* d, const float* x, int ld, float* dw, const float* w,
                            const float* rstd, int n, int heads, int hd, bool accumulate_params) {
  const Rows rows{heads, static_cast<std::size_t>(ld), hd};
  const std::size_t N = static_cast<std::size_t>(n) * heads;
  weight_grad(pool, dw, d, x, rstd, N, rows, accumulate_params);  // before d is overwritten
  pool.parallel_for(N, [&](std::size_t r0, std::size_t r1) {
    rmsnorm_backward_rows(d, d, x, w, rstd, r0, r1, rows, true);
  }, 32);
}

}  // namespace stratum
