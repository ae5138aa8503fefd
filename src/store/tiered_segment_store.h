// Two-tier store: RAM under a byte budget, backed by one file per (segment, kind) it uses in an offload
// directory, moved by the async I/O engine (src/io). Each unit has a residency state
// (Note [unit states]); the RAM tier never holds more than its budget (asserted on every
// allocation); what does not fit is written back and loaded again when the step schedule needs
// it. Prefetch keeps the next k schedule groups' units in flight; eviction takes the unit whose
// next use is farthest away (Note [schedule eviction]). Units that were only read are dropped
// without writing; units whose next use overwrites them (dead gradients, spent activations) are
// dropped without writing too. Does not choose the budget (the trainer does) or touch kernels.
//
// Note [unit states]:
//   Absent  --acquire/prefetch, on disk-->  Loading --read done-->  Resident
//   Absent  --acquire Overwrite or never written-->  Resident (zeroed unless Overwrite)
//   Resident (dirty after a non-Read acquire) --evicted, dirty and live-->  Writing --done--> Absent
//   Resident (clean or dead) --evicted-->  Absent
// A unit is only evicted with no holds; Loading and Writing units are never evicted.
//
// The executor tells the store which schedule group it is about to run (schedule_at); what to
// evict is the EvictionPolicy's choice (Note [schedule eviction] in store/eviction_policy.h),
// the same one the planner replays. A pinned unit (unit_pin) is never dead.
//
// Note [prefetch on write completion]: a prefetch that finds the budget full of units being
// written back stops (it never waits on the compute's behalf). So each finished write wakes the
// store's refresher thread, which runs the prefetch again: the next group's reads start as soon
// as the write-backs have made room, not at the next schedule_at. Before this, a backward group
// of GPT-2 small at 25% waited ~30-40 ms for reads that started only when the previous group
// ended (docs/benchmarks.md). The refresher completes only tickets that succeeded: a failed one
// is left for the training thread's next reap, which throws its error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dir_lock.h"
#include "core/file_descriptor.h"
#include "io/io_engine.h"
#include "store/eviction_policy.h"
#include "store/segment_store.h"

namespace stratum {

// The refusal of an offload directory without room for the state offloaded there (need_bytes:
// every used unit's file; the store checks it when made, the plan and train before measuring).
void offload_disk_check(const std::string& dir, std::size_t free_bytes, std::size_t need_bytes);
// What --offload-dir DIR has free for a run's offload files: the file system's free bytes plus
// what DIR/stratum-offload already holds, which the run that takes DIR's lock removes before it
// makes its own (a run killed outright leaves its files there; Note [own subdirectory]).
std::size_t offload_free_bytes(const std::string& dir);

struct TieredStoreOptions {
  std::size_t budget_bytes = 0;  // RAM tier: every unit buffer the store holds
  std::string offload_dir;       // must exist and be writable
  int prefetch_depth = 2;        // schedule groups loaded ahead of the one computing (0: on use only)
  IoEngineOptions io;
  std::size_t free_bytes_override = 0;  // tests: pretend the disk has this much free space
  bool direct_io = true;                 // false: buffered I/O as on a file system without O_DIRECT
  // Per unit (empty: none): units this run never acquires, another rank's moments (Note [zero
  // sharding]); files holding only such units are not made, and they count for neither the disk
  // check nor whether the store streams.
  std::vector<bool> unused;
};

class TieredSegmentStore final : public SegmentStore {
 public:
  // Checks the directory (exists, writable, O_DIRECT, free space for every used unit), locks it
  // against a second run, creates and preallocates the files, starts the I/O engine.
  TieredSegmentStore(UnitTable units, const TieredStoreOptions& options);
  ~TieredSegmentStore() override;  // waits for I/O in flight, removes the files

  void* acquire_unit(int unit, Access access) override;
  void release_unit(int unit) override;
  void release_unit_discard(int unit) override;  // Note [discarded holds] (store/segment_store.h)
  bool unit_stale(int unit) const override;
  void schedule_set(const StepSchedule* schedule) override;
  void schedule_at(int group) override;
  void schedule_refresh() override;
  void unit_pin(int unit, int group, int delta) override;
  void unit_done_ahead(int unit, int group) override;
  void unit_prefetch(int unit) override;
  StoreStats stats() const override;
  // Under the lock: the refresher thread records I/O spans whenever a write finishes.
  void trace_set(TraceRecorder* trace) override {
    Lock lock(mutex_);
    trace_ = trace;
  }
  void stats_reset_peak() override;

  // "io_uring, O_DIRECT, 1 MiB blocks, queue depth 8, prefetch 2" and any fallback notes.
  const std::string& describe() const { return describe_; }

 private:
  enum class State { Absent, Loading, Resident, Writing };
  struct Entry {
    State state = State::Absent;
    bool dirty = false;      // RAM is newer than the file
    bool on_disk = false;    // the file holds this unit's data (else it reads as zeros)
    bool wanted = false;     // someone waits for this unit: keep it after a write-back
    int holds = 0;
    bool clean_on_disk_at_acquire = false;  // the file held the data this hold began with
    bool stale = false;      // Note [discarded holds]: holds the data from before a discarded hold
    AlignedBuffer buffer;
    std::shared_ptr<IoTicket> ticket;
    std::chrono::steady_clock::time_point io_started;
    std::vector<std::uint64_t> block_sums;
  };
  using Lock = std::unique_lock<std::mutex>;

  // Completes finished tickets; on the refresher, only those that succeeded (Note [prefetch on
  // write completion]).
  void reap(Lock& lock);
  void complete(int unit);  // a finished ticket's state change
  void wait_ticket(Lock& lock, int unit);
  // Makes room for `bytes`; evicts only units whose next use is farther than `beyond`. With
  // block=false returns false instead of waiting. unit: the one the room is for (Note [room for a
  // unit once]).
  // Note [room for a unit once]: making room may wait (for a write-back, for a hold elsewhere),
  // and meanwhile another thread (the refresher's prefetch) may load the very unit it is for. It
  // then returns at once: going on would make room for a second copy, evicting what the running
  // group still needs (the unit itself among them: it was read twice a step). An acquire also
  // evicts a unit the running group still needs (read ahead, not yet acquired) only when nothing
  // else can go and no transfer in flight can make room.
  bool space_make(Lock& lock, std::size_t bytes, long beyond, bool block, int unit = -1);
  AlignedBuffer buffer_take(std::size_t bytes);
  void buffer_give(AlignedBuffer buffer);
  void pool_trim();
  void io_start(int unit, IoOp op);  // Loading or Writing
  void prefetch(Lock& lock);
  void release(int unit, bool discard);  // release_unit and release_unit_discard
  void refresher_run();  // Note [prefetch on write completion]
  void refresher_wake();
  std::string where(int unit) const;
  void files_remove();  // the offload files and the lock this run created
  bool unit_unused(int unit) const { return !options_.unused.empty() && options_.unused[unit]; }

  TieredStoreOptions options_;
  std::string describe_;
  std::unique_ptr<IoEngine> read_engine_, write_engine_;  // separate queues for reads and writes
  DirLock lock_;
  std::vector<FileDescriptor> files_;
  std::vector<std::string> paths_;
  std::string subdir_;  // Note [own subdirectory]: where the offload files are

  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<Entry> entries_;
  std::vector<int> in_flight_;              // units Loading or Writing
  std::vector<AlignedBuffer> free_buffers_;  // evicted buffers kept for reuse (counted as held), Note [buffer pool]
  std::size_t free_bytes_ = 0;               // their bytes
  std::size_t held_bytes_ = 0;               // every buffer above, resident or free
  std::size_t peak_held_bytes_ = 0;
  std::uint64_t made_bytes_ = 0;
  // Whether the pool moves pages between whole-block buffers (Note [moving pages]): while the
  // budget's 2 MiB blocks, each possibly its own kernel mapping, stay well under the kernel's
  // default vm.max_map_count (65530).
  static constexpr std::size_t kMovingMaxBlocks = 16384;
  bool moving_pages_ = false;
  EvictionPolicy policy_;  // the schedule and its position
  bool streaming_ = false;  // the used units do not all fit the budget (Note [write-behind])
  std::thread::id training_thread_;
  int holds_training_ = 0, holds_other_ = 0;  // holds by the training thread / the optimizer worker
  StoreStats totals_;
  TraceRecorder* trace_ = nullptr;

  // Note [prefetch on write completion]: set by the write engine's threads, which must not wait
  // for mutex_ (its holder may be filling a buffer).
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
  bool wake_pending_ = false, wake_stop_ = false;
  std::thread refresher_;
};

}  // namespace stratum
