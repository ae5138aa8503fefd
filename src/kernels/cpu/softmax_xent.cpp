// Softmax cross-entropy rows in parallel; per-row sums use the fixed lane order of simd.h.
#include "kernels/cpu/softmax_xent.h"

#include <cmath>

#include "core/simd.h"
#include "stratum/error.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
float row_sum_exp(const float* x, int V, float mx) {
  float acc[simd::kLanes] = {};
  int i = 0;
  for (; i + simd::kLanes <= V; i += simd::kLanes)
    for (int l = 0; l < simd::kLanes; ++l) acc[l] += simd::exp_f32(x[i + l] - mx);
  for (int l = 0; i < V; ++i, ++l) acc[l] += simd::exp_f32(x[i] - mx);
  return simd::lanes_sum(acc);
}

STRATUM_SIMD_CLONES
void softmax_xent_rows(float* losses, float* dlogits, const float* logits, const std::int32_t* targets,
                       std::size_t r0, std::size_t r1, int V, float dloss) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = logits + r * V;
    const float mx = simd::max_f32(x, V);
    const float sum = row_sum_exp(x, V, mx);
    const float log_sum = std::log(sum);
    const int target = targets[r];
    losses[r] = (mx + log_sum) - x[target];
    if (dlogits != nullptr) {
      float* d = dlogits + r * V;
      const float inv = 1.0f / sum;
      for (int i = 0; i < V; ++i) d[i] = simd::exp_f32(x[i] - mx) * inv * dloss;
      d[target] -= dloss;
    }
  }
}
STRATUM_SIMD_CLONES
void xent_chunk_forward_rows(float* run_max, float* run_sum, float* target_logit, const float* logits,
                             const std::int32_t* targets, std::size_t r0, std::size_t r1, int n, int v0) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = logits + r * n;
    const float mx = simd::max_f32(x, n);
    if (run_sum[r] == 0.0f) {  // first block (a sum of exps is never 0 afterwards)
      run_max[r] = mx;
    } else if (mx > run_max[r]) {
      run_sum[r] *= std::exp(run_max[r] - mx);
      run_max[r] = mx;
    }
    run_sum[r] += row_sum_exp(x, n, run_max[r]);
    const int t = targets[r] - v0;
    if (t >= 0 && t < n) target_logit[r] = x[t];
  }
}

STRATUM_SIMD_CLONES
void xent_chunk_backward_rows(float* dlogits, const float* logits, const float* lse, const std::int32_t* targets,
                              std::size_t r0, std::size_t r1, int n, int v0, float dloss, float cap) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* x = logits + r * n;
    float* d = dlogits + r * n;
    if (targets[r] < 0) {  // no loss target (Note [loss mask])
      std::fill(d, d + n, 0.0f);
      continue;
    }
    const float l = lse[r];
    const int t = targets[r] - v0;
    if (cap > 0.0f) {  // Note [final softcapping]: x holds capped logits (d may alias it)
      for (int i = 0; i < n; ++i) {
        const float c = x[i], th = c / cap;
        float g = simd::exp_f32(c - l) * dloss;
        if (i == t) g -= dloss;
        d[i] = g * cap * (1.0f - th * th) / cap;
      }
      continue;
    }
    for (int i = 0; i < n; ++i) d[i] = simd::exp_f32(x[i] - l) * dloss;
    if (t >= 0 && t < n) d[t] -= dloss;
  }
}

STRATUM_SIMD_CLONES
void logit_softcap_rows(float* x, std::size_t r0, std::size_t r1, int n, std::size_t ld, float cap) {
  for (std::size_t r = r0; r < r1; ++r) {
    float* row = x + r * ld;
    for (int i = 0; i < n; ++i) row[i] = simd::tanh_f32(row[i] / cap) * cap;
  }
}
}  // namespace

void xent_chunk_forward(ThreadPool& pool, float* run_max, float* run_sum, float* target_logit, const float* logits,
                        const std::int32_t* targets, int N, int n, int v0) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    xent_chunk_forward_rows(run_max, run_sum, target_logit, logits, targets, r0, r1, n, v0);
  });
}

void xent_chunk_backward(ThreadPool& pool, float* dlogits, const float* logits, const float* lse,
                         const std::int32_t* targets, int N, int n, int v0, float dloss, float softcap) {
  STRATUM_CHECK(softcap >= 0.0f, "[kernels.xent] xent_chunk_backward: softcap must be >= 0, got ", softcap);
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    xent_chunk_backward_rows(dlogits, logits, lse, targets, r0, r1, n, v0, dloss, softcap);
  });
}

void logit_softcap(ThreadPool& pool, float* x, int rows, int n, int ld, float cap) {
  STRATUM_CHECK(cap > 0.0f && rows >= 0 && n >= 0 && ld >= n, "[kernels.xent] logit_softcap: bad arguments: cap ", cap,
                " rows ", rows, " n ", n, " ld ", ld);
  pool.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t r0, std::size_t r1) {
    logit_softcap_rows(x, r0, r1, n, static_cast<std::size_t>(ld), cap);
  });
}

void softmax_xent(ThreadPool& pool, float* losses, float* dlogits, const float* logits,
                  const std::int32_t* targets, int N, int V, float dloss) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t r0, std::size_t r1) {
    softmax_xent_rows(losses, dlogits, logits, targets, r0, r1, V, dloss);
  });
}

void softmax_row(float* probs, const float* logits, int V, float temperature) {
  const float inv_t = 1.0f / temperature;
  for (int i = 0; i < V; ++i) probs[i] = logits[i] * inv_t;
  const float mx = simd::max_f32(probs, V);
  const float sum = row_sum_exp(probs, V, mx);
  const float inv = 1.0f / sum;
  for (int i = 0; i < V; ++i) probs[i] = simd::exp_f32(probs[i] - mx) * inv;
}

float xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                       const std::int32_t* targets, int N) {
  double total = 0.0;
  int counted = 0;
  for (int r = 0; r < N; ++r) {
    lse[r] = run_max[r] + std::log(run_sum[r]);
    if (targets[r] < 0) continue;  // no loss target (Note [loss mask])
    total += lse[r] - target_logit[r];
    ++counted;
  }
  return counted == 0 ? 0.0f : static_cast<float>(total / counted);
}

}  // namespace stratum
