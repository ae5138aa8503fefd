// GEMM wrappers over OpenBLAS and the bias kernels; see matmul.h.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/simd.h"
#include "kernels/cpu/matmul_bf16.h"
#include "stratum/error.h"

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace stratum {

void blas_prepare_process(char** argv) {
  if (std::getenv("STRATUM_BLAS_ENV_READY") != nullptr) {
    // The marker guards one re-execution only: processes this one starts check their own
    // environment again (a test that runs stratum with OPENBLAS_CORETYPE set, say).
    ::unsetenv("STRATUM_BLAS_ENV_READY");
    return;
  }
  bool changed = false;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr && std::getenv("STRATUM_KEEP_OPENBLAS_CORETYPE") == nullptr) {
    ::unsetenv("OPENBLAS_CORETYPE");
    changed = true;
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    ::setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    changed = true;
  }
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {  // oneDNN's OpenMP threads, likewise
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  if (!changed) return;
  ::setenv("STRATUM_BLAS_ENV_READY", "1", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

void blas_set_threads(int num_threads) { openblas_set_num_threads(num_threads); }

std::string blas_describe() {
  std::string config = openblas_get_config();
  std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
  return version + " (" + openblas_get_corename() + ", " + std::to_string(openblas_get_num_threads()) +
         " threads)";
}

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {
STRATUM_SIMD_CLONES
void broadcast_rows(float* out, const float* bias, std::size_t row_begin, std::size_t row_end, int N) {
  for (std::size_t r = row_begin; r < row_end; ++r) std::memcpy(out + r * N, bias, sizeof(float) * N);
}

// dst[c] (+)= sum_r src[r][c] for c in [c0, c1): rows in order, so the result is independent of
// how columns are split across threads (Note [deterministic partition]).
STRATUM_SIMD_CLONES
void column_sum_range(float* dst, const float* src, int M, int N, std::size_t c0, std::size_t c1,
                      bool accumulate) {
  constexpr std::size_t kTile = 256;
  float acc[kTile];
  for (std::size_t t0 = c0; t0 < c1; t0 += kTile) {
    const std::size_t width = std::min(kTile, c1 - t0);
    for (std::size_t c = 0; c < width; ++c) acc[c] = 0.0f;
    for (int r = 0; r < M; ++r) {
      const float* row = src + static_cast<std::size_t>(r) * N + t0;
      for (std::size_t c = 0; c < width; ++c) acc[c] += row[c];
    }
    for (std::size_t c = 0; c < width; ++c) dst[t0 + c] = accumulate ? dst[t0 + c] + acc[c] : acc[c];
  }
}
}  // namespace

void column_sum(ThreadPool& pool, float* dst, const float* src, int M, int N, bool accumulate) {
  pool.parallel_for(static_cast<std::size_t>(N), [&](std::size_t c0, std::size_t c1) {
    column_sum_range(dst, src, M, N, c0, c1, accumulate);
  }, 64);
}

void gemm(ThreadPool& pool, Precision precision, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (precision == Precision::Bf16) sgemm_bf16(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward(ThreadPool& pool, Precision precision, float* out, const float* inp, const float* w,
                    const float* bias, int M, int K, int N) {
  STRATUM_ASSERT(M > 0 && K > 0 && N > 0);
  float beta = 0.0f;
  if (bias != nullptr) {
    pool.parallel_for(static_cast<std::size_t>(M), [&](std::size_t r0, std::size_t r1) {
      broadcast_rows(out, bias, r0, r1, N);
    }, 16);
    beta = 1.0f;
  }
  gemm(pool, precision, false, false, M, N, K, 1.0f, inp, K, w, N, beta, out, N);
}

void matmul_backward(ThreadPool& pool, Precision precision, float* dinp, float* dw, float* dbias, const float* dout,
                     const float* inp, const float* w, int M, int K, int N, bool accumulate) {
  STRATUM_ASSERT(M > 0 && K > 0 && N > 0);
  if (precision == Precision::Bf16 && dinp != nullptr && dw != nullptr && bf16_onednn()) {
    matmul_backward_bf16(pool, dinp, dw, dout, inp, w, M, K, N, accumulate);  // Note [bf16 backward operands]
  } else {
    if (dinp != nullptr) gemm(pool, precision, false, true, M, K, N, 1.0f, dout, N, w, N, 0.0f, dinp, K);
    if (dw != nullptr)
      gemm(pool, precision, true, false, K, N, M, 1.0f, inp, K, dout, N, accumulate ? 1.0f : 0.0f, dw, N);
  }
  if (dbias != nullptr) column_sum(pool, dbias, dout, M, N, accumulate);
}

}  // namespace stratum
