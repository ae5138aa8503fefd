// Softmax cross-entropy over vocabulary blocks (Note [online log-sum-exp] in
// kernels/cpu/softmax_xent.h) and the sampling softmax of one row, on the GPU, with the semantics
// of kernels/cpu/softmax_xent.h: one block per row, each sum a fixed-shape block reduction
// (row_reduce.cuh, Note [cuda determinism] in cuda_ops.h). exp is CUDA's expf (no fast math),
// not the CPU's polynomial, so results agree with the CPU within a few ulp, not bitwise.
// Does not allocate; does not synchronise the stream.
#include <vector>

#include "kernels/cuda/cuda_context.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace stratum {

namespace {

constexpr int kXentThreads = 512;      // threads per row of a vocabulary block (n is ~10^4)
constexpr int kSoftmaxThreads = 1024;  // the one block of softmax_row (V up to ~1.5e5)

// Folds row r of logits (N, n), columns [v0, v0 + n) of the full rows, into run_max/run_sum
// (run_sum 0: the first block) and records the target's logit when it lies in the block.
__global__ void xent_chunk_forward_kernel(float* run_max, float* run_sum, float* target_logit, const float* logits,
                                          const std::int32_t* targets, int n, int v0) {
  __shared__ cuda_reduce::BlockScratch<kXentThreads> scratch;
  const std::size_t r = blockIdx.x;
  const float* x = logits + r * n;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kXentThreads) mx = fmaxf(mx, x[i]);
  mx = cuda_reduce::block_max(mx, scratch);
  // Every thread reads the running state before thread 0 rewrites it (after block_sum's barrier).
  const float old_sum = run_sum[r], old_max = run_max[r];
  float m = old_max, base = old_sum;
  if (old_sum == 0.0f) {  // first block (a sum of exps is never 0 afterwards)
    m = mx;
    base = 0.0f;
  } else if (mx > old_max) {
    base = old_sum * expf(old_max - mx);
    m = mx;
  }
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += kXentThreads) acc += expf(x[i] - m);
  const float sum = cuda_reduce::block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    run_max[r] = m;
    run_sum[r] = base + sum;
    const int t = targets[r] - v0;
    if (t >= 0 && t < n) target_logit[r] = x[t];
  }
}

// dlogits (N, n) = (exp(logits - lse[r]) - onehot(targets[r] - v0)) * dloss; each element read
// and written by one thread, so dlogits may alias logits.
__global__ void xent_chunk_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                           const std::int32_t* targets, int n, int v0, float dloss) {
  const std::size_t r = blockIdx.x;
  const float* x = logits + r * n;
  float* d = dlogits + r * n;
  const float l = lse[r];
  const int t = targets[r] - v0;
  for (int i = threadIdx.x; i < n; i += kXentThreads) {
    float v = expf(x[i] - l) * dloss;
    if (i == t) v -= dloss;
    d[i] = v;
  }
}

// probs (V) = softmax(logits / temperature); each element read and written by one thread, so
// probs may alias logits.
__global__ void softmax_row_kernel(float* probs, const float* logits, int V, float temperature) {
  __shared__ cuda_reduce::BlockScratch<kSoftmaxThreads> scratch;
  const float inv_t = 1.0f / temperature;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kSoftmaxThreads) mx = fmaxf(mx, logits[i] * inv_t);
  mx = cuda_reduce::block_max(mx, scratch);
  float acc = 0.0f;
  for (int i = threadIdx.x; i < V; i += kSoftmaxThreads) acc += expf(logits[i] * inv_t - mx);
  const float inv = 1.0f / cuda_reduce::block_sum(acc, scratch);
  for (int i = threadIdx.x; i < V; i += kSoftmaxThreads) probs[i] = expf(logits[i] * inv_t - mx) * inv;
}

}  // namespace

void CudaOps::xent_chunk_forward(float* run_max, float* run_sum, float* target_logit, const float* logits,
                                 const std::int32_t* targets, int N, int n, int v0) const {
  if (N <= 0 || n <= 0) return;
  xent_chunk_forward_kernel<<<N, kXentThreads, 0, context().stream>>>(run_max, run_sum, target_logit, logits, targets,
                                                                      n, v0);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::xent_chunk_backward(float* dlogits, const float* logits, const float* lse, const std::int32_t* targets,
                                  int N, int n, int v0, float dloss, float softcap) const {
  if (softcap != 0.0f) throw BugError("[cuda] bug: soft-capped logits on CUDA, which backend_check refuses");
  if (N <= 0 || n <= 0) return;
  xent_chunk_backward_kernel<<<N, kXentThreads, 0, context().stream>>>(dlogits, logits, lse, targets, n, v0, dloss);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::softmax_row(float* probs, const float* logits, int V, float temperature) const {
  if (V <= 0) return;
  softmax_row_kernel<<<1, kSoftmaxThreads, 0, context().stream>>>(probs, logits, V, temperature);
  STRATUM_CUDA_LAUNCHED();
}

namespace {
__global__ void lse_kernel(float* lse, const float* run_max, const float* run_sum, int N) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < N) lse[r] = run_max[r] + logf(run_sum[r]);
}
}  // namespace

float CudaOps::xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                                const std::int32_t* targets, int N) const {
  if (N <= 0) return 0.0f;
  std::vector<std::int32_t> tg(static_cast<std::size_t>(N));
  download(tg.data(), targets, tg.size() * sizeof(std::int32_t));
  for (const std::int32_t t : tg)
    STRATUM_CHECK(t >= 0, "[cuda] a loss mask (targets that are not trained) is not supported on the CUDA backend "
                  "yet; train it with --backend cpu");
  lse_kernel<<<blocks_for(static_cast<std::size_t>(N), 256), 256, 0, ctx_->stream>>>(lse, run_max, run_sum, N);
  STRATUM_CUDA_LAUNCHED();
  std::vector<float> l(static_cast<std::size_t>(N)), t(static_cast<std::size_t>(N));
  download(l.data(), lse, l.size() * sizeof(float));
  download(t.data(), target_logit, t.size() * sizeof(float));
  double total = 0.0;
  for (int r = 0; r < N; ++r) total += l[r] - t[r];
  return static_cast<float>(total / N);
}

}  // namespace stratum
