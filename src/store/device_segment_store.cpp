// DeviceSegmentStore; see device_segment_store.h and Note [device tier].
#include "store/device_segment_store.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "stratum/error.h"

namespace stratum {

DeviceSegmentStore::DeviceSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops, std::size_t budget_bytes)
    : SegmentStore(host.units()), host_(host), ops_(std::move(ops)), budget_bytes_(budget_bytes),
      entries_(static_cast<std::size_t>(units().count())), policy_(units().count()),
      training_thread_(std::this_thread::get_id()) {
  totals_.budget_bytes = budget_bytes;
}

bool DeviceSegmentStore::persistent(SegmentKind kind) {
  return kind == SegmentKind::Params || kind == SegmentKind::AdamM || kind == SegmentKind::AdamV;
}

// Exact fit from the pool, else a new buffer (zero-filled by Ops::memory_alloc), dropping pool
// buffers first when the budget needs their room.
OpsBuffer DeviceSegmentStore::buffer_take(std::size_t bytes, bool* zeroed) {
  for (std::size_t i = 0; i < free_buffers_.size(); ++i) {
    if (free_buffers_[i].size_bytes() != bytes) continue;
    OpsBuffer b = std::move(free_buffers_[i]);
    free_buffers_.erase(free_buffers_.begin() + static_cast<std::ptrdiff_t>(i));
    free_bytes_ -= bytes;
    *zeroed = false;
    return b;
  }
  while (budget_bytes_ > 0 && held_bytes_ + bytes > budget_bytes_) {
    STRATUM_ASSERT(!free_buffers_.empty());  // space_make() ran first: in use + bytes fits
    held_bytes_ -= free_buffers_.back().size_bytes();
    free_bytes_ -= free_buffers_.back().size_bytes();
    free_buffers_.pop_back();
  }
  OpsBuffer b(*ops_, bytes);
  held_bytes_ += bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  *zeroed = true;
  return b;
}

void DeviceSegmentStore::upload(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  const void* src = host_.acquire_unit(unit, Access::Read);
  ops_->upload(entries_[unit].buffer.data(), src, units().bytes(unit));
  host_.release_unit(unit);
  totals_.read_bytes += units().bytes(unit);
  if (trace_ != nullptr) trace_->span(TraceRecorder::kRead, "device", units().name(unit), t0, std::chrono::steady_clock::now());
}

void DeviceSegmentStore::download(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  Entry& e = entries_[unit];
  void* dst = host_.acquire_unit(unit, Access::Overwrite);
  ops_->download(dst, e.buffer.data(), units().bytes(unit));
  host_.release_unit(unit);
  e.on_host = true;
  e.dirty = false;
  totals_.write_bytes += units().bytes(unit);
  if (trace_ != nullptr) trace_->span(TraceRecorder::kWrite, "device", units().name(unit), t0, std::chrono::steady_clock::now());
}

void DeviceSegmentStore::evict(int unit) {
  Entry& e = entries_[unit];
  if (e.dirty && !dead(unit)) download(unit);
  if (e.dirty) e.on_host = false;  // dead data: its next use overwrites it
  e.dirty = false;
  free_bytes_ += e.buffer.size_bytes();
  free_buffers_.push_back(std::move(e.buffer));
}

void DeviceSegmentStore::space_make(Lock& lock, std::size_t bytes) {
  if (budget_bytes_ == 0) return;
  if (bytes > budget_bytes_)
    throw BugError(detail::concat("[store] bug: one unit (", bytes, " bytes) exceeds the device budget of ", budget_bytes_,
                                  "; the minimum-budget check should have refused it"));
  const bool training = std::this_thread::get_id() == training_thread_;
  while (held_bytes_ - free_bytes_ + bytes > budget_bytes_) {
    const int victim = policy_.victim(-1, [&](int u) {
      const Entry& e = entries_[u];
      return e.buffer.data() != nullptr && e.holds == 0;
    });
    if (victim >= 0) {
      evict(victim);
      continue;
    }
    if ((training ? holds_other_ : holds_training_) > 0) {
      released_.wait(lock);
      continue;
    }
    throw BugError(detail::concat("[store] bug: the device budget of ", budget_bytes_, " bytes cannot hold the units in use (",
                                  held_bytes_ - free_bytes_, " bytes, ", bytes,
                                  " more needed); the minimum-budget check should have refused it"));
  }
}

void* DeviceSegmentStore::acquire_unit(int unit, Access access) {
  STRATUM_ASSERT(unit >= 0 && unit < units().count());
  Lock lock(mutex_);
  const bool training = std::this_thread::get_id() == training_thread_;
  Entry& e = entries_[unit];
  if (e.buffer.data() == nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes = units().bytes(unit);
    space_make(lock, bytes);
    if (e.buffer.data() == nullptr) {  // else the other thread loaded it while this one waited
      bool zeroed = false;
      e.buffer = buffer_take(bytes, &zeroed);
      e.dirty = false;
      if (access != Access::Overwrite && access != Access::Scratch) {
        if (e.on_host) upload(unit);
        else if (!zeroed) ops_->fill(e.buffer.as_f32(), 0.0f, bytes / sizeof(float));  // never written: zeros
      }
    }
    if (training) totals_.stall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  ++e.holds;
  ++(training ? holds_training_ : holds_other_);
  policy_.used(unit);
  if (access == Access::Scratch) e.dirty = false;  // dead before and after: nothing to write back
  else if (access != Access::Read) e.dirty = true;
  return e.buffer.data();
}

void DeviceSegmentStore::release_unit(int unit) {
  Lock lock(mutex_);
  Entry& e = entries_[unit];
  STRATUM_ASSERT(e.holds > 0);
  --e.holds;
  --(std::this_thread::get_id() == training_thread_ ? holds_training_ : holds_other_);
  released_.notify_all();
}

void DeviceSegmentStore::schedule_set(const StepSchedule* schedule) {
  {
    Lock lock(mutex_);
    policy_.schedule_set(schedule);
  }
  host_.schedule_set(schedule);
}

void DeviceSegmentStore::schedule_at(int group) {
  {
    Lock lock(mutex_);
    policy_.at(group);
  }
  host_.schedule_at(group);
}

// A pinned unit is needed by a consumer behind the schedule position: live on both tiers.
void DeviceSegmentStore::unit_pin(int unit, int delta) {
  {
    Lock lock(mutex_);
    entries_[unit].pins += delta;
    STRATUM_ASSERT(entries_[unit].pins >= 0);
  }
  host_.unit_pin(unit, delta);
}

void DeviceSegmentStore::trace_set(TraceRecorder* trace) {
  trace_ = trace;
  host_.trace_set(trace);
}

StoreStats DeviceSegmentStore::stats() const {
  Lock lock(mutex_);
  StoreStats s = totals_;
  s.held_bytes = held_bytes_;
  s.peak_held_bytes = peak_held_bytes_;
  return s;
}

void DeviceSegmentStore::stats_reset_peak() {
  Lock lock(mutex_);
  peak_held_bytes_ = held_bytes_;
}

void DeviceSegmentStore::push() {
  Lock lock(mutex_);
  for (int u = 0; u < units().count(); ++u) {
    if (!persistent(units().kind(u))) continue;
    Entry& e = entries_[u];
    e.on_host = true;
    e.dirty = false;
    if (e.buffer.data() == nullptr) {
      if (budget_bytes_ > 0) continue;  // loaded from the host when first acquired
      bool zeroed = false;
      e.buffer = buffer_take(units().bytes(u), &zeroed);
    }
    upload(u);
  }
}

void DeviceSegmentStore::pull() {
  Lock lock(mutex_);
  for (int u = 0; u < units().count(); ++u)
    if (persistent(units().kind(u)) && entries_[u].buffer.data() != nullptr && entries_[u].dirty) download(u);
}

}  // namespace stratum
