// What every CUDA op shares: the error check, the launch shape helpers, and CudaContext (the
// stream, the cuBLAS handle and the tables copied to the device once). Included by the .cu files
// of this folder only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/cuda/cuda_ops.h"
#include "stratum/error.h"

#define STRATUM_CUDA_CHECK(expr)                                                                     \
  do {                                                                                               \
    const cudaError_t stratum_err_ = (expr);                                                         \
    if (stratum_err_ != cudaSuccess)                                                                 \
      STRATUM_FAIL("[kernels.cuda] ", #expr, " failed: ", cudaGetErrorString(stratum_err_), " (", \
                   __FILE__, ":", __LINE__, ")");                                                    \
  } while (0)

#define STRATUM_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                               \
    const cublasStatus_t stratum_st_ = (expr);                                                       \
    if (stratum_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      STRATUM_FAIL("[kernels.cuda] ", #expr, " failed: ", cublasGetStatusString(stratum_st_), " (", \
                   __FILE__, ":", __LINE__, ")");                                                    \
  } while (0)

// A launch's error (bad configuration) is reported at once; faults inside kernels surface at the
// next synchronising call.
#define STRATUM_CUDA_LAUNCHED() STRATUM_CUDA_CHECK(cudaGetLastError())

namespace stratum {

// Device memory: cudaMalloc'd, at least 256-byte aligned. Throws Error when there is not enough.
// (Ops::memory_alloc, the tables and the cuBLAS workspace; cuda_ops.cu.)
void* cuda_alloc(std::size_t bytes);

struct CudaContext {
  cudaStream_t stream = nullptr;
  // Note [ops transfers]: the device tier's copies, beside the compute, one stream per direction
  // (a download waiting for the compute that wrote its unit holds back no upload; the two
  // directions also run at once over PCIe/NVLink-C2C).
  cudaStream_t upload_stream = nullptr;
  cudaStream_t download_stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;  // fixed cuBLAS workspace (reproducibility, Note [cuda determinism])
  // Device copies of host tables, made on first use.
  struct RopeCopy {
    int head_dim = 0, max_pos = 0;
    float probe = 0.0f;  // a value of the host table, to catch a table freed and reused at the address
    float* cos = nullptr;
    float* sin = nullptr;
  };
  std::mutex tables_mutex;
  std::map<const RopeTable*, RopeCopy> rope;
  float* zo_table = nullptr;  // (65536) Note [zo noise]
  static constexpr std::size_t kScalarSlots = 4096;
  double* scalars = nullptr;  // (kScalarSlots) device scratch for reductions (sum_squares' chunk sums)
  void* sq_jobs = nullptr;    // (kScalarSlots) sum_squares_many's chunk jobs (elementwise.cu)

  const RopeCopy& rope_copy(const RopeTable& table);
  const float* zo_normal_table();
};

// Blocks of `threads` covering n items.
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace stratum
