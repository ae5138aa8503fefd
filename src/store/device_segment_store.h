// The device tier: units of a host store (RAM, or RAM over NVMe) held in the memory of an Ops
// (Ops::memory_alloc; device memory for CUDA) for the executor to compute on. Weights I/O,
// initialisation, hashing and checkpoints keep using the host store; the trainer moves the state
// that outlives a step (parameters and AdamW moments) across with push() after loading and pull()
// before reading it.
//
// Note [device tier]: with no budget every unit stays in device memory once touched (the whole
// state fits). With a budget (--gpu-mem-budget less the executor's buffers) the device holds what
// fits and the host store holds the rest, as the RAM tier does over the offload dir:
//   - a miss acquires the unit from the host store (which may load it from NVMe) and uploads it;
//     a unit the host never received reads as zeros, an Overwrite/Scratch acquire copies nothing;
//   - space is made by the host tier's rule (Note [schedule eviction]): the resident unit with the
//     farthest next use in the step schedule goes; a dirty one is downloaded into the host store
//     first unless its next use overwrites it (dead gradients and activations are dropped);
//   - buffers of evicted units are kept for the next unit of the same size (a device free waits
//     for the queue) and dropped only when the budget needs the room;
//   - copies are queued on the Ops' one stream (Ops::upload / download), so the compute that
//     follows sees them in order; the bits are those of the whole state on the device, for every
//     budget. (The copies do not yet overlap compute: docs/architecture.md, "How a CUDA tier
//     plugs in".)
// Thread-safe (the CPU backend's optimizer worker acquires beside the training thread). Does not
// own the host store; shares the Ops (its buffers must not outlive it).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ops/ops_buffer.h"
#include "store/eviction_policy.h"
#include "store/segment_store.h"

namespace stratum {

class DeviceSegmentStore final : public SegmentStore {
 public:
  // budget_bytes: device memory for units (0 = unbounded: everything resident once touched).
  DeviceSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops, std::size_t budget_bytes = 0);
  void* acquire_unit(int unit, Access access) override;
  void release_unit(int unit) override;
  // The schedule drives eviction here and is passed on to the host store (its prefetch from NVMe).
  void schedule_set(const StepSchedule* schedule) override;
  void schedule_at(int group) override;
  void schedule_refresh() override { host_.schedule_refresh(); }
  void unit_pin(int unit, int delta) override;
  void unit_prefetch(int unit) override { host_.unit_prefetch(unit); }
  void trace_set(TraceRecorder* trace) override;
  // read_bytes: host -> device, write_bytes: device -> host, stall_ms: the training thread's time
  // in those copies, held/peak/budget: device memory of units.
  StoreStats stats() const override;
  void stats_reset_peak() override;

  // Every Params, AdamM and AdamV unit (the state a step leaves behind): push makes the host's
  // copy current on the device (uploads what is resident; with no budget, everything), pull
  // downloads what the device changed; pull waits for the ops queued before it.
  void push();
  void pull();
  SegmentStore& host() { return host_; }

 private:
  struct Entry {
    OpsBuffer buffer;      // null when absent from the device
    bool dirty = false;    // the device's copy is newer than the host's
    bool on_host = false;  // the host store holds this unit's data (else it reads as zeros)
    int holds = 0;
    int pins = 0;
  };
  using Lock = std::unique_lock<std::mutex>;

  static bool persistent(SegmentKind kind);
  bool dead(int unit) const { return entries_[unit].pins == 0 && policy_.dead(unit); }
  void space_make(Lock& lock, std::size_t bytes);
  void evict(int unit);
  OpsBuffer buffer_take(std::size_t bytes, bool* zeroed);
  void upload(int unit);    // host store -> device
  void download(int unit);  // device -> host store

  SegmentStore& host_;
  std::shared_ptr<const Ops> ops_;  // before the buffers: outlives them
  std::size_t budget_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<Entry> entries_;        // per unit
  std::vector<OpsBuffer> free_buffers_;  // evicted units' buffers, counted in held_bytes_
  std::size_t held_bytes_ = 0, free_bytes_ = 0, peak_held_bytes_ = 0;
  EvictionPolicy policy_;
  std::thread::id training_thread_;
  int holds_training_ = 0, holds_other_ = 0;
  StoreStats totals_;
  TraceRecorder* trace_ = nullptr;
};

}  // namespace stratum
