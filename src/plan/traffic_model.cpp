// The planner's traffic model; see traffic_model.h.
#include "plan/traffic_model.h"

#include <algorithm>

#include "store/eviction_policy.h"
#include "stratum/error.h"

namespace stratum {
namespace {

// Note [plan model]: the store's policy over the schedule, with sizes only: the same
// EvictionPolicy the tiered store evicts by, fed the same positions and uses.
class StoreModel {
 public:
  // write_behind_depth: the prefetch depth of a streaming run (Note [write-behind]); -1: none.
  StoreModel(const UnitTable& units, const StepSchedule& schedule, std::size_t capacity, int write_behind_depth)
      : units_(units), schedule_(schedule), capacity_(capacity), write_behind_depth_(write_behind_depth),
        policy_(units.count()),
        resident_(units.count(), false), dirty_(units.count(), false), on_disk_(units.count(), false),
        evicted_(units.count(), false), held_(units.count(), false) {
    policy_.schedule_set(&schedule);
    // The loaded weights start in their offload files (a frozen LoRA base is never written
    // again, yet read every step).
    for (int u = 0; u < units.count(); ++u) on_disk_[u] = units.kind(u) == SegmentKind::Params;
  }

  // Runs group g; returns the bytes read for it (writes accumulate in written).
  std::uint64_t run_group(int g, std::vector<std::uint64_t>* unit_read, std::vector<std::uint64_t>* unit_written,
                          std::uint64_t* written, const std::vector<int>* discards) {
    policy_.at(g);
    std::uint64_t read = 0;
    std::vector<int> clean_at_acquire;  // of the discards: began clean, with the file's data
    const auto& uses = schedule_.group(g);
    const std::size_t span = static_cast<std::size_t>(schedule_.hold_span(g));  // held at once
    for (std::size_t i = 0; i < uses.size(); ++i) {
      if (i > 0 && i % span == 0)  // the next hold: the previous one is released
        for (std::size_t j = i - span; j < i; ++j) release(uses[j].unit, unit_written, written);
      const UnitUse& use = uses[i];
      const int u = use.unit;
      if (!resident_[u]) {
        space_make(units_.held_bytes(u), unit_written, written);
        resident_[u] = true;
        held_bytes_ += units_.held_bytes(u);
        peak_bytes_ = std::max(peak_bytes_, held_bytes_);
        if (use.access != Access::Overwrite && on_disk_[u]) {
          read += units_.bytes(u);
          (*unit_read)[u] += units_.bytes(u);
        }
        dirty_[u] = false;
      }
      if (discards != nullptr && !dirty_[u] && on_disk_[u] &&
          std::find(discards->begin(), discards->end(), u) != discards->end())
        clean_at_acquire.push_back(u);
      if (use.access != Access::Read) dirty_[u] = true;
      held_[u] = true;
      policy_.used(u);
    }
    const std::size_t last_hold = uses.empty() ? 0 : (uses.size() - 1) / span * span;
    for (int u : clean_at_acquire) dirty_[u] = false;  // the file keeps its data
    for (std::size_t j = last_hold; j < uses.size(); ++j)
      release(uses[j].unit, unit_written, written);
    for (int u : clean_at_acquire)  // dropped at release
      if (resident_[u] && !held_[u]) evict(u, unit_written, written);
    return read;
  }
  void evictions_reset() { std::fill(evicted_.begin(), evicted_.end(), false); }
  bool evicted(int u) const { return evicted_[u] || !resident_[u]; }
  std::size_t peak_bytes() const { return peak_bytes_; }

 private:
  void release(int u, std::vector<std::uint64_t>* unit_written, std::uint64_t* written) {
    if (!held_[u]) return;  // listed twice in the hold
    held_[u] = false;
    if (write_behind_depth_ >= 0 && resident_[u] && dirty_[u] && policy_.write_behind(u, write_behind_depth_))
      evict(u, unit_written, written);
  }
  void space_make(std::size_t bytes, std::vector<std::uint64_t>* unit_written, std::uint64_t* written) {
    while (held_bytes_ + bytes > capacity_) {
      const int victim = policy_.victim(-1, [&](int u) { return resident_[u] && !held_[u]; });
      STRATUM_ASSERT(victim >= 0);  // the minimum-budget check ran first
      evict(victim, unit_written, written);
    }
  }
  void evict(int u, std::vector<std::uint64_t>* unit_written, std::uint64_t* written) {
    if (dirty_[u] && !policy_.dead(u)) {
      *written += units_.bytes(u);
      (*unit_written)[u] += units_.bytes(u);
      on_disk_[u] = true;
    } else if (dirty_[u]) {
      on_disk_[u] = false;
    }
    resident_[u] = false;
    dirty_[u] = false;
    evicted_[u] = true;
    held_bytes_ -= units_.held_bytes(u);
  }

  const UnitTable& units_;
  const StepSchedule& schedule_;
  std::size_t capacity_;
  int write_behind_depth_;
  EvictionPolicy policy_;
  std::size_t held_bytes_ = 0, peak_bytes_ = 0;
  std::vector<bool> resident_, dirty_, on_disk_, evicted_, held_;
};

}  // namespace

Traffic traffic_replay(const UnitTable& units, const StepSchedule& schedule, std::size_t capacity, int depth,
                       const std::vector<std::vector<int>>* discards) {
  StoreModel store(units, schedule, capacity, depth);
  const int G = schedule.group_count();
  Traffic t;
  t.group_read.assign(G, 0);
  t.group_written.assign(G, 0);
  t.unit_read.assign(units.count(), 0);
  t.unit_written.assign(units.count(), 0);
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {
      store.evictions_reset();
      t.written = 0;
      std::fill(t.unit_read.begin(), t.unit_read.end(), 0);
      std::fill(t.unit_written.begin(), t.unit_written.end(), 0);
    }
    for (int g = 0; g < G; ++g) {
      if (schedule.group_optional(g)) continue;  // Note [optional groups]: a step does not run it
      const std::uint64_t before = t.written;
      t.group_read[g] = store.run_group(g, &t.unit_read, &t.unit_written, &t.written,
                                        discards != nullptr && g < static_cast<int>(discards->size()) ? &(*discards)[g] : nullptr);
      t.group_written[g] = t.written - before;
    }
  }
  for (std::uint64_t b : t.group_read) t.read += b;
  t.peak_bytes = store.peak_bytes();
  t.evicted.resize(units.count());
  for (int u = 0; u < units.count(); ++u) t.evicted[u] = store.evicted(u);
  return t;
}

}  // namespace stratum
