// Matrix products of the CUDA backend: cuBLAS sgemm in exact fp32 (Note [cuda determinism] in
// cuda_ops.h) and the bias kernels around it, with the CPU's operation order (kernels/cpu/matmul.h):
// the forward broadcasts the bias into out and adds the product (beta 1); the bias gradient sums
// each column over rows in order (cuda_reduce::column_sums_kernel).
#include "kernels/cuda/cuda_context.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace stratum {

namespace {

__global__ void broadcast_rows_kernel(float* out, const float* bias, int M, int N) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<std::size_t>(M) * N) out[i] = bias[i % N];
}

__global__ void widen_kernel(float* out, const std::uint16_t* in, int rows, int cols, int ld) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(rows) * cols) return;
  const std::size_t r = i / cols, c = i % cols;
  out[i] = __uint_as_float(static_cast<unsigned>(in[r * ld + c]) << 16);
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
void CudaOps::sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) const {
  if (M == 0 || N == 0) return;
  STRATUM_CUBLAS_CHECK(cublasSgemm(ctx_->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

void CudaOps::sgemm_b16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                        const std::uint16_t* B, int ldb, float beta, float* C, int ldc, float* scratch) const {
  const int rows = trans_b ? N : K, cols = trans_b ? K : N;  // op(B) as stored
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  if (n > 0) {
    widen_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(scratch, B, rows, cols, ldb);
    STRATUM_CUDA_LAUNCHED();
  }
  sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, scratch, cols, beta, C, ldc);
}

void CudaOps::matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K,
                             int N) const {
  STRATUM_ASSERT(M > 0 && K > 0 && N > 0);
  float beta = 0.0f;
  if (bias != nullptr) {
    const std::size_t n = static_cast<std::size_t>(M) * N;
    broadcast_rows_kernel<<<blocks_for(n, 256), 256, 0, ctx_->stream>>>(out, bias, M, N);
    STRATUM_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  sgemm(false, false, M, N, K, 1.0f, inp, K, w, N, beta, out, N);
}

void CudaOps::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                              const float* w, int M, int K, int N, bool accumulate) const {
  if (dinp != nullptr) sgemm(false, true, M, K, N, 1.0f, dout, N, w, N, 0.0f, dinp, K);
  if (dw != nullptr) sgemm(true, false, K, N, M, 1.0f, inp, K, dout, N, accumulate ? 1.0f : 0.0f, dw, N);
  if (dbias != nullptr) {
    cuda_reduce::column_sums_kernel<<<cuda_reduce::norm_param_grads_blocks(N), cuda_reduce::kGradThreads, 0,
                                      ctx_->stream>>>(dbias, dout, M, N, accumulate);
    STRATUM_CUDA_LAUNCHED();
  }
}

std::size_t CudaOps::gemm_scratch_bytes(int, int, int) const { return 0; }

}  // namespace stratum
