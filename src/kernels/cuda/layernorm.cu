// LayerNorm forward/backward on the GPU, the semantics of kernels/cpu/layernorm.h (PyTorch:
// biased variance, eps inside the sqrt): one block per row for the row statistics and dinp, then
// dw/db with each column summed by one thread over rows 0..N-1 in order (norm_param_grads_kernel
// in row_reduce.cuh; Note [cuda determinism] in cuda_ops.h). Does not allocate; does not
// synchronise the stream.
#include "kernels/cuda/cuda_context.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace stratum {

namespace {

constexpr int kRowThreads = 256;  // threads per row (fixes the reduction tree's shape)

// out (N,C) = (inp - mean) * rstd * w + b; mean (N), rstd (N). Block r: row r.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int C, float eps) {
  __shared__ cuda_reduce::BlockScratch<kRowThreads> scratch;
  const std::size_t r = blockIdx.x;
  const float* x = inp + r * C;
  float* y = out + r * C;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < C; c += kRowThreads) acc += x[c];
  const float m = cuda_reduce::block_sum(acc, scratch) / static_cast<float>(C);
  acc = 0.0f;
  for (int c = threadIdx.x; c < C; c += kRowThreads) {
    const float d = x[c] - m;
    acc += d * d;
  }
  const float var = cuda_reduce::block_sum(acc, scratch) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + eps);
  for (int c = threadIdx.x; c < C; c += kRowThreads) y[c] = (x[c] - m) * s * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// dinp (N,C) += s * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = w * dout.
__global__ void layernorm_backward_rows_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                               const float* mean, const float* rstd, int C) {
  __shared__ cuda_reduce::BlockScratch<kRowThreads> scratch;
  const std::size_t r = blockIdx.x;
  const float* dy = dout + r * C;
  const float* x = inp + r * C;
  float* dx = dinp + r * C;
  const float m = mean[r], s = rstd[r];
  float acc_d = 0.0f, acc_dx = 0.0f;
  for (int c = threadIdx.x; c < C; c += kRowThreads) {
    const float xhat = (x[c] - m) * s;
    const float dnorm = w[c] * dy[c];
    acc_d += dnorm;
    acc_dx += dnorm * xhat;
  }
  cuda_reduce::block_sum2(acc_d, acc_dx, scratch);
  const float dnorm_mean = acc_d / static_cast<float>(C);
  const float dnorm_xhat_mean = acc_dx / static_cast<float>(C);
  for (int c = threadIdx.x; c < C; c += kRowThreads) {
    const float xhat = (x[c] - m) * s;
    const float dnorm = w[c] * dy[c];
    dx[c] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
  }
}

}  // namespace

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                int N, int C, float eps) const {
  if (N <= 0 || C <= 0) return;
  layernorm_forward_kernel<<<N, kRowThreads, 0, context().stream>>>(out, mean, rstd, inp, w, b, C, eps);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                 const float* w, const float* mean, const float* rstd, int N, int C,
                                 bool accumulate_params) const {
  if (C <= 0) return;
  const cudaStream_t stream = context().stream;
  if (N > 0) {
    layernorm_backward_rows_kernel<<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
    STRATUM_CUDA_LAUNCHED();
  }
  if (dw == nullptr) return;  // frozen (LoRA's base): no parameter gradients
  cuda_reduce::norm_param_grads_kernel<true, true>
      <<<cuda_reduce::norm_param_grads_blocks(C), cuda_reduce::kGradThreads, 0, stream>>>(dw, db, dout, inp, mean, rstd,
                                                                                          N, C, accumulate_params);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum
