// RamSegmentStore; see segment_store.h and Note [acquire/release].
#include "store/segment_store.h"

#include "stratum/error.h"

namespace stratum {

RamSegmentStore::RamSegmentStore(UnitTable units)
    : SegmentStore(std::move(units)), buffers_(static_cast<std::size_t>(this->units().count())),
      holds_(buffers_.size(), 0) {}

void* RamSegmentStore::acquire_unit(int unit, Access) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATUM_ASSERT(unit >= 0 && unit < units().count());
  AlignedBuffer& buffer = buffers_[unit];
  if (buffer.data() == nullptr) {
    buffer = AlignedBuffer(units().bytes(unit));
    held_bytes_ += buffer.size_bytes();
  }
  ++holds_[unit];
  return buffer.as_f32();
}

void RamSegmentStore::release_unit(int unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATUM_ASSERT(holds_[unit] > 0);
  --holds_[unit];
}

StoreStats RamSegmentStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StoreStats s;
  s.held_bytes = held_bytes_;
  s.peak_held_bytes = held_bytes_;
  return s;
}

SegmentChunksHold::SegmentChunksHold(SegmentStore& store, int segment, SegmentKind kind, Access access)
    : store_(&store), layout_(&store.units().layout().segments()[segment]) {
  const int count = store.units().chunk_count(segment, kind);
  units_.reserve(static_cast<std::size_t>(count));
  chunks_.reserve(static_cast<std::size_t>(count));
  try {
    for (int c = 0; c < count; ++c) {
      const int unit = store.units().index(segment, kind, c);
      views_.push_back(store.acquire_view(unit, access));
      f32_ = f32_ && views_.back().dtype() == DType::F32;
      chunks_.push_back(static_cast<float*>(views_.back().data()));
      units_.push_back(unit);
    }
  } catch (...) {
    release();
    throw;
  }
}

void SegmentChunksHold::release() {
  while (!units_.empty()) {
    store_->release_unit(units_.back());
    units_.pop_back();
  }
}

}  // namespace stratum
