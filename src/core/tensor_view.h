// A typed, non-owning view of tensor storage (Note [typed views]): pointer, element type, number
// of elements, shape and which memory it lives in. Store units and weights travel as views, so
// bf16 storage is never handed out as float* (f32() and bf16() check the type), and a device tier
// can hand out device memory that host code cannot mistake for RAM. Does not own, allocate or copy.
// Note [typed views]: a store unit is a flat run of elements (its count includes the padding to
// 4 KiB); the layout (ParamLayout's TensorSlot) says where each tensor starts in a unit and its
// shape. slice() cuts a flat tensor out of a unit, matrix() gives it its (rows, cols) shape, and
// the code that multiplies by a weight checks that shape against the one it expects
// (Linear::nt). Rank 1 or 2: a weight is at most a matrix here.
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
  // Shape: rank 1 (elements()) unless matrix() gave it rows x cols.
  int rank() const { return rows_ == 0 ? 1 : 2; }
  std::size_t rows() const { return rows_ == 0 ? elements_ : rows_; }
  std::size_t cols() const { return rows_ == 0 ? 1 : cols_; }

  // The storage as fp32 / bf16 host memory; asserts that it is.
  float* f32() const {
    STRATUM_ASSERT(dtype_ == DType::F32 && memory_ == MemoryKind::Host);
    return static_cast<float*>(data_);
  }
  std::uint16_t* bf16() const {
    STRATUM_ASSERT(dtype_ == DType::BF16 && memory_ == MemoryKind::Host);
    return static_cast<std::uint16_t*>(data_);
  }
  // Elements [offset, offset + n), rank 1.
  TensorView slice(std::size_t offset, std::size_t n) const {
    STRATUM_ASSERT(offset + n <= elements_);
    return TensorView(static_cast<char*>(data_) + offset * dtype_size_bytes(dtype_), dtype_, n, memory_);
  }
  // The first rows * cols elements as a row-major rows x cols matrix (asserts they exist).
  TensorView matrix(std::size_t rows, std::size_t cols) const {
    STRATUM_ASSERT(rows >= 1 && cols >= 1 && rows * cols <= elements_);
    TensorView m(data_, dtype_, rows * cols, memory_);
    m.rows_ = rows;
    m.cols_ = cols;
    return m;
  }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  std::size_t elements_ = 0;
  MemoryKind memory_ = MemoryKind::Host;
  std::size_t rows_ = 0, cols_ = 0;  // rank 2 when rows_ > 0
};

}  // namespace stratum
