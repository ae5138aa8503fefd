// Memory an Ops computes in, owned: RAM for the CPU backend, device memory for CUDA (Ops::
// memory_alloc). Model and exec code allocate every buffer an op reads or writes through it, so
// the same code runs on either backend (Note [ops seam]). Zero-filled, at least 64-byte aligned,
// move-only. Does not copy between host and device (Ops::upload / download do).
#pragma once

#include <cstddef>
#include <utility>

#include "core/aligned_buffer.h"
#include "ops/ops.h"

namespace stratum {

class OpsBuffer {
 public:
  OpsBuffer() = default;
  OpsBuffer(const Ops& ops, std::size_t bytes) : ops_(&ops), bytes_(bytes) {
    if (bytes > 0) data_ = ops.memory_alloc(bytes);
  }
  // Made and given back in the compute queue's order (Note [queued frees] in ops/ops.h).
  static OpsBuffer queued(const Ops& ops, std::size_t bytes) {
    OpsBuffer b;
    b.ops_ = &ops;
    b.bytes_ = bytes;
    b.queued_ = true;
    if (bytes > 0) b.data_ = ops.memory_alloc_queued(bytes);
    return b;
  }
  ~OpsBuffer() {
    if (data_ == nullptr) return;
    if (queued_) ops_->memory_free_queued(data_, bytes_);
    else ops_->memory_free(data_, bytes_);
  }
  OpsBuffer(OpsBuffer&& o) noexcept
      : ops_(o.ops_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), queued_(o.queued_) {}
  OpsBuffer& operator=(OpsBuffer&& o) noexcept {
    if (this != &o) {
      OpsBuffer dead(std::move(*this));
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      queued_ = o.queued_;
    }
    return *this;
  }
  OpsBuffer(const OpsBuffer&) = delete;
  OpsBuffer& operator=(const OpsBuffer&) = delete;

  void* data() const { return data_; }
  float* as_f32() const { return static_cast<float*>(data_); }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t size_bytes() const { return bytes_; }

 private:
  const Ops* ops_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool queued_ = false;
};

// An event of an Ops (Note [ops transfers] in ops/ops.h), owned; null on a backend without
// queues. Move-only.
class OpsEvent {
 public:
  OpsEvent() = default;
  explicit OpsEvent(const Ops& ops) : ops_(&ops), event_(ops.event_create()) {}
  ~OpsEvent() {
    if (event_ != nullptr) ops_->event_destroy(event_);
  }
  OpsEvent(OpsEvent&& o) noexcept : ops_(o.ops_), event_(std::exchange(o.event_, nullptr)) {}
  OpsEvent& operator=(OpsEvent&& o) noexcept {
    if (this != &o) {
      OpsEvent dead(std::move(*this));
      ops_ = o.ops_;
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  OpsEvent(const OpsEvent&) = delete;
  OpsEvent& operator=(const OpsEvent&) = delete;
  void* get() const { return event_; }

 private:
  const Ops* ops_ = nullptr;
  void* event_ = nullptr;
};

// aligned_buffer_carve's slices (core/aligned_buffer.h) in one OpsBuffer of `ops`.
inline OpsBuffer ops_buffer_carve(const Ops& ops, const CarveSlices& slices) {
  OpsBuffer buffer(ops, aligned_buffer_carve_bytes(slices));
  aligned_carve_into(slices, buffer.as_f32());
  return buffer;
}

}  // namespace stratum
