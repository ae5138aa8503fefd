// The segment store: where each store unit (a chunk of a segment's params, grads or moments, or
// boundary activations; see unit_table.h) lives and how the executor gets at it.
// Note [acquire/release]: the executor brackets every use of a unit with acquire() and
// release() and says whether it reads, overwrites or updates it. A store that keeps everything
// in RAM (RamSegmentStore) ignores the bracketing; the tiered store (tiered_segment_store.h) uses
// it, plus the step schedule, to load, evict and write back. Kernels never see anything but the
// pointer. acquire/release may be called from two threads at once (the training thread and the
// optimizer worker). Does not decide placement or do I/O itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/tensor_view.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "store/step_schedule.h"
#include "store/unit_table.h"

namespace stratum {

// Cumulative traffic and memory figures of a store.
struct StoreStats {
  std::uint64_t read_bytes = 0;     // offload tier -> RAM
  std::uint64_t write_bytes = 0;    // RAM -> offload tier
  double stall_ms = 0.0;            // time the training thread waited in acquire() for I/O or space
  double read_busy_ms = 0.0;        // wall time with a read in flight (read_bytes / this = bandwidth)
  double write_busy_ms = 0.0;       // the same for writes
  std::size_t held_bytes = 0;       // RAM the store holds now
  std::size_t peak_held_bytes = 0;  // highest held_bytes since the last stats_reset_peak()
  std::size_t budget_bytes = 0;     // RAM the store may hold; 0 = unbounded
  std::uint64_t made_bytes = 0;  // fresh pages the pool took from the system: new buffers and growth (Note [buffer pool])
  std::uint64_t discarded_holds = 0;  // holds whose changes were dropped, not written (Note [discarded holds])
};

class SegmentStore {
 public:
  explicit SegmentStore(UnitTable units) : units_(std::move(units)) {}
  virtual ~SegmentStore() = default;
  const UnitTable& units() const { return units_; }

  // Returns the unit's buffer (units().bytes() bytes, 4 KiB aligned), valid until the matching
  // release_unit(). A unit never written reads as zeros. Callers use SegmentHold.
  virtual void* acquire_unit(int unit, Access access) = 0;
  // acquire_unit as a typed view of the unit's storage (its dtype and element count).
  TensorView acquire_view(int unit, Access access) {
    return TensorView(acquire_unit(unit, access), units_.dtype(unit), units_.elements(unit));
  }
  virtual void release_unit(int unit) = 0;
  // Note [discarded holds]: ends a hold whose changes the caller can make again from the data
  // the hold began with. A tiered store whose offload file holds that data (the unit was clean
  // and on disk when this hold acquired it) drops the buffer without writing it; the unit is then
  // stale: its next acquire returns the older data and unit_stale() says so until that hold is
  // released. Any other store, or a unit that was dirty, is simply released (keeping the
  // changes; never stale). The zeroth-order step's tied head (Note [zeroth-order step]).
  virtual void release_unit_discard(int unit) { release_unit(unit); }
  virtual bool unit_stale(int /*unit*/) const { return false; }

  // The step's access order (borrowed; may be null) and the group the training thread is about
  // to run: a tiered store prefetches what the next groups need. No-ops in RAM.
  virtual void schedule_set(const StepSchedule* /*schedule*/) {}
  virtual void schedule_at(int /*group*/) {}
  // Prefetches again from the current group (after releases made room); any thread may call it.
  virtual void schedule_refresh() {}
  // Starts loading the unit if it is on the offload tier and there is room without evicting
  // anything needed sooner; never blocks. For a consumer that knows its next units better than
  // the schedule position does (the optimizer worker runs ahead of it: read-ahead of its next
  // chunks). Any thread may call it. No-op in RAM.
  virtual void unit_prefetch(int /*unit*/) {}
  // A consumer (the optimizer worker) still owes the unit its use in `group` (delta +1), or has
  // made it (-1): while pinned it is never treated as dead, and once the position has passed
  // that group it counts as needed next (Note [owed uses] in store/eviction_policy.h).
  virtual void unit_pin(int /*unit*/, int /*group*/, int /*delta*/) {}
  // A consumer running ahead of the schedule position (the optimizer worker under exact
  // clipping) is done with the unit's use in `group`: its next use counts from the group after
  // (Note [done ahead] in store/eviction_policy.h). Call it before releasing the unit. Any thread.
  virtual void unit_done_ahead(int /*unit*/, int /*group*/) {}

  // A unit's buffer stays at one address for the store's life once acquired (the RAM store's):
  // the device tier may page-lock it for asynchronous copies (Note [device tier]).
  virtual bool buffers_stable() const { return false; }

  // Records I/O and stall spans into `trace` (borrowed; null = off).
  virtual void trace_set(TraceRecorder* /*trace*/) {}

  virtual StoreStats stats() const = 0;
  virtual void stats_reset_peak() = 0;

 private:
  UnitTable units_;
};

// Everything in RAM; buffers are allocated (zeroed) the first time a unit is acquired, so
// inference never allocates gradients or moments.
class RamSegmentStore final : public SegmentStore {
 public:
  explicit RamSegmentStore(UnitTable units);
  // act_floats: size of a boundary-activation unit (Executor::activation_unit_floats); 0 for a
  // store that only holds weights.
  explicit RamSegmentStore(const ParamLayout& layout, std::size_t act_floats = 0)
      : RamSegmentStore(UnitTable(layout, act_floats)) {}
  void* acquire_unit(int unit, Access access) override;
  void release_unit(int unit) override;
  bool buffers_stable() const override { return true; }
  StoreStats stats() const override;
  void stats_reset_peak() override {}

 private:
  mutable std::mutex mutex_;
  std::vector<AlignedBuffer> buffers_;  // per unit
  std::vector<int> holds_;              // acquire count per unit, checked on release
  std::size_t held_bytes_ = 0;
};

// RAII bracket around acquire/release.
class SegmentHold {
 public:
  SegmentHold(SegmentStore& store, int segment, SegmentKind kind, Access access, int chunk = 0)
      : store_(&store), unit_(store.units().index(segment, kind, chunk)), view_(store.acquire_view(unit_, access)) {}
  SegmentHold(const SegmentHold&) = delete;
  SegmentHold& operator=(const SegmentHold&) = delete;
  ~SegmentHold() { store_->release_unit(unit_); }
  const TensorView& view() const { return view_; }
  float* data() const { return view_.f32(); }  // an fp32 unit (asserts it is)

 private:
  SegmentStore* store_;
  int unit_;
  TensorView view_;
};

// RAII bracket around every chunk of one (segment, kind) (Note [segment chunks]), acquired in
// chunk order with the same access and released in reverse; for compute that needs a whole
// segment (a block's forward and backward).
class SegmentChunksHold {
 public:
  SegmentChunksHold(SegmentStore& store, int segment, SegmentKind kind, Access access);
  SegmentChunksHold(const SegmentChunksHold&) = delete;
  SegmentChunksHold& operator=(const SegmentChunksHold&) = delete;
  ~SegmentChunksHold() { release(); }
  // fp32 chunks (asserts they are); a bf16 segment is read through view().
  float* const* chunks() const {
    STRATUM_ASSERT(f32_);
    return chunks_.data();
  }
  float* tensor(const TensorSlot& t) const { return chunks()[t.chunk] + layout_->offset_in_chunk(t); }
  const TensorView& view(int chunk) const { return views_[chunk]; }
  const TensorView* views() const { return views_.data(); }  // every chunk, typed
  // Tensor t of the segment as a typed view, shaped as the layout says when it is a matrix.
  TensorView tensor_view(const TensorSlot& t) const { return layout_->tensor_view(views_.data(), t); }

 private:
  void release();
  SegmentStore* store_;
  const SegmentLayout* layout_;
  std::vector<int> units_;
  std::vector<TensorView> views_;
  std::vector<float*> chunks_;  // views_' data when they are fp32
  bool f32_ = true;
};

// RAII bracket around the units of one schedule group (or the part of it held at once:
// StepSchedule::hold_span), acquired in list order with the listed access and released in
// reverse: the executor runs each group inside one (Note [one schedule] in store/step_schedule.h).
class GroupHolds {
 public:
  GroupHolds(SegmentStore& store, const UnitUse* uses, std::size_t count);
  GroupHolds(SegmentStore& store, const std::vector<UnitUse>& uses) : GroupHolds(store, uses.data(), uses.size()) {}
  GroupHolds(const GroupHolds&) = delete;
  // At the end of the hold, release `unit` (held by this group) with release_unit_discard.
  void discard(int unit) { discards_.push_back(unit); }
  GroupHolds& operator=(const GroupHolds&) = delete;
  ~GroupHolds() { release(); }
  // The held unit (segment, kind, chunk); asserts the group lists it. data() asserts fp32.
  const TensorView& view(int segment, SegmentKind kind, int chunk = 0) const;
  float* data(int segment, SegmentKind kind, int chunk = 0) const { return view(segment, kind, chunk).f32(); }
  // Every chunk of (segment, kind), which the group lists consecutively in chunk order.
  float* const* chunks(int segment, SegmentKind kind) const;
  // The same chunks as typed views (fp32 or, for a bf16 params unit, bf16).
  const TensorView* views(int segment, SegmentKind kind) const;

 private:
  std::size_t position(int unit) const;
  void release();
  SegmentStore* store_;
  std::vector<int> units_;          // acquired so far, in order
  std::vector<TensorView> views_;   // per acquired unit
  std::vector<float*> data_;        // per acquired unit; null when it is not fp32
  std::vector<int> discards_;       // discard()
};

}  // namespace stratum
