// Helpers of the cross-backend op tests (tests/cuda_*_test.cpp): the CPU backend (the reference,
// Note [ops seam]) and the CUDA backend side by side over the same host inputs. A test calls
// STRATUM_REQUIRE_CUDA() first: where this build has no CUDA backend or the machine no GPU it is
// skipped with the reason (CI has no GPU; the project's GPU machine runs them). Each test states its
// tolerance next to the op and what it measured.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "ops/ops_buffer.h"
#include "test_util.h"

namespace stratum::test {

#define STRATUM_REQUIRE_CUDA()                                              \
  do {                                                                      \
    std::string stratum_why_;                                               \
    if (!::stratum::backend_available(::stratum::Backend::Cuda, &stratum_why_)) \
      GTEST_SKIP() << stratum_why_;                                         \
  } while (0)

// The GPU Ops of every cross-backend test: one per process, so one stream orders the uploads, the
// ops under test and the downloads.
inline const Ops& test_gpu_ops() {
  static ThreadPool pool(1);
  static const std::unique_ptr<Ops> ops = ops_make(pool, Precision::Fp32, Backend::Cuda);
  return *ops;
}

// A host vector mirrored in the GPU Ops' memory.
template <class T>
struct DeviceVec {
  std::vector<T> host;
  OpsBuffer dev;
  T* d() const { return dev.as<T>(); }
  std::size_t size() const { return host.size(); }
};

// Every element of got has want's bits (memcmp, so NaNs and signed zeros count); the first
// difference is reported.
template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": bits differ at element " << i << ": " << got[i] << " vs " << want[i];
      return;
    }
}

class CrossBackend {
 public:
  CrossBackend() : pool_(2), cpu_(ops_make(pool_)) {}
  const Ops& cpu() const { return *cpu_; }
  const Ops& gpu() const { return test_gpu_ops(); }

  // A device copy of `host`.
  template <class T>
  static DeviceVec<T> up(std::vector<T> host) {
    const std::size_t bytes = host.size() * sizeof(T);
    DeviceVec<T> v{std::move(host), OpsBuffer(test_gpu_ops(), bytes == 0 ? 1 : bytes)};
    test_gpu_ops().upload(v.dev.data(), v.host.data(), bytes);
    return v;
  }
  // n device elements, each `fill` (a NaN for outputs an op must overwrite).
  template <class T>
  static DeviceVec<T> filled(std::size_t n, T fill = T{}) {
    return up(std::vector<T>(n, fill));
  }
  // The device copy's current contents.
  template <class T>
  static std::vector<T> down(const DeviceVec<T>& v) {
    std::vector<T> out(v.host.size());
    test_gpu_ops().download(out.data(), v.dev.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  ThreadPool pool_;
  std::unique_ptr<Ops> cpu_;
};

}  // namespace stratum::test
