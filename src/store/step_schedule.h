// The known access order of one training step: a list of groups (one per compute unit: a block's
// forward, the head, a block's backward, one optimizer chunk...), each naming the store units it
// uses and how. The executor builds it once; the tiered store uses it to prefetch the next k
// groups and to evict the unit whose next use is farthest away (Note [schedule eviction]).
// Steps repeat, so "next use" wraps around into the next step. Does not run anything.
#pragma once

#include <vector>

#include "store/unit_table.h"

namespace stratum {

struct UnitUse {
  int unit;
  Access access;
};

// What a group computes, for the planner's time model (plan/planner.h); the store ignores it.
enum class GroupWork {
  EmbedForward, VocabForward, LayerForward, HeadBegin, HeadLse, HeadBackward, HeadEnd, LayerBackward,
  EmbedBackward, VocabBackward, Optimizer
};

class StepSchedule {
 public:
  explicit StepSchedule(int unit_count) : uses_of_unit_(static_cast<std::size_t>(unit_count)) {}

  // Appends a group and returns its index.
  int group_add(std::vector<UnitUse> uses, GroupWork work = GroupWork::LayerForward);
  int group_count() const { return static_cast<int>(groups_.size()); }
  const std::vector<UnitUse>& group(int g) const { return groups_[g]; }
  GroupWork group_work(int g) const { return work_[g]; }

  // Groups from `now` to the unit's next use at or after `now` (0 = used by group `now`),
  // wrapping into the next step; kNever when the schedule never uses it.
  static constexpr long kNever = 1L << 40;
  long next_use_distance(int unit, int now) const;
  // How that next use accesses the unit (Read when never used). A unit whose next access is
  // Overwrite holds dead data: evicting it needs no write-back.
  Access next_use_access(int unit, int now) const;

 private:
  struct Use {
    int group;
    Access access;
  };
  const Use* next_use(int unit, int now, long* distance) const;

  std::vector<std::vector<UnitUse>> groups_;
  std::vector<GroupWork> work_;
  std::vector<std::vector<Use>> uses_of_unit_;  // per unit, in group order
};

}  // namespace stratum
