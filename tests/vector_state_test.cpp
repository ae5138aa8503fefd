// Note [clean upper state] (core/hash.cpp): after a call into a library that may leave the upper
// halves of the vector registers dirty, the calling thread's state is clean again, so the SSE
// code that follows runs at full speed. Read from XINUSE (XGETBV with ECX = 1); skipped on CPUs
// without it. Also the GEMMs a step calls (OpenBLAS, oneDNN's bf16 matmul).
#include <cpuid.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/hash.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"

namespace stratum {
namespace {

unsigned xinuse() {
  unsigned lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return lo;
}

__attribute__((target("avx"))) void upper_zero() { __builtin_ia32_vzeroupper(); }

// Whether the upper halves of ymm0-15 / zmm0-15 are in use (XINUSE bits 2 and 6); none where the
// CPU cannot say: no AVX enabled by the OS, no XGETBV with ECX = 1, or a CPU that reports them in
// use right after vzeroupper (XINUSE may stay set for a component in its initial state).
std::optional<bool> upper_dirty() {
  constexpr unsigned kUpper = (1u << 2) | (1u << 6);
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return std::nullopt;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return std::nullopt;  // the OS does not save the AVX state
  if (!__get_cpuid_count(0xD, 1, &a, &b, &c, &d) || !(a & (1u << 2))) return std::nullopt;  // XGETBV ECX=1
  static const bool tracks = [] {
    upper_zero();
    return (xinuse() & kUpper) == 0;
  }();
  if (!tracks) return std::nullopt;
  return (xinuse() & kUpper) != 0;
}

#define SKIP_WITHOUT_XINUSE()                                                  \
  if (!upper_dirty().has_value()) GTEST_SKIP() << "the CPU does not report XINUSE"

TEST(VectorState, Hash64LeavesTheUpperHalvesClean) {
  SKIP_WITHOUT_XINUSE();
  std::vector<unsigned char> data(std::size_t{1} << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131);
  volatile std::uint64_t sink = hash64(data.data(), data.size());
  EXPECT_FALSE(*upper_dirty()) << "after hash64";
  Hash64Stream stream;
  stream.update(data.data(), data.size() / 2);
  EXPECT_FALSE(*upper_dirty()) << "after Hash64Stream::update";
  stream.update(data.data() + data.size() / 2, data.size() / 2);
  sink = stream.digest();
  EXPECT_FALSE(*upper_dirty()) << "after Hash64Stream::digest";
  (void)sink;
}

TEST(VectorState, MatrixProductsLeaveTheUpperHalvesClean) {
  SKIP_WITHOUT_XINUSE();
  ThreadPool pool(2);
  const int n = 256;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  EXPECT_FALSE(*upper_dirty()) << "after sgemm (OpenBLAS)";
  if (bf16_onednn()) {
    sgemm_bf16(pool, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    EXPECT_FALSE(*upper_dirty()) << "after sgemm_bf16 (oneDNN)";
  }
}

}  // namespace
}  // namespace stratum
