// AlignedBuffer's mappings (Note [huge-page-aligned buffers] in core/aligned_buffer.cpp): large
// buffers start on a 2 MiB boundary, are zeroed, and keep their contents and alignment when resized.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/aligned_buffer.h"

namespace stratum {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uintptr_t kHuge = 2 * kMiB;

std::uintptr_t address(const AlignedBuffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); }

void fill(AlignedBuffer& b, std::size_t bytes, unsigned char seed) {
  auto* p = static_cast<unsigned char*>(b.data());
  for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(seed + i * 7);
}

bool holds(const AlignedBuffer& b, std::size_t bytes, unsigned char seed) {
  const auto* p = static_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i < bytes; ++i)
    if (p[i] != static_cast<unsigned char>(seed + i * 7)) return false;
  return true;
}

bool zero(const AlignedBuffer& b, std::size_t from, std::size_t to) {
  const auto* p = static_cast<const unsigned char*>(b.data());
  for (std::size_t i = from; i < to; ++i)
    if (p[i] != 0) return false;
  return true;
}

TEST(AlignedBuffer, LargeBuffersStartOnAHugePageBoundaryZeroed) {
  // 2 MiB, an odd size past it, GPT-2 small's vocabulary block (just under 2 MiB) and 1.5 MiB.
  for (const std::size_t bytes : {2 * kMiB, 5 * kMiB + 123, std::size_t{679} * 768 * 4, 3 * kMiB / 2}) {
    AlignedBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(address(b) % AlignedBuffer::kAlignmentBytes, 0u) << bytes;
    if (bytes >= 2 * kMiB - bytes / 64) {
      EXPECT_EQ(address(b) % kHuge, 0u) << bytes;
    }
    EXPECT_TRUE(zero(b, 0, bytes)) << bytes;
    fill(b, bytes, 3);  // every byte is writable
    EXPECT_TRUE(holds(b, bytes, 3)) << bytes;
  }
}

TEST(AlignedBuffer, ResizeKeepsThePagesAndTheAlignment) {
  AlignedBuffer b(3 * kMiB);
  fill(b, 3 * kMiB, 11);
  ASSERT_TRUE(b.resize(9 * kMiB + 4096 * 3));  // grows: moved onto an aligned range
  EXPECT_EQ(address(b) % kHuge, 0u);
  EXPECT_TRUE(holds(b, 3 * kMiB, 11));
  EXPECT_TRUE(zero(b, 3 * kMiB, 9 * kMiB + 4096 * 3));
  fill(b, b.size_bytes(), 5);
  const std::uintptr_t before = address(b);
  ASSERT_TRUE(b.resize(5 * kMiB / 2));  // shrinks in place
  EXPECT_EQ(address(b), before);
  EXPECT_TRUE(holds(b, 5 * kMiB / 2, 5));
  ASSERT_TRUE(b.resize(3 * kMiB / 2));  // below 2 MiB, still mapped
  EXPECT_TRUE(holds(b, 3 * kMiB / 2, 5));
  ASSERT_TRUE(b.resize(6 * kMiB));  // grows from a range too small for a huge page
  EXPECT_EQ(address(b) % kHuge, 0u);
  EXPECT_TRUE(holds(b, 3 * kMiB / 2, 5));
  EXPECT_TRUE(zero(b, 3 * kMiB / 2, 6 * kMiB));
  EXPECT_FALSE(b.resize(4096));  // to the heap: a new buffer
  EXPECT_EQ(b.size_bytes(), 4096u);
}

}  // namespace
}  // namespace stratum
