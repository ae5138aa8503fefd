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
//   - A consumer ahead of the position may say which uses it has made (Note [done ahead]).
//   - A unit whose next use overwrites it is dead: evicting it writes nothing back.
//   - A dirty unit released far from its next use is written back at once (Note [write-behind]).
// Not thread-safe: the store calls it under its lock.
//
// Note [done ahead]: under exact clipping the optimizer worker runs ahead of the schedule
// position (the forward waits for each segment's update at that segment's Optimizer group, just
// before its forward). Until the position reaches the group, every unit of the segment's update
// looked needed at distance 1: a chunk's moments and gradients, updated and released, as much as
// the updated parameters the forward is about to read, so making room for the next chunk evicted
// whichever came first (at 10% of GPT-2 small each layer's parameters were read ~3 times a step
// instead of 2). The worker now marks each chunk's four units done in that group as it releases
// them (done_ahead()); until the position passes the group their next use counts from the group
// after it: the moments' and gradients' is the next step (far: written behind at once, evicted
// first), the parameters' the forward right after. Only the distances change, never what a
// unit holds, so the bits are the same.
//
// Note [owed uses]: with --grad-clip 0 each segment's update is queued on the optimizer worker when
// its gradients are final and the backward moves on: the worker runs behind the position. Its
// units were pinned so they were not taken for dead, but their distances were measured from the
// position, past the update group: the parameters looked needed at the next forward, the moments
// at the next step's update, the worker's read-ahead chunks the farthest of all. The backward
// evicted them first and the worker read them again (GPT-2 small at 10%: the moments read ~2.5
// times a step, reads 5.1 GB a step against 2.6 GB with clipping; such runs now pipeline their
// updates, Note [streamed updates after the backward] in exec/executor.h, and the rule serves the
// overlapped mode over a device tier's budget). A pin now names the group its
// use is in (pin()): while the unit's next use from the position is not that group, the use is
// owed by a consumer behind the position and the unit counts as needed in the next group
// (distance 1). The worker unpins each chunk as it finishes it, before releasing it, so the
// chunk's moments and parameters are then written behind and its gradients are dead.
#pragma once

#include <vector>

#include "store/step_schedule.h"

namespace stratum {

class EvictionPolicy {
 public:
  explicit EvictionPolicy(int unit_count)
      : used_(static_cast<std::size_t>(unit_count), 0),
        ahead_(static_cast<std::size_t>(unit_count), -1),
        pins_(static_cast<std::size_t>(unit_count), 0),
        owed_(static_cast<std::size_t>(unit_count), -1) {}

  // The schedule (borrowed; null: no future known, every distance kNever) from its first group.
  void schedule_set(const StepSchedule* schedule);
  const StepSchedule* schedule() const { return schedule_; }
  void at(int group);      // the group about to run
  int now() const { return now_; }
  void used(int unit);     // the running group has acquired the unit
  bool used_now(int unit) const { return used_[unit] == visit_; }  // since the last at()
  // A consumer ahead of the position is done with the unit's use in `group` (a group the position
  // has not passed yet); forgotten once it has.
  void done_ahead(int unit, int group);
  bool done_ahead_in(int unit, int group) const { return ahead_[unit] == group; }
  long distance(int unit) const;
  // How the unit's next use accesses it (Read when the schedule never uses it).
  Access next_access(int unit) const;
  bool dead(int unit) const {
    return pins_[unit] == 0 && schedule_ != nullptr && next_access(unit) == Access::Overwrite;
  }
  // A consumer still owes the unit its use in `group` (delta +1), or has made it (-1): while
  // pinned the unit is never dead, and needed next when that use is behind the position (Note
  // [owed uses]).
  void pin(int unit, int group, int delta);
  bool pinned(int unit) const { return pins_[unit] > 0; }
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
  std::vector<int> ahead_;        // done_ahead()'s group per unit, -1: none
  std::vector<int> ahead_units_;  // the units with one
  std::vector<int> pins_;         // pin()'s count per unit
  std::vector<int> owed_;         // the group of the pinned use, -1: none
};

}  // namespace stratum
