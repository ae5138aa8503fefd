// The CUDA backend seen from plain C++: whether a device is usable and CudaOps (whose memory and
// copies are Ops::memory_alloc / upload / download), as the one entry point of libstratum_cuda.so (stratum_cuda_api), which
// backend/backend.cpp loads with dlopen the first time the CUDA backend is asked for. Loading it
// lazily keeps cuBLAS (hundreds of MiB of mappings) out of every CPU run and lets a CUDA build start
// on a machine without the CUDA libraries. Plain C++: no CUDA header here. Does not run kernels.
#pragma once

#include <cstddef>
#include <string>

#include "ops/ops.h"

namespace stratum {

// True when a CUDA device can run this build's kernels; otherwise false and *why says why (no
// driver, no device, a device older than the kernels were built for). Asked once per process.
bool cuda_device_available(std::string* why);
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB, driver 13.0)"; empty without a device.
std::string cuda_device_describe();

// The module's table of entry points; version guards a module built from other sources.
struct CudaBackendApi {
  static constexpr int kVersion = 3;
  int version;
  bool (*available)(std::string* why);
  std::string (*describe)();
  Ops* (*make_ops)(Precision precision);  // owned by the caller; throws Error
};

}  // namespace stratum

// The one symbol backend.cpp looks up in libstratum_cuda.so.
extern "C" const stratum::CudaBackendApi* stratum_cuda_api();
