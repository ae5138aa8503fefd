// ops_make and the backend's library settings; see backend.h.
#include "backend/backend.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul.h"

namespace stratum {

std::unique_ptr<Ops> ops_make(ThreadPool& pool, Backend backend) {
  switch (backend) {
    case Backend::Cpu:
      break;
  }
  return std::make_unique<CpuOps>(pool);
}

void backend_set_threads(int threads) { blas_set_threads(threads); }

void backend_prepare_process(char** argv) { blas_prepare_process(argv); }

std::string backend_describe() { return blas_describe(); }

}  // namespace stratum
