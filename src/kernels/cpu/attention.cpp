// Causal attention forward/backward. Work item = one (batch, head) pair; all sums inside it run
// in a fixed order, so results do not depend on the thread count (Note [deterministic partition]).
#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"

namespace stratum {

namespace {
// dst (hd, T) = the head's slice of rows [0, T) of src, where row t2 starts at base + t2 * C3.
void transpose_head(float* dst, const float* base, std::size_t C3, int T, int hd) {
  for (int t2 = 0; t2 < T; ++t2)
    for (int i = 0; i < hd; ++i) dst[static_cast<std::size_t>(i) * T + t2] = base[t2 * C3 + i];
}

// row[t2] = sum_i x[i] * xt[i][t2] for t2 in [0, n), summed over i in order (vectorised over t2).
STRATUM_SIMD_CLONES
void row_times_transposed(float* row, const float* x, const float* xt, int n, int hd, int T) {
  for (int t2 = 0; t2 < n; ++t2) row[t2] = 0.0f;
  for (int i = 0; i < hd; ++i) {
    const float xi = x[i];
    const float* col = xt + static_cast<std::size_t>(i) * T;
    for (int t2 = 0; t2 < n; ++t2) row[t2] += xi * col[t2];
  }
}

STRATUM_SIMD_CLONES
void attention_forward_pairs(float* out, float* att, float* scratch, const float* qkv, std::size_t p0,
                             std::size_t p1, int T, int C, int H) {
  const int hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t b = p / H, h = p % H;
    const float* base = qkv + b * T * C3;
    float* kt = scratch + p * static_cast<std::size_t>(hd) * T;
    transpose_head(kt, base + C + h * hd, C3, T, hd);
    for (int t = 0; t < T; ++t) {
      const float* q = base + t * C3 + h * hd;
      float* row = att + (p * T + t) * static_cast<std::size_t>(T);
      row_times_transposed(row, q, kt, t + 1, hd, T);
      for (int t2 = 0; t2 <= t; ++t2) row[t2] *= scale;
      const float mx = simd::max_f32(row, t + 1);
      for (int t2 = 0; t2 <= t; ++t2) row[t2] = simd::exp_f32(row[t2] - mx);
      const float inv = 1.0f / simd::sum_f32(row, t + 1);
      for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
      for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
      float* y = out + (b * T + t) * static_cast<std::size_t>(C) + h * hd;
      for (int i = 0; i < hd; ++i) y[i] = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* v = base + t2 * C3 + 2 * C + h * hd;
        const float a = row[t2];
        for (int i = 0; i < hd; ++i) y[i] += a * v[i];
      }
    }
  }
}

STRATUM_SIMD_CLONES
void attention_backward_pairs(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                              std::size_t p0, std::size_t p1, int B, int T, int C, int H) {
  const int hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  float* rows = scratch + static_cast<std::size_t>(B) * T * C;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t b = p / H, h = p % H;
    const float* base = qkv + b * T * C3;
    float* dbase = dqkv + b * T * C3;
    float* vt = scratch + p * static_cast<std::size_t>(hd) * T;
    float* datt = rows + p * static_cast<std::size_t>(T);
    transpose_head(vt, base + 2 * C + h * hd, C3, T, hd);
    for (int t = 0; t < T; ++t) {
      float* dst = dbase + t * C3 + h * hd;
      std::memset(dst, 0, sizeof(float) * hd);
      std::memset(dst + C, 0, sizeof(float) * hd);
      std::memset(dst + 2 * C, 0, sizeof(float) * hd);
    }
    for (int t = 0; t < T; ++t) {
      const float* row = att + (p * T + t) * static_cast<std::size_t>(T);
      const float* dy = dout + (b * T + t) * static_cast<std::size_t>(C) + h * hd;
      // datt[t2] = dy . v[t2];  dv[t2] += att[t][t2] * dy
      row_times_transposed(datt, dy, vt, t + 1, hd, T);
      for (int t2 = 0; t2 <= t; ++t2) {
        float* dv = dbase + t2 * C3 + 2 * C + h * hd;
        const float a = row[t2];
        for (int i = 0; i < hd; ++i) dv[i] += a * dy[i];
      }
      // softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])
      const float s = simd::dot_f32(row, datt, t + 1);
      const float* q = base + t * C3 + h * hd;
      float* dq = dbase + t * C3 + h * hd;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float dpre = row[t2] * (datt[t2] - s) * scale;
        const float* k = base + t2 * C3 + C + h * hd;
        float* dk = dbase + t2 * C3 + C + h * hd;
        for (int i = 0; i < hd; ++i) dq[i] += dpre * k[i];
        for (int i = 0; i < hd; ++i) dk[i] += dpre * q[i];
      }
    }
  }
}
}  // namespace

std::size_t attention_scratch_floats(int B, int T, int C, int H) {
  return static_cast<std::size_t>(B) * T * C + static_cast<std::size_t>(B) * H * T;
}

void attention_forward(ThreadPool& pool, float* out, float* att, float* scratch, const float* qkv, int B, int T,
                       int C, int H) {
  pool.parallel_for(static_cast<std::size_t>(B) * H, [&](std::size_t p0, std::size_t p1) {
    attention_forward_pairs(out, att, scratch, qkv, p0, p1, T, C, H);
  });
}

void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int H) {
  pool.parallel_for(static_cast<std::size_t>(B) * H, [&](std::size_t p0, std::size_t p1) {
    attention_backward_pairs(dqkv, scratch, dout, qkv, att, p0, p1, B, T, C, H);
  });
}

}  // namespace stratum
