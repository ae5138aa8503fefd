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

  // Note [attention lanes]: the training attention's sequences run side by side on up to kLanes
  // streams, each with its own cuBLAS handle and workspace (cuBLAS's reproducibility needs one
  // workspace per concurrent stream) and its own part of the attention scratch. A sequence's
  // products and softmax rows are the same calls as on one stream, in the same order on its lane,
  // so the bits do not change; what changes is that one sequence's small products (O = P V: 96
  // thread blocks on an H200's 132 SMs for GPT-2 small) run beside another's. Lane 0 is the main
  // stream and handle; the others are made on first use. A launch forks the lanes after the work
  // queued on the main stream (lanes_fork) and joins them back (lanes_join) before it returns, so
  // everything after it on the main stream (and every event recorded there) follows their work.
  // Ops::attention_lanes_limit caps the lanes (lanes_max; a run under --gpu-mem-budget takes 1, so
  // the scratch is one lane's). On an H200, GPT-2 small B4 T1024 in GPU memory: the keep step 104.1
  // and 104.4 ms with four lanes against 108.9 and 109.2 with one, interleaved in one lease, the
  // same params hash (docs/benchmarks.md).
  struct Lane {
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
  };
  static constexpr int kLanes = 4;
  int lanes_max = kLanes;  // Ops::attention_lanes_limit
  Lane lane(int i) const { return i == 0 ? Lane{stream, blas} : lanes_[i - 1]; }
  void lanes_fork(int n);  // lanes 1 .. n-1 wait for the main stream's work so far (made if needed)
  void lanes_join(int n);  // the main stream waits for lanes 1 .. n-1
  ~CudaContext();

  const RopeCopy& rope_copy(const RopeTable& table);
  const float* zo_normal_table();

 private:
  Lane lanes_[kLanes - 1];
  void* lane_workspace_[kLanes - 1] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t joined_[kLanes - 1] = {};
};

// Blocks of `threads` covering n items.
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace stratum
