// The device tier: units of a host store (RAM, or RAM over NVMe) held in the memory of an Ops
// (Ops::memory_alloc; device memory for CUDA) for the executor to compute on. Weights I/O,
// initialisation, hashing and checkpoints keep using the host store; the trainer moves the state
// that outlives a step (parameters and AdamW moments) across with push() after loading and pull()
// before reading it.
//
// Note [device tier]: with no budget every unit stays in device memory once touched (the whole
// state fits). With a budget (--gpu-mem-budget less the executor's buffers) the device holds what
// fits and the host store holds the rest, as the RAM tier does over the offload dir:
//   - a unit is uploaded from the host store (which may load it from NVMe) ahead of its use: the
//     current group's and the next `prefetch` schedule groups' units (Note [prefetch window]) as
//     far as the budget allows without evicting anything needed sooner, or at the latest when it
//     is acquired. A unit the host never received reads as zeros; an Overwrite/Scratch use copies
//     nothing;
//   - space is made by the host tier's rule (Note [schedule eviction]): the resident unit with the
//     farthest next use goes; a dirty one is downloaded into the host store first unless its next
//     use overwrites it (dead gradients and activations are dropped), and a dirty unit released
//     far from its next use is downloaded at once (Note [write-behind]) but stays, clean, until
//     the room is needed (freeing it as the RAM tier does made every unit cross both ways every
//     step whatever the budget: 2.2 GB each way a GPT-2 small step at 58% and at 42% of its state);
//   - the copies run on the Ops' copy queues, one per direction (Note [ops transfers]): an upload
//     waits for the compute that last used its buffer, the compute waits for the upload of a unit
//     it acquires (the host does not), a download waits for the compute that wrote the unit, and
//     its buffer is reused (a unit with a copy in flight is never evicted) and its host unit read
//     only after the download has been seen finished, so nothing relies on the order between the
//     two queues. The host store's units are page-locked where their
//     buffers do not move (the RAM store), so the copies are asynchronous; from a pageable host
//     buffer (the tiered store's) they are staged by the driver before the call returns;
//   - buffers of evicted units are kept for the next unit of the same size (a device free waits
//     for the queues) and dropped only when the budget needs the room.
// The kernels see the same bytes in the same buffers' places as with the whole state on the
// device, so the bits are those of that run, for every budget and prefetch depth.
// Thread-safe (the CPU backend's optimizer worker acquires beside the training thread; copies on
// the CPU finish at once, so only the training thread ever leaves a host unit held). Does not
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
  // budget_bytes: device memory for units (0 = unbounded: everything resident once touched);
  // prefetch: schedule groups uploaded ahead of the one computing.
  DeviceSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops, std::size_t budget_bytes = 0,
                     int prefetch = 2);
  ~DeviceSegmentStore() override;  // waits for the copies in flight, unpins the host buffers
  void* acquire_unit(int unit, Access access) override;
  void release_unit(int unit) override;
  // The schedule drives prefetch and eviction here and is passed on to the host store (its
  // prefetch from NVMe).
  void schedule_set(const StepSchedule* schedule) override;
  void schedule_at(int group) override;
  void schedule_refresh() override;
  void unit_pin(int unit, int group, int delta) override;
  void unit_prefetch(int unit) override { host_.unit_prefetch(unit); }
  void unit_done_ahead(int unit, int group) override { host_.unit_done_ahead(unit, group); }
  void trace_set(TraceRecorder* trace) override;
  // No budget and AdamW on the device: every unit stays in the buffer it was first given (nothing
  // is evicted; only the host optimizer's host_give drops a copy).
  bool buffers_stable() const override;
  // read_bytes: host -> device, write_bytes: device -> host, stall_ms: the training thread's time
  // blocked in the tier (copies from pageable memory, waits for room), held/peak/budget: device
  // memory of units.
  StoreStats stats() const override;
  void stats_reset_peak() override;

  // Every Params, AdamM and AdamV unit (the state a step leaves behind): push makes the host's
  // copy current on the device (uploads what is resident; with no budget, everything), pull
  // downloads what the device changed; both wait for the copies and ops queued before them.
  void push();
  void pull();

  // Note [host optimizer]: AdamW on the CPU over the host store while the device computes
  // (ZeRO-Offload). After optimizer_on_host() the AdamW moments never come to the device (push
  // skips them; acquiring one is a bug) and prefetch skips the schedule's Optimizer groups. The
  // optimizer worker brackets each chunk it updates with host_take / host_give:
  //   host_take(unit): the host store's copy is made current (a dirty unit downloaded, the
  //     worker waiting for the copy with the store unlocked) and the unit is the host's until
  //     host_give: nothing uploads it, and an acquire waits;
  //   host_give(unit, changed): changed (the parameters) drops the device's stale copy, so the
  //     next use uploads the updated one.
  void optimizer_on_host();
  void host_take(int unit);
  void host_give(int unit, bool changed);
  SegmentStore& host() { return host_; }
  // host_take in the constructor, host_give in the destructor (a null store: nothing); changed()
  // before it goes out of scope marks the host's copy updated.
  class HostTaken {
   public:
    HostTaken(DeviceSegmentStore* store, int unit) : store_(store), unit_(unit) {
      if (store_ != nullptr) store_->host_take(unit_);
    }
    ~HostTaken() {
      if (store_ == nullptr) return;
      try {
        store_->host_give(unit_, changed_);
      } catch (...) {  // a failure already on its way out is the one reported
      }
    }
    HostTaken(const HostTaken&) = delete;
    HostTaken& operator=(const HostTaken&) = delete;
    void changed() { changed_ = true; }

   private:
    DeviceSegmentStore* store_;
    int unit_;
    bool changed_ = false;
  };

 private:
  // A device buffer and the event its reuse waits for: recorded on the compute queue when the
  // buffer was made or its unit let go of it.
  struct Buffer {
    OpsBuffer memory;
    OpsEvent free;
  };
  enum class State { Absent, Resident, Writing };  // Writing: a download in flight
  struct Entry {
    State state = State::Absent;
    Buffer buffer;
    OpsEvent done;           // the unit's copy in flight passes it when finished
    bool in_flight = false;  // a copy of it has not been seen finished (in_flight_)
    bool evicting = false;   // Writing to make room: the buffer is freed when the copy finishes
    bool loading = false;    // an upload in flight: compute waits for `done` before using the unit
    bool host_held = false;  // the host store's unit is acquired until `done` (page-locked copies)
    bool dirty = false;      // the device's copy is newer than the host's
    bool on_host = false;    // the host store holds this unit's data (else it reads as zeros)
    bool host_taken = false; // host_take'n (Note [host optimizer]): not copied, not acquired
    int holds = 0;
  };
  using Lock = std::unique_lock<std::mutex>;

  static bool persistent(SegmentKind kind);
  bool evictable(int unit) const;
  // Makes room for `bytes`, evicting only units whose next use is farther than `beyond`; with
  // block=false returns false instead of waiting for a copy or the other thread. unit: the one the
  // room is for; true once the other thread has brought it in (Note [room for a unit once] in
  // store/tiered_segment_store.h).
  bool space_make(Lock& lock, std::size_t bytes, long beyond, bool block, int unit = -1);
  void evict(int unit);
  Buffer buffer_take(std::size_t bytes, bool* zeroed);
  void buffer_give(Buffer buffer);  // records its free event
  void upload_start(int unit);      // host store -> device, into the entry's buffer
  void download_start(int unit);    // device -> host store
  std::string copy_name(int unit) const;  // a copy's span in the trace: the unit and its MiB (no trace: "")
  // Acquires the host store's unit; pinned: it is page-locked (the copy is asynchronous, so the
  // unit stays acquired until the copy has finished).
  void* host_unit(int unit, Access access, bool* pinned);
  void copy_started(int unit, bool pinned);  // in flight; a pageable host unit is released at once
  void reap();                      // finishes the copies that are done
  void wait_one(Lock& lock);        // the host waits for the oldest copy in flight
  void drain(Lock& lock);           // ... for all of them
  void prefetch(Lock& lock);
  bool dead_next(int unit) const;  // its next use overwrites it: nothing to upload (Note [no upload of dead data])

  SegmentStore& host_;
  std::shared_ptr<const Ops> ops_;  // before the buffers: outlives them
  std::size_t budget_bytes_;
  int prefetch_depth_;
  bool streaming_ = false;  // the units do not all fit the budget (Note [write-behind])
  bool host_optimizer_ = false;  // Note [host optimizer]
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<Entry> entries_;        // per unit
  std::vector<int> in_flight_;        // units with a copy in flight, oldest first
  std::vector<Buffer> free_buffers_;  // evicted units' buffers, counted in held_bytes_
  std::vector<void*> pinned_;  // per unit: its host buffer, page-locked (host_pin); null = not
  bool pin_failed_ = false;                            // host_pin refused once: stop asking
  std::size_t held_bytes_ = 0, free_bytes_ = 0, peak_held_bytes_ = 0;
  EvictionPolicy policy_;
  std::thread::id training_thread_;
  int holds_training_ = 0, holds_other_ = 0;
  StoreStats totals_;
  TraceRecorder* trace_ = nullptr;
};

}  // namespace stratum
