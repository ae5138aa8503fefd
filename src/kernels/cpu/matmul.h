// Dense matrix products for the CPU backend, through OpenBLAS sgemm.
// Weights use Hugging Face GPT-2's Conv1D layout (in, out): y = x @ W + b. Does not own memory.
// GEMM results depend on the BLAS thread count (fixed per process), not on data placement.
#pragma once

#include <cstddef>
#include <string>

#include "core/thread_pool.h"
#include "ops/ops.h"

namespace stratum {

// Call first thing in main() (stratum's and the test binary's): OpenBLAS reads its environment
// once, when it is loaded, so this re-executes the process (once, via /proc/self/exe) when the
// environment needs changing:
//  - OPENBLAS_CORETYPE is dropped: a forced older core type (this environment sets Haswell)
//    halves GEMM speed on newer CPUs, and its kernels can break the exactness that the column
//    panels rely on (on an AMD EPYC, forced Haswell kernels gave a product split into column
//    panels other bits than the whole). STRATUM_KEEP_OPENBLAS_CORETYPE=1 keeps it.
//  - OPENBLAS_THREAD_TIMEOUT defaults to 4 (2^4 cycles): idle OpenBLAS workers sleep at once
//    instead of spinning for 2^28 cycles against our own kernel threads (+8-11% step speed on
//    GPT-2 small, docs/benchmarks.md). A value the user set is kept.
//  - OMP_WAIT_POLICY defaults to PASSIVE, for the same reason: oneDNN's OpenMP threads (bf16
//    products) sleep between products instead of spinning against the kernel threads.
// Neither changes results: the GEMM work partition depends only on the thread count.
void blas_prepare_process(char** argv);

// Pins the BLAS library to `num_threads` threads (call once at start-up) and reports its name.
void blas_set_threads(int num_threads);
std::string blas_describe();  // e.g. "OpenBLAS 0.3.21 (Cooperlake, 2 threads)"

// Row-major C (M,N) = alpha * op(A) @ op(B) + beta * C, op = transpose when trans_* is true.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// sgemm in `precision`: OpenBLAS for Fp32, sgemm_bf16 (matmul_bf16.h) for Bf16.
void gemm(ThreadPool& pool, Precision precision, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

// out (M,N) = inp (M,K) @ w (K,N) + bias (N); bias may be null. The product in `precision`.
void matmul_forward(ThreadPool& pool, Precision precision, float* out, const float* inp, const float* w,
                    const float* bias, int M, int K, int N);

// Backward of matmul_forward for dout (M,N):
//   dinp (M,K) = dout @ w^T      (skipped when dinp is null)
//   dw   (K,N) = inp^T @ dout    (+= when accumulate)
//   dbias (N)  = sum over rows of dout (+= when accumulate; skipped when null)
// The products in `precision`, the bias sum in fp32.
void matmul_backward(ThreadPool& pool, Precision precision, float* dinp, float* dw, float* dbias, const float* dout,
                     const float* inp, const float* w, int M, int K, int N, bool accumulate);

// dst (N) (= or +=) column sums of src (M,N), each column summed over rows in order.
void column_sum(ThreadPool& pool, float* dst, const float* src, int M, int N, bool accumulate);

}  // namespace stratum
