// The CUDA backend seen from plain C++: whether a device is usable, its memory, host <-> device
// copies and CudaOps, as the one entry point of libstratum_cuda.so (stratum_cuda_api), which
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

// Device memory: cudaMalloc'd, at least 256-byte aligned. Throws Error when there is not enough.
void* cuda_alloc(std::size_t bytes);
void cuda_free(void* p) noexcept;
// Host -> device and device -> host copies of plain (pageable) host memory. Both wait for every
// kernel queued on the device first, so a download sees the results of the ops before it.
void cuda_upload(void* dst_device, const void* src_host, std::size_t bytes);
void cuda_download(void* dst_host, const void* src_device, std::size_t bytes);
void cuda_synchronize();

// The module's table of entry points; version guards a module built from other sources.
struct CudaBackendApi {
  static constexpr int kVersion = 1;
  int version;
  bool (*available)(std::string* why);
  std::string (*describe)();
  void* (*alloc)(std::size_t bytes);
  void (*free)(void* p) noexcept;
  void (*upload)(void* dst_device, const void* src_host, std::size_t bytes);
  void (*download)(void* dst_host, const void* src_device, std::size_t bytes);
  Ops* (*make_ops)(Precision precision);  // owned by the caller; throws Error
};

}  // namespace stratum

// The one symbol backend.cpp looks up in libstratum_cuda.so.
extern "C" const stratum::CudaBackendApi* stratum_cuda_api();
