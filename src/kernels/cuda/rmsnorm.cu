// RMSNorm forward/backward on the GPU, the semantics of kernels/cpu/rmsnorm.h (Hugging Face
// LlamaRMSNorm in fp32): one block per row for rstd and dinp, then dw with each column summed by
// one thread over rows 0..N-1 in order (norm_param_grads_kernel in row_reduce.cuh; Note [cuda
// determinism] in cuda_ops.h); mirrors layernorm.cu.
// Does not allocate; does not synchronise the stream.
#include "kernels/cuda/cuda_context.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace stratum {

namespace {

constexpr int kRowThreads = 256;  // threads per row (fixes the reduction tree's shape)

// out (N,C) = w * (inp * rstd); rstd (N) = 1/sqrt(mean(inp^2) + eps). Block r: row r.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w, int C, float eps) {
  __shared__ cuda_reduce::BlockScratch<kRowThreads> scratch;
  const std::size_t r = blockIdx.x;
  const float* x = inp + r * C;
  float* y = out + r * C;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < C; c += kRowThreads) acc += x[c] * x[c];
  const float ms = cuda_reduce::block_sum(acc, scratch) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(ms + eps);
  for (int c = threadIdx.x; c < C; c += kRowThreads) y[c] = w[c] * (x[c] * s);
  if (threadIdx.x == 0) rstd[r] = s;
}

// With xhat = x * s and g = w * dy: dinp (N,C) += s * (g - xhat * mean(g * xhat)) (rmsnorm.cpp).
__global__ void rmsnorm_backward_rows_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                             const float* rstd, int C) {
  __shared__ cuda_reduce::BlockScratch<kRowThreads> scratch;
  const std::size_t r = blockIdx.x;
  const float* dy = dout + r * C;
  const float* x = inp + r * C;
  float* dx = dinp + r * C;
  const float s = rstd[r];
  float acc = 0.0f;
  for (int c = threadIdx.x; c < C; c += kRowThreads) acc += (w[c] * dy[c]) * (x[c] * s);
  const float g_xhat_mean = cuda_reduce::block_sum(acc, scratch) / static_cast<float>(C);
  for (int c = threadIdx.x; c < C; c += kRowThreads) dx[c] += s * (w[c] * dy[c] - (x[c] * s) * g_xhat_mean);
}

}  // namespace

void CudaOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                              float eps) const {
  if (N <= 0 || C <= 0) return;
  rmsnorm_forward_kernel<<<N, kRowThreads, 0, context().stream>>>(out, rstd, inp, w, C, eps);
  STRATUM_CUDA_LAUNCHED();
}

void CudaOps::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                               const float* rstd, int N, int C, bool accumulate_params) const {
  if (C <= 0) return;
  const cudaStream_t stream = context().stream;
  if (N > 0) {
    rmsnorm_backward_rows_kernel<<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, rstd, C);
    STRATUM_CUDA_LAUNCHED();
  }
  if (dw == nullptr) return;  // frozen (LoRA's base): no weight gradient
  cuda_reduce::norm_param_grads_kernel<false, false>
      <<<cuda_reduce::norm_param_grads_blocks(C), cuda_reduce::kGradThreads, 0, stream>>>(dw, nullptr, dout, inp, nullptr,
                                                                                          rstd, N, C, accumulate_params);
  STRATUM_CUDA_LAUNCHED();
}

}  // namespace stratum

namespace stratum {

// Note [qk norm] (model/llama_block.h): the per-head norm has no CUDA kernel yet; nothing in this
// session could run one (the GPU tier's rule: no CUDA code that no GPU has run). A Qwen3 model is
// refused on this backend before it starts (train and generate check GptConfig::qk_norm), so
// reaching these is a bug.
void CudaOps::rmsnorm_heads_forward(float*, int, float*, const float*, int, int, int, float) const {
  STRATUM_FAIL("[backend.cuda] per-head RMSNorm (Qwen3's q_norm and k_norm) has no CUDA kernel: use --backend cpu");
}
void CudaOps::rmsnorm_heads_backward(float*, const float*, int, float*, const float*, const float*, int, int, int,
                                     bool) const {
  STRATUM_FAIL("[backend.cuda] per-head RMSNorm (Qwen3's q_norm and k_norm) has no CUDA kernel: use --backend cpu");
}

}  // namespace stratum
