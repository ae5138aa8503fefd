// Causal grouped-query attention forward/backward and the KV-cache variant. Work items: the
// forward and the cached variant take one (batch, query head) pair each, the backward one
// (batch, kv head) pair (it alone writes that kv head's dk/dv, summing the group's query heads
// in increasing order). All sums inside an item run in a fixed order, so results do not depend
// on the thread count (Note [deterministic partition] in core/thread_pool.h). With KV == H the
// arithmetic is exactly that of the original GPT-2 kernel.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/simd.h"

namespace stratum {

namespace {
// The qkv row layout: [q (H*hd) | k (KV*hd) | v (KV*hd)].
struct QkvLayout {
  int H, KV, hd;
  std::size_t width() const { return static_cast<std::size_t>(H + 2 * KV) * hd; }
  std::size_t q(int h) const { return static_cast<std::size_t>(h) * hd; }
  std::size_t k(int kvh) const { return static_cast<std::size_t>(H + kvh) * hd; }
  std::size_t v(int kvh) const { return static_cast<std::size_t>(H + KV + kvh) * hd; }
};

void check_shape(const char* what, int B, int T, int H, int KV, int hd) {
  STRATUM_CHECK(B >= 0 && T >= 0, "[kernels.attention] ", what, ": B and T must be >= 0, got ", B, " and ", T);
  STRATUM_CHECK(H > 0 && KV > 0 && hd > 0, "[kernels.attention] ", what, ": H, KV, hd must be > 0, got ", H, ", ",
                KV, ", ", hd);
  STRATUM_CHECK(H % KV == 0, "[kernels.attention] ", what, ": query heads H=", H,
                " must be a multiple of the key/value heads KV=", KV);
}

// dst (hd, T) = the head's slice of rows [0, T) of src, where row t2 starts at base + t2 * stride.
void transpose_head(float* dst, const float* base, std::size_t stride, int T, int hd) {
  for (int t2 = 0; t2 < T; ++t2)
    for (int i = 0; i < hd; ++i) dst[static_cast<std::size_t>(i) * T + t2] = base[t2 * stride + i];
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

// row[t2] = sum_i x[i] * rows[t2][i] for t2 in [0, n), rows (n, hd) row-major: the same sums in
// the same order as row_times_transposed (starting from 0, i increasing), computed kLanes rows at
// a time through a small transposed tile so the inner loop runs over contiguous lanes.
STRATUM_SIMD_CLONES
void row_times_rows(float* row, const float* x, const float* rows, int n, int hd) {
  constexpr int kTileI = 64;
  float tile[kTileI][simd::kLanes];  // (i, lane) slice of rows t0.. t0+kLanes, transposed
  for (int t0 = 0; t0 < n; t0 += simd::kLanes) {
    const int w = std::min(simd::kLanes, n - t0);
    float acc[simd::kLanes] = {};
    for (int i0 = 0; i0 < hd; i0 += kTileI) {
      const int iw = std::min(kTileI, hd - i0);
      for (int l = 0; l < simd::kLanes; ++l) {
        // Lanes past n repeat the last row; their sums are discarded.
        const float* src = rows + static_cast<std::size_t>(t0 + std::min(l, w - 1)) * hd + i0;
        for (int i = 0; i < iw; ++i) tile[i][l] = src[i];
      }
      for (int i = 0; i < iw; ++i) {
        const float xi = x[i0 + i];
        for (int l = 0; l < simd::kLanes; ++l) acc[l] += xi * tile[i][l];
      }
    }
    for (int l = 0; l < w; ++l) row[t0 + l] = acc[l];
  }
}

// Scores of row[0..n) -> softmax probabilities in place (scale, max-subtracted exp, normalise),
// then y (hd) = sum_t2 row[t2] * v[t2], v row t2 at v + t2 * v_stride. Shared by the forward and
// the cached variant (Note [cached attention bits]).
STRATUM_SIMD_CLONES
void softmax_times_v(float* y, float* row, int n, float scale, const float* v, std::size_t v_stride, int hd) {
  for (int t2 = 0; t2 < n; ++t2) row[t2] *= scale;
  const float mx = simd::max_f32(row, n);
  for (int t2 = 0; t2 < n; ++t2) row[t2] = simd::exp_f32(row[t2] - mx);
  const float inv = 1.0f / simd::sum_f32(row, n);
  for (int t2 = 0; t2 < n; ++t2) row[t2] *= inv;
  for (int i = 0; i < hd; ++i) y[i] = 0.0f;
  for (int t2 = 0; t2 < n; ++t2) {
    const float* vr = v + t2 * v_stride;
    const float a = row[t2];
    for (int i = 0; i < hd; ++i) y[i] += a * vr[i];
  }
}

STRATUM_SIMD_CLONES
void attention_forward_pairs(float* out, float* att, float* scratch, const float* qkv, std::size_t p0,
                             std::size_t p1, int T, QkvLayout lay) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * hd;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::size_t b = p / lay.H;
    const int h = static_cast<int>(p % lay.H), kvh = h / group;
    const float* base = qkv + b * T * W;
    float* kt = scratch + p * static_cast<std::size_t>(hd) * T;  // (hd, T)
    transpose_head(kt, base + lay.k(kvh), W, T, hd);
    for (int t = 0; t < T; ++t) {
      const float* q = base + t * W + lay.q(h);
      float* row = att + (p * T + t) * static_cast<std::size_t>(T);
      row_times_transposed(row, q, kt, t + 1, hd, T);
      float* y = out + (b * T + t) * out_w + lay.q(h);
      softmax_times_v(y, row, t + 1, scale, base + lay.v(kvh), W, hd);
      for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
    }
  }
}

STRATUM_SIMD_CLONES
void attention_backward_pairs(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                              std::size_t p0, std::size_t p1, int B, int T, QkvLayout lay) {
  const int hd = lay.hd, group = lay.H / lay.KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t W = lay.width(), out_w = static_cast<std::size_t>(lay.H) * hd;
  float* rows = scratch + static_cast<std::size_t>(B) * lay.H * hd * T;  // (B*H, T) after the transposes
  for (std::size_t p = p0; p < p1; ++p) {  // p = b * KV + kvh
    const std::size_t b = p / lay.KV;
    const int kvh = static_cast<int>(p % lay.KV);
    const float* base = qkv + b * T * W;
    float* dbase = dqkv + b * T * W;
    float* vt = scratch + p * static_cast<std::size_t>(hd) * T;  // (hd, T)
    float* datt = rows + p * static_cast<std::size_t>(T);         // (T)
    transpose_head(vt, base + lay.v(kvh), W, T, hd);
    for (int t = 0; t < T; ++t) {
      float* drow = dbase + t * W;
      for (int g = 0; g < group; ++g) std::memset(drow + lay.q(kvh * group + g), 0, sizeof(float) * hd);
      std::memset(drow + lay.k(kvh), 0, sizeof(float) * hd);
      std::memset(drow + lay.v(kvh), 0, sizeof(float) * hd);
    }
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      const std::size_t bh = b * lay.H + h;
      for (int t = 0; t < T; ++t) {
        const float* row = att + (bh * T + t) * static_cast<std::size_t>(T);
        const float* dy = dout + (b * T + t) * out_w + lay.q(h);
        // datt[t2] = dy . v[t2];  dv[t2] += att[t][t2] * dy
        row_times_transposed(datt, dy, vt, t + 1, hd, T);
        for (int t2 = 0; t2 <= t; ++t2) {
          float* dv = dbase + t2 * W + lay.v(kvh);
          const float a = row[t2];
          for (int i = 0; i < hd; ++i) dv[i] += a * dy[i];
        }
        // softmax backward: dpre[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])
        const float s = simd::dot_f32(row, datt, t + 1);
        const float* q = base + t * W + lay.q(h);
        float* dq = dbase + t * W + lay.q(h);
        for (int t2 = 0; t2 <= t; ++t2) {
          const float dpre = row[t2] * (datt[t2] - s) * scale;
          const float* k = base + t2 * W + lay.k(kvh);
          float* dk = dbase + t2 * W + lay.k(kvh);
          for (int i = 0; i < hd; ++i) dq[i] += dpre * k[i];
          for (int i = 0; i < hd; ++i) dk[i] += dpre * q[i];
        }
      }
    }
  }
}

STRATUM_SIMD_CLONES
void attention_cached_pairs(float* out, float* scratch, const float* q, const float* kcache, const float* vcache,
                            std::size_t p0, std::size_t p1, int Tn, const int* past, int max_T, int H, int KV,
                            int hd) {
  const int group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t row_w = static_cast<std::size_t>(H) * hd;
  for (std::size_t p = p0; p < p1; ++p) {  // p = b * H + h
    const std::size_t b = p / H;
    const int h = static_cast<int>(p % H), kvh = h / group;
    const std::size_t cache = (b * KV + kvh) * static_cast<std::size_t>(max_T) * hd;
    float* row = scratch + p * static_cast<std::size_t>(max_T);  // (max_T)
    for (int t = 0; t < Tn; ++t) {
      const int n = past[b] + t + 1;
      const std::size_t r = (b * Tn + t) * row_w + static_cast<std::size_t>(h) * hd;
      row_times_rows(row, q + r, kcache + cache, n, hd);
      softmax_times_v(out + r, row, n, scale, vcache + cache, static_cast<std::size_t>(hd), hd);
    }
  }
}
}  // namespace

std::size_t attention_scratch_floats(int B, int T, int H, int KV, int hd) {
  check_shape("attention_scratch_floats", B, T, H, KV, hd);
  return static_cast<std::size_t>(B) * H * hd * T + static_cast<std::size_t>(B) * H * T;
}

void attention_forward(ThreadPool& pool, float* out, float* att, float* scratch, const float* qkv, int B, int T,
                       int H, int KV, int hd) {
  check_shape("attention_forward", B, T, H, KV, hd);
  const QkvLayout lay{H, KV, hd};
  pool.parallel_for(static_cast<std::size_t>(B) * H, [&](std::size_t p0, std::size_t p1) {
    attention_forward_pairs(out, att, scratch, qkv, p0, p1, T, lay);
  });
}

void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int H, int KV, int hd) {
  check_shape("attention_backward", B, T, H, KV, hd);
  const QkvLayout lay{H, KV, hd};
  pool.parallel_for(static_cast<std::size_t>(B) * KV, [&](std::size_t p0, std::size_t p1) {
    attention_backward_pairs(dqkv, scratch, dout, qkv, att, p0, p1, B, T, lay);
  });
}

std::size_t attention_cached_scratch_floats(int B, int Tn, int H, int max_T) {
  STRATUM_CHECK(B >= 0 && Tn >= 0 && H > 0 && max_T > 0, "[kernels.attention] attention_cached_scratch_floats: bad "
                "shape B ", B, " Tn ", Tn, " H ", H, " max_T ", max_T);
  return static_cast<std::size_t>(B) * H * max_T;
}

void attention_cached(ThreadPool& pool, float* out, float* scratch, const float* q, const float* kcache,
                      const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV, int hd) {
  check_shape("attention_cached", B, Tn, H, KV, hd);
  for (int b = 0; b < B; ++b)
    STRATUM_CHECK(past[b] >= 0 && past[b] <= max_T - Tn, "[kernels.attention] attention_cached: sequence ", b,
                  " has ", past[b], " cached positions + ", Tn, " new ones, beyond the cache's max_T ", max_T);
  pool.parallel_for(static_cast<std::size_t>(B) * H, [&](std::size_t p0, std::size_t p1) {
    attention_cached_pairs(out, scratch, q, kcache, vcache, p0, p1, Tn, past, max_T, H, KV, hd);
  });
}

}  // namespace stratum
