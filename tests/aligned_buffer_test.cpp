// AlignedBuffer's mappings (Note [huge-page-aligned buffers] in core/aligned_buffer.cpp): large
// buffers start on a 2 MiB boundary, are zeroed, and keep their contents and alignment when resized.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

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

// Note [moving pages]: whole 2 MiB blocks pass between buffers with their contents (the pages
// themselves move: nothing is copied or zeroed), donors shrink in place, and what no donor gives
// is fresh zeroed pages.
bool holds_at(const AlignedBuffer& b, std::size_t from, std::size_t to, unsigned char seed, std::size_t seed_at) {
  const auto* p = static_cast<const unsigned char*>(b.data());
  for (std::size_t i = from; i < to; ++i)
    if (p[i] != static_cast<unsigned char>(seed + (i - from + seed_at) * 7)) return false;
  return true;
}

TEST(AlignedBuffer, WholeBlocksMoveBetweenBuffersWithTheirPages) {
  AlignedBuffer a(6 * kMiB);
  ASSERT_TRUE(a.whole_blocks());
  fill(a, 6 * kMiB, 1);
  const std::uintptr_t at = address(a);
  AlignedBuffer tail = a.split(2 * kMiB);  // no system call: the pages stay where they are
  EXPECT_EQ(address(a), at);
  EXPECT_EQ(a.size_bytes(), 2 * kMiB);
  EXPECT_EQ(address(tail), at + 2 * kMiB);
  ASSERT_TRUE(tail.whole_blocks());
  EXPECT_TRUE(holds_at(tail, 0, 4 * kMiB, 1, 2 * kMiB));

  AlignedBuffer b(4 * kMiB);
  fill(b, 4 * kMiB, 9);
  AlignedBuffer small(kMiB);  // not whole blocks: passed over
  std::vector<AlignedBuffer*> donors = {&small, &tail, &b};
  EXPECT_EQ(a.grow(10 * kMiB, donors), 8 * kMiB);
  EXPECT_EQ(a.size_bytes(), 10 * kMiB);
  EXPECT_EQ(address(a) % kHuge, 0u);
  EXPECT_TRUE(holds(a, 2 * kMiB, 1));                       // its own pages first
  EXPECT_TRUE(holds_at(a, 2 * kMiB, 6 * kMiB, 1, 2 * kMiB));  // then the tail's
  EXPECT_TRUE(holds_at(a, 6 * kMiB, 10 * kMiB, 9, 0));       // then b's
  EXPECT_EQ(tail.data(), nullptr);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(small.size_bytes(), kMiB);

  AlignedBuffer c(6 * kMiB);  // gives only its last blocks, shrinking in place
  fill(c, 6 * kMiB, 4);
  const std::uintptr_t c_at = address(c);
  AlignedBuffer d(2 * kMiB);
  fill(d, 2 * kMiB, 6);
  std::vector<AlignedBuffer*> one = {&c};
  EXPECT_EQ(d.grow(6 * kMiB, one), 4 * kMiB);
  EXPECT_EQ(address(c), c_at);
  EXPECT_EQ(c.size_bytes(), 2 * kMiB);
  EXPECT_TRUE(holds(c, 2 * kMiB, 4));
  EXPECT_TRUE(holds(d, 2 * kMiB, 6));
  EXPECT_TRUE(holds_at(d, 2 * kMiB, 6 * kMiB, 4, 2 * kMiB));

  std::vector<AlignedBuffer*> short_of = {&c};  // 2 MiB given, 4 MiB fresh and zeroed
  EXPECT_EQ(d.grow(12 * kMiB, short_of), 2 * kMiB);
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_TRUE(holds_at(d, 6 * kMiB, 8 * kMiB, 4, 0));
  EXPECT_TRUE(zero(d, 8 * kMiB, 12 * kMiB));
  fill(d, 12 * kMiB, 2);  // every byte is writable, and the buffer frees as one
  EXPECT_TRUE(d.resize(4 * kMiB));  // shrinks across the mappings the moves made
  EXPECT_TRUE(holds(d, 4 * kMiB, 2));
  EXPECT_TRUE(d.resize(8 * kMiB));  // and grows again, block by block
  EXPECT_TRUE(holds(d, 4 * kMiB, 2));
  EXPECT_TRUE(zero(d, 4 * kMiB, 8 * kMiB));
}

}  // namespace
}  // namespace stratum
