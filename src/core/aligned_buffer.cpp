// AlignedBuffer: 4 KiB-aligned owning allocation; see aligned_buffer.h.
#include "core/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "stratum/error.h"

namespace stratum {

AlignedBuffer::AlignedBuffer(std::size_t size_bytes) : size_bytes_(size_bytes) {
  if (size_bytes == 0) return;
  const std::size_t capacity = align_up(size_bytes, kAlignmentBytes);
  data_ = std::aligned_alloc(kAlignmentBytes, capacity);
  STRATUM_CHECK(data_ != nullptr, "[core.memory] cannot allocate ", capacity,
                " bytes: out of memory (reduce --batch/--seq or the model size)");
  std::memset(data_, 0, capacity);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer aligned_buffer_carve(std::initializer_list<std::pair<float**, std::size_t>> slices) {
  std::size_t total = 0;
  for (const auto& s : slices) total += align_up(s.second, 16);
  AlignedBuffer buffer(total * sizeof(float));
  float* cursor = buffer.as_f32();
  for (const auto& s : slices) {
    *s.first = cursor;
    cursor += align_up(s.second, 16);
  }
  return buffer;
}

}  // namespace stratum
