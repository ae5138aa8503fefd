// A typed, non-owning view of tensor storage (Note [typed views]): pointer, element type, number
// of elements and which memory it lives in. Store units and weights travel as views, so bf16
// storage is never handed out as float* (f32() and bf16() check the type), and a device tier can
// hand out device memory that host code cannot mistake for RAM. Does not own, allocate or copy.
// Note [typed views]: a view's elements are its storage (a store unit's count includes the
// padding to 4 KiB); shapes stay with the layout (ParamLayout's TensorSlot) that says where each
// tensor starts in a unit. slice() cuts a tensor out of a unit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "stratum/error.h"

namespace stratum {

enum class MemoryKind { Host, Device };

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, std::size_t elements, MemoryKind memory = MemoryKind::Host)
      : data_(data), dtype_(dtype), elements_(elements), memory_(memory) {}
  // An fp32 host view of n floats.
  static TensorView of(float* data, std::size_t n) { return TensorView(data, DType::F32, n); }

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  std::size_t elements() const { return elements_; }
  MemoryKind memory() const { return memory_; }
  std::size_t size_bytes() const { return elements_ * dtype_size_bytes(dtype_); }

  // The storage as fp32 / bf16 host memory; asserts that it is.
  float* f32() const {
    STRATUM_ASSERT(dtype_ == DType::F32 && memory_ == MemoryKind::Host);
    return static_cast<float*>(data_);
  }
  std::uint16_t* bf16() const {
    STRATUM_ASSERT(dtype_ == DType::BF16 && memory_ == MemoryKind::Host);
    return static_cast<std::uint16_t*>(data_);
  }
  // Elements [offset, offset + n).
  TensorView slice(std::size_t offset, std::size_t n) const {
    STRATUM_ASSERT(offset + n <= elements_);
    return TensorView(static_cast<char*>(data_) + offset * dtype_size_bytes(dtype_), dtype_, n, memory_);
  }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  std::size_t elements_ = 0;
  MemoryKind memory_ = MemoryKind::Host;
};

}  // namespace stratum
