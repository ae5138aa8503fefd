// RamSegmentStore; see segment_store.h and Note [acquire/release].
#include "store/segment_store.h"

#include <algorithm>

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

GroupHolds::GroupHolds(SegmentStore& store, const UnitUse* uses, std::size_t count) : store_(&store) {
  units_.reserve(count);
  data_.reserve(count);
  try {
    for (std::size_t i = 0; i < count; ++i) {
      const TensorView view = store.acquire_view(uses[i].unit, uses[i].access);
      units_.push_back(uses[i].unit);
      views_.push_back(view);
      data_.push_back(view.dtype() == DType::F32 ? static_cast<float*>(view.data()) : nullptr);
    }
  } catch (...) {
    release();
    throw;
  }
}

std::size_t GroupHolds::position(int unit) const {
  const auto it = std::find(units_.begin(), units_.end(), unit);
  STRATUM_ASSERT(it != units_.end());  // the schedule group lists every unit its work touches
  return static_cast<std::size_t>(it - units_.begin());
}

const TensorView& GroupHolds::view(int segment, SegmentKind kind, int chunk) const {
  return views_[position(store_->units().index(segment, kind, chunk))];
}

float* const* GroupHolds::chunks(int segment, SegmentKind kind) const {
  const UnitTable& units = store_->units();
  const std::size_t first = position(units.index(segment, kind, 0));
  const int count = units.chunk_count(segment, kind);
  for (int c = 0; c < count; ++c) {
    STRATUM_ASSERT(first + c < units_.size() && units_[first + c] == units.index(segment, kind, c) &&
                   data_[first + c] != nullptr);
  }
  return data_.data() + first;
}

const TensorView* GroupHolds::views(int segment, SegmentKind kind) const {
  const UnitTable& units = store_->units();
  const std::size_t first = position(units.index(segment, kind, 0));
  const int count = units.chunk_count(segment, kind);
  for (int c = 0; c < count; ++c)
    STRATUM_ASSERT(first + c < units_.size() && units_[first + c] == units.index(segment, kind, c));
  return views_.data() + first;
}

void GroupHolds::release() {
  while (!units_.empty()) {
    const int unit = units_.back();
    const auto discard = std::find(discards_.begin(), discards_.end(), unit);
    if (discard != discards_.end()) {
      store_->release_unit_discard(unit);
      discards_.erase(discard);
    } else {
      store_->release_unit(unit);
    }
    units_.pop_back();
    views_.pop_back();
    data_.pop_back();
  }
}

}  // namespace stratum
