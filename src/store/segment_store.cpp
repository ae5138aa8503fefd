// RamSegmentStore; see segment_store.h and Note [acquire/release].
#include "store/segment_store.h"

#include "stratum/error.h"

namespace stratum {

RamSegmentStore::RamSegmentStore(const ParamLayout& layout)
    : layout_(layout),
      buffers_(static_cast<std::size_t>(layout.segment_count()) * kSegmentKindCount),
      holds_(buffers_.size(), 0) {}

float* RamSegmentStore::acquire(int segment, SegmentKind kind, Access) {
  STRATUM_ASSERT(segment >= 0 && segment < layout_.segment_count());
  const std::size_t index = static_cast<std::size_t>(segment) * kSegmentKindCount + static_cast<int>(kind);
  AlignedBuffer& buffer = buffers_[index];
  if (buffer.data() == nullptr) {
    buffer = AlignedBuffer(layout_.segments()[segment].size_bytes());
    resident_bytes_ += buffer.size_bytes();
  }
  ++holds_[index];
  return buffer.as_f32();
}

void RamSegmentStore::release(int segment, SegmentKind kind) {
  const std::size_t index = static_cast<std::size_t>(segment) * kSegmentKindCount + static_cast<int>(kind);
  STRATUM_ASSERT(holds_[index] > 0);
  --holds_[index];
}

}  // namespace stratum
