// MirrorSegmentStore; see mirror_segment_store.h.
#include "store/mirror_segment_store.h"

#include <utility>

#include "stratum/error.h"

namespace stratum {

MirrorSegmentStore::MirrorSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops)
    : SegmentStore(host.units()), host_(host), ops_(std::move(ops)), buffers_(static_cast<std::size_t>(units().count())),
      holds_(buffers_.size(), 0) {}

bool MirrorSegmentStore::persistent(SegmentKind kind) {
  return kind == SegmentKind::Params || kind == SegmentKind::AdamM || kind == SegmentKind::AdamV;
}

OpsBuffer& MirrorSegmentStore::buffer(int unit) {
  STRATUM_ASSERT(unit >= 0 && unit < units().count());
  OpsBuffer& b = buffers_[unit];
  if (b.data() == nullptr) {
    b = OpsBuffer(*ops_, units().bytes(unit));
    held_bytes_ += b.size_bytes();
  }
  return b;
}

void* MirrorSegmentStore::acquire_unit(int unit, Access) {
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = buffer(unit).data();
  ++holds_[unit];
  return p;
}

void MirrorSegmentStore::release_unit(int unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATUM_ASSERT(holds_[unit] > 0);
  --holds_[unit];
}

StoreStats MirrorSegmentStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StoreStats s;
  s.held_bytes = held_bytes_;
  s.peak_held_bytes = held_bytes_;
  return s;
}

void MirrorSegmentStore::push() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int u = 0; u < units().count(); ++u) {
    if (!persistent(units().kind(u))) continue;
    const void* src = host_.acquire_unit(u, Access::Read);
    ops_->upload(buffer(u).data(), src, units().bytes(u));
    host_.release_unit(u);
  }
}

void MirrorSegmentStore::pull() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int u = 0; u < units().count(); ++u) {
    if (!persistent(units().kind(u)) || buffers_[u].data() == nullptr) continue;
    void* dst = host_.acquire_unit(u, Access::Overwrite);
    ops_->download(dst, buffers_[u].data(), units().bytes(u));
    host_.release_unit(u);
  }
}

}  // namespace stratum
