// DeviceSegmentStore; see device_segment_store.h and Note [device tier].
#include "store/device_segment_store.h"
#include <cstdio>
#include <string>
#include "store/queue_span.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "stratum/error.h"

namespace stratum {

DeviceSegmentStore::DeviceSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops, std::size_t budget_bytes,
                                       int prefetch)
    : SegmentStore(host.units()), host_(host), ops_(std::move(ops)), budget_bytes_(budget_bytes),
      prefetch_depth_(prefetch), streaming_(budget_bytes > 0 && units().total_bytes() > budget_bytes),
      entries_(static_cast<std::size_t>(units().count())), pinned_(entries_.size(), nullptr),
      policy_(units().count()), training_thread_(std::this_thread::get_id()) {
  totals_.budget_bytes = budget_bytes;
}

DeviceSegmentStore::~DeviceSegmentStore() {
  try {
    Lock lock(mutex_);
    drain(lock);  // no copy may still read or write a host buffer; the host units are released
  } catch (...) {  // a failed device: nothing left to wait for
  }
  for (void* p : pinned_)
    if (p != nullptr) ops_->host_unpin(p);
}

bool DeviceSegmentStore::persistent(SegmentKind kind) {
  return kind == SegmentKind::Params || kind == SegmentKind::AdamM || kind == SegmentKind::AdamV;
}

bool DeviceSegmentStore::evictable(int unit) const {
  const Entry& e = entries_[unit];
  return e.state == State::Resident && e.holds == 0 && !e.in_flight;
}

// Exact fit from the pool, else a new buffer (zero-filled by Ops::memory_alloc on the compute
// queue, which its free event follows), dropping pool buffers first when the budget needs their room.
DeviceSegmentStore::Buffer DeviceSegmentStore::buffer_take(std::size_t bytes, bool* zeroed) {
  for (std::size_t i = 0; i < free_buffers_.size(); ++i) {
    if (free_buffers_[i].memory.size_bytes() != bytes) continue;
    Buffer b = std::move(free_buffers_[i]);
    free_buffers_.erase(free_buffers_.begin() + static_cast<std::ptrdiff_t>(i));
    free_bytes_ -= bytes;
    *zeroed = false;
    return b;
  }
  while (budget_bytes_ > 0 && held_bytes_ + bytes > budget_bytes_) {
    STRATUM_ASSERT(!free_buffers_.empty());  // space_make() ran first: in use + bytes fits
    held_bytes_ -= free_buffers_.back().memory.size_bytes();
    free_bytes_ -= free_buffers_.back().memory.size_bytes();
    free_buffers_.pop_back();
  }
  Buffer b{OpsBuffer::queued(*ops_, bytes), OpsEvent(*ops_)};  // Note [queued frees] in ops/ops.h
  ops_->event_record(b.free.get());
  held_bytes_ += bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  *zeroed = true;
  return b;
}

void DeviceSegmentStore::buffer_give(Buffer buffer) {
  ops_->event_record(buffer.free.get());  // after every use of the unit queued so far
  free_bytes_ += buffer.memory.size_bytes();
  free_buffers_.push_back(std::move(buffer));
}

void* DeviceSegmentStore::host_unit(int unit, Access access, bool* pinned) {
  void* p = host_.acquire_unit(unit, access);
  *pinned = false;
  if (ops_->host_memory() || !host_.buffers_stable()) return p;
  void*& where = pinned_[unit];
  if (where == p) {
    *pinned = true;
  } else if (where == nullptr && !pin_failed_) {
    if (ops_->host_pin(p, units().bytes(unit))) {
      where = p;
      *pinned = true;
    } else {
      pin_failed_ = true;  // out of lockable memory: the rest stays pageable
    }
  }
  return p;
}

void DeviceSegmentStore::copy_started(int unit, bool pinned) {
  Entry& e = entries_[unit];
  if (pinned) e.host_held = true;  // released when the copy has finished (reap)
  else host_.release_unit(unit);   // pageable: staged or copied already
  e.in_flight = true;
  in_flight_.push_back(unit);
}

void DeviceSegmentStore::upload_start(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  Entry& e = entries_[unit];
  bool pinned = false;
  const void* src = host_unit(unit, Access::Read, &pinned);
  if (e.done.get() == nullptr) e.done = OpsEvent(*ops_);
  {
    const QueueSpan copy(*ops_, Ops::Queue::Upload, trace_, TraceRecorder::kDeviceIn, "device", copy_name(unit));
    ops_->transfer(e.buffer.memory.data(), src, units().bytes(unit), true, e.buffer.free.get(), e.done.get());
  }
  e.loading = true;
  copy_started(unit, pinned);
  totals_.read_bytes += units().bytes(unit);
  if (trace_ != nullptr) trace_->span(TraceRecorder::kRead, "device", units().name(unit), t0, std::chrono::steady_clock::now());
}

std::string DeviceSegmentStore::copy_name(int unit) const {
  if (trace_ == nullptr) return {};
  char mib[32];
  std::snprintf(mib, sizeof mib, " (%.1f MiB)", static_cast<double>(units().bytes(unit)) / (1 << 20));
  return units().name(unit) + mib;
}

void DeviceSegmentStore::download_start(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  Entry& e = entries_[unit];
  bool pinned = false;
  void* dst = host_unit(unit, Access::Overwrite, &pinned);
  if (e.done.get() == nullptr) e.done = OpsEvent(*ops_);
  ops_->event_record(e.buffer.free.get());  // after the compute that wrote the unit
  {
    const QueueSpan copy(*ops_, Ops::Queue::Download, trace_, TraceRecorder::kDeviceOut, "device", copy_name(unit));
    ops_->transfer(dst, e.buffer.memory.data(), units().bytes(unit), false, e.buffer.free.get(), e.done.get());
  }
  e.state = State::Writing;
  e.dirty = false;
  e.on_host = true;  // current once the copy finishes; nothing reads it before (the unit is held)
  copy_started(unit, pinned);
  totals_.write_bytes += units().bytes(unit);
  if (trace_ != nullptr) trace_->span(TraceRecorder::kWrite, "device", units().name(unit), t0, std::chrono::steady_clock::now());
}

void DeviceSegmentStore::reap() {
  for (std::size_t i = 0; i < in_flight_.size();) {
    const int unit = in_flight_[i];
    Entry& e = entries_[unit];
    if (!ops_->event_done(e.done.get())) {
      ++i;
      continue;
    }
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    e.in_flight = false;
    e.loading = false;
    if (e.host_held) {
      e.host_held = false;
      host_.release_unit(unit);
    }
    if (e.state == State::Writing && e.evicting) {  // evicted, written back and not asked for since
      buffer_give(std::move(e.buffer));
      e.state = State::Absent;
    } else if (e.state == State::Writing) {  // written behind: stays, clean, until space is needed
      e.state = State::Resident;
    }
    e.evicting = false;
    released_.notify_all();
  }
}

void DeviceSegmentStore::wait_one(Lock&) {
  STRATUM_ASSERT(!in_flight_.empty());
  ops_->event_sync(entries_[in_flight_.front()].done.get());
  reap();
}

void DeviceSegmentStore::drain(Lock& lock) {
  while (!in_flight_.empty()) wait_one(lock);
}

void DeviceSegmentStore::evict(int unit) {
  Entry& e = entries_[unit];
  if (e.dirty && !policy_.dead(unit)) {
    download_start(unit);  // the buffer comes back when the copy has finished
    e.evicting = true;
    return;
  }
  if (e.dirty) e.on_host = false;  // dead data: its next use overwrites it
  e.dirty = false;
  buffer_give(std::move(e.buffer));
  e.state = State::Absent;
}

bool DeviceSegmentStore::space_make(Lock& lock, std::size_t bytes, long beyond, bool block, int unit) {
  if (budget_bytes_ == 0) return true;
  if (bytes > budget_bytes_)
    throw BugError(detail::concat("[store] bug: one unit (", bytes, " bytes) exceeds the device budget of ", budget_bytes_,
                                  "; the minimum-budget check should have refused it"));
  const bool training = std::this_thread::get_id() == training_thread_;
  for (;;) {
    reap();
    // Note [room for a unit once] (store/tiered_segment_store.h): the other thread brought it in.
    if (unit >= 0 && entries_[unit].state != State::Absent) return true;
    if (held_bytes_ - free_bytes_ + bytes <= budget_bytes_) return true;
    const int victim = policy_.victim(beyond, [&](int u) { return evictable(u); });
    if (victim >= 0) {
      evict(victim);
      continue;
    }
    if (!block) return false;
    if (!in_flight_.empty()) {
      wait_one(lock);
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
  reap();
  Entry& e = entries_[unit];
  STRATUM_ASSERT(!host_optimizer_ || (units().kind(unit) != SegmentKind::AdamM && units().kind(unit) != SegmentKind::AdamV));
  if (e.host_taken) {  // the optimizer worker is updating the host's copy (Note [host optimizer])
    released_.wait(lock, [&] { return !e.host_taken; });
    reap();
  }
  if (e.state == State::Writing) {  // asked for again while written back: keep it
    e.state = State::Resident;
    e.evicting = false;
    if (access != Access::Read) ops_->compute_wait(e.done.get());  // no change before the copy has read it
  }
  if (e.state == State::Absent) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes = units().bytes(unit);
    space_make(lock, bytes, -1, true, unit);
    if (e.state == State::Absent) {  // else the other thread brought it in while this one waited
      bool zeroed = false;
      e.buffer = buffer_take(bytes, &zeroed);
      e.state = State::Resident;
      e.dirty = false;
      if (access != Access::Overwrite && access != Access::Scratch) {
        if (e.on_host) upload_start(unit);
        else if (!zeroed) ops_->fill(e.buffer.memory.as_f32(), 0.0f, bytes / sizeof(float));  // never written: zeros
      }
    }
    if (training) {
      const auto t1 = std::chrono::steady_clock::now();
      totals_.stall_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      if (trace_ != nullptr && t1 - t0 > std::chrono::microseconds(100))
        trace_->span(TraceRecorder::kCompute, "stall", "device: wait for " + units().name(unit), t0, t1);
    }
  }
  if (e.loading) ops_->compute_wait(e.done.get());  // the compute that uses it follows its upload
  ++e.holds;
  ++(training ? holds_training_ : holds_other_);
  policy_.used(unit);
  if (access == Access::Scratch) e.dirty = false;  // dead before and after: nothing to write back
  else if (access != Access::Read) e.dirty = true;
  return e.buffer.memory.data();
}

void DeviceSegmentStore::release_unit(int unit) {
  Lock lock(mutex_);
  Entry& e = entries_[unit];
  STRATUM_ASSERT(e.holds > 0);
  --e.holds;
  --(std::this_thread::get_id() == training_thread_ ? holds_training_ : holds_other_);
  // Note [write-behind] (store/eviction_policy.h): written back now, off the critical path.
  if (streaming_ && e.holds == 0 && e.state == State::Resident && e.dirty && !e.in_flight &&
      policy_.write_behind(unit, prefetch_depth_))
    download_start(unit);
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
  host_.schedule_at(group);  // the host tier's prefetch from NVMe first: the device's reads from it
  Lock lock(mutex_);
  prefetch(lock);
}

void DeviceSegmentStore::schedule_refresh() {
  host_.schedule_refresh();
  Lock lock(mutex_);
  prefetch(lock);
}

// Note [prefetch window] on the device: the current group's and the next prefetch_depth_ groups'
// units that hold data are uploaded in schedule order as far as the budget allows without
// evicting anything needed sooner.
void DeviceSegmentStore::prefetch(Lock& lock) {
  reap();
  const StepSchedule* schedule = policy_.schedule();
  if (schedule == nullptr || budget_bytes_ == 0) return;
  const int group = policy_.now();
  const int groups = schedule->group_count();
  for (int d = 0, window = 0; window <= prefetch_depth_ && d < groups; ++d) {
    const int g = (group + d) % groups;
    if (d > 0 && schedule->group_optional(g)) continue;  // Note [optional groups]
    ++window;
    if (host_optimizer_ && schedule->group_work(g) == GroupWork::Optimizer) continue;  // runs on the host
    for (const UnitUse& use : schedule->group(g)) {
      if (d == 0 && policy_.used_now(use.unit)) continue;
      Entry& e = entries_[use.unit];
      if (e.state != State::Absent || !e.on_host || e.host_taken || use.access == Access::Overwrite ||
          use.access == Access::Scratch || dead_next(use.unit))
        continue;
      if (!space_make(lock, units().bytes(use.unit), d, false)) return;
      if (e.state != State::Absent) continue;
      bool zeroed = false;
      e.buffer = buffer_take(units().bytes(use.unit), &zeroed);
      e.state = State::Resident;
      e.dirty = false;
      upload_start(use.unit);
    }
  }
}

// Note [no upload of dead data]: a unit read in the window whose next use overwrites it (a
// layer's output, read by the next layer's forward) holds nothing worth uploading. The prefetch
// uploaded it anyway, and the group that overwrites it then waited for that upload, queued
// behind everything prefetched before it: the ~1.1B Llama's forward under --gpu-mem-budget
// 4300M waited 15-17 ms before each layer (its next layer's update set, 704 MiB, went first).
bool DeviceSegmentStore::dead_next(int unit) const {
  if (policy_.pinned(unit)) return false;  // a consumer behind the position still reads it
  const Access next = policy_.next_access(unit);
  return next == Access::Overwrite || next == Access::Scratch;
}

// A pinned unit is needed by a consumer behind the schedule position: live on both tiers.
void DeviceSegmentStore::unit_pin(int unit, int group, int delta) {
  {
    Lock lock(mutex_);
    policy_.pin(unit, group, delta);
  }
  host_.unit_pin(unit, group, delta);
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
  drain(lock);
  for (int u = 0; u < units().count(); ++u) {
    if (!persistent(units().kind(u))) continue;
    Entry& e = entries_[u];
    e.on_host = true;
    if (host_optimizer_ && units().kind(u) != SegmentKind::Params) continue;  // the moments stay on the host
    e.dirty = false;
    if (e.state == State::Absent) {
      if (budget_bytes_ > 0) continue;  // uploaded when the schedule needs it
      bool zeroed = false;
      e.buffer = buffer_take(units().bytes(u), &zeroed);
      e.state = State::Resident;
    }
    const void* src = host_.acquire_unit(u, Access::Read);
    ops_->upload(e.buffer.memory.data(), src, units().bytes(u));
    host_.release_unit(u);
    totals_.read_bytes += units().bytes(u);
  }
}

void DeviceSegmentStore::pull() {
  Lock lock(mutex_);
  drain(lock);
  for (int u = 0; u < units().count(); ++u) {
    Entry& e = entries_[u];
    if (!persistent(units().kind(u)) || e.state != State::Resident || !e.dirty) continue;
    void* dst = host_.acquire_unit(u, Access::Overwrite);
    ops_->download(dst, e.buffer.memory.data(), units().bytes(u));
    host_.release_unit(u);
    e.dirty = false;
    e.on_host = true;
    totals_.write_bytes += units().bytes(u);
  }
}

bool DeviceSegmentStore::buffers_stable() const {
  Lock lock(mutex_);
  return budget_bytes_ == 0 && !host_optimizer_;
}

// Note [host optimizer].
void DeviceSegmentStore::optimizer_on_host() {
  Lock lock(mutex_);
  host_optimizer_ = true;
}

void DeviceSegmentStore::host_take(int unit) {
  Lock lock(mutex_);
  Entry& e = entries_[unit];
  released_.wait(lock, [&] { return e.holds == 0 && !e.host_taken; });
  e.host_taken = true;  // no upload starts and no acquire returns it from now on
  reap();
  if (e.state == State::Resident && e.dirty) download_start(unit);
  while (e.in_flight) {  // its copy (this download, or a write-behind) finishes with the store unlocked
    void* const done = e.done.get();
    lock.unlock();
    ops_->event_sync(done);
    lock.lock();
    reap();
  }
}

void DeviceSegmentStore::host_give(int unit, bool changed) {
  Lock lock(mutex_);
  Entry& e = entries_[unit];
  STRATUM_ASSERT(e.host_taken && e.holds == 0 && !e.in_flight);
  e.host_taken = false;
  if (changed) {
    e.on_host = true;
    if (e.state == State::Resident) {  // stale now: the next use uploads the host's copy
      STRATUM_ASSERT(!e.dirty);
      buffer_give(std::move(e.buffer));
      e.state = State::Absent;
    }
  }
  released_.notify_all();
}

}  // namespace stratum
