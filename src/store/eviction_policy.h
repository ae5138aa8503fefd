// Note [schedule eviction]: which resident unit to give up when space is needed, decided on the
// known future of the step schedule (Belady's rule) rather than on the past (LRU). The tiered
// store (tiered_segment_store.h) evicts by it and the planner's store model (plan/planner.cpp)
// replays a step through it, so the traffic the plan predicts is the traffic the store makes.
//   - The position is the group about to run (at()).
//   - A unit's distance is the number of groups to its next use; a unit the current group has
//     already used (used()) counts from the next group on, so a released chunk of the running
//     optimizer group or a block's spent gradients are not mistaken for "needed now".
//   - The victim is the unit with the farthest next use among those the caller may evict (not
//     held, not in flight), farther than a bound: a prefetch of a unit needed in d groups only
//     displaces units needed later than that.
//   - A unit whose next use overwrites it is dead: evicting it writes nothing back.
//   - A dirty unit released far from its next use is written back at once (Note [write-behind]).
// Not thread-safe: the store calls it under its lock.
#pragma once

#include <vector>

#include "store/step_schedule.h"

namespace stratum {

class EvictionPolicy {
 public:
  explicit EvictionPolicy(int unit_count) : used_(static_cast<std::size_t>(unit_count), 0) {}

  // The schedule (borrowed; null: no future known, every distance kNever) from its first group.
  void schedule_set(const StepSchedule* schedule);
  const StepSchedule* schedule() const { return schedule_; }
  void at(int group);      // the group about to run
  int now() const { return now_; }
  void used(int unit);     // the running group has acquired the unit
  bool used_now(int unit) const { return used_[unit] == visit_; }  // since the last at()
  long distance(int unit) const;
  // How the unit's next use accesses it (Read when the schedule never uses it).
  Access next_access(int unit) const;
  bool dead(int unit) const { return schedule_ != nullptr && next_access(unit) == Access::Overwrite; }
  // Note [write-behind]: when the units do not all fit, a dirty unit released with its next use
  // beyond the prefetch window will be evicted before then anyway; writing it at once, while
  // compute runs, keeps the write off the critical path of the acquire that would evict it.
  bool write_behind(int unit, int prefetch_depth) const {
    return schedule_ != nullptr && !dead(unit) && distance(unit) > prefetch_depth + 1;
  }
  // Among the units evictable(u) allows, the one whose next use is farthest and farther than
  // `beyond`; -1 when there is none.
  template <class Evictable>
  int victim(long beyond, Evictable evictable) const {
    int best = -1;
    for (int u = 0; u < static_cast<int>(used_.size()); ++u) {
      if (!evictable(u)) continue;
      const long d = distance(u);
      if (d > beyond) {
        best = u;
        beyond = d;
      }
    }
    return best;
  }

 private:
  // Where the unit's next use is searched from: the next group when the current one used it.
  int from(int unit) const;

  const StepSchedule* schedule_ = nullptr;
  int now_ = 0;
  long visit_ = 1;                // counts at() calls; used_ holds the visit a unit was last used in
  std::vector<long> used_;
};

}  // namespace stratum
