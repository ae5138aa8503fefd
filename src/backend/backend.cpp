// ops_make and the backend's library settings; see backend.h.
#include "backend/backend.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"

namespace stratum {

std::unique_ptr<Ops> ops_make(ThreadPool& pool, Precision precision, Backend backend) {
  switch (backend) {
    case Backend::Cpu:
      break;
  }
  return std::make_unique<CpuOps>(pool, precision);
}

std::string backend_precision_note(Precision precision) {
  if (precision != Precision::Bf16 || bf16_native()) return "";
  return "this CPU has no native bf16 (AVX-512 BF16 or AMX): --precision bf16 gives bf16's results at fp32's speed "
         "or slower here";
}

void backend_set_threads(int threads) { blas_set_threads(threads); }

void backend_prepare_process(char** argv) { blas_prepare_process(argv); }

std::string backend_describe() { return blas_describe(); }

}  // namespace stratum
