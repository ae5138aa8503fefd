// The known access order of one step: a list of groups (one per compute unit: a block's forward,
// a vocabulary block of the head, a block's backward, one segment's update...), each naming the
// store units it uses and how, what it computes and on which segment. Note [one schedule]: the
// executor builds it once and then runs it group by group (exec/executor.h); the tiered store
// prefetches the next k groups and evicts by it, the planner replays it through the same
// eviction policy (store/eviction_policy.h), and the minimum budget is the most it holds at once
// (schedule_min_bytes). Steps repeat, so "next use" wraps around into the next step. Does not run
// anything.
#pragma once

#include <vector>

#include "store/unit_table.h"

namespace stratum {

struct UnitUse {
  int unit;
  Access access;
};

// What a group computes: the executor dispatches on it, trace spans are tagged with it and the
// planner's time model times it (plan/planner.h); the store ignores it.
enum class GroupWork {
  EmbedForward, VocabForward, VocabRows, LayerForward, HeadBegin, HeadLse, HeadBackward, HeadEnd, LayerBackward,
  EmbedBackward, VocabBackward, GradAccum, GradShare, Optimizer
};

// Note [optional groups]: a group marked optional is one the executor runs only when a step or
// pass needs it (the embedding lookup from the vocabulary blocks when its rows were not gathered
// ahead, Note [embedding rows ahead] in exec/executor.h). Its uses are still the only units it
// touches, and count for the minimum budget; but the next-use distances, the store's prefetch
// window and the planner's replay skip it, as a step that does not run it would. So an optional
// group loads what it holds on demand, and may only read units whose data the schedule keeps
// (whose next use in the groups that always run is not an Overwrite).
// An Optimizer group lists its segment chunk by chunk, four units a chunk (params, grads, both
// moments), and holds one chunk's four at a time; a GradAccum group (Note [gradient accumulation]
// in exec/executor.h) two a chunk (grads, grad_sum), a GradShare group (Note [data parallel]) one;
// every other group holds all its units together.
constexpr int kOptimizerChunkUses = 4;
constexpr int kGradAccumChunkUses = 2;

class StepSchedule {
 public:
  explicit StepSchedule(int unit_count) : uses_of_unit_(static_cast<std::size_t>(unit_count)) {}

  // Appends a group and returns its index. segment: the segment it works on (-1: none in
  // particular); item: its layer or vocabulary block (-1: none). optional: a group the executor
  // runs only in some steps or passes (Note [optional groups]).
  int group_add(std::vector<UnitUse> uses, GroupWork work = GroupWork::LayerForward, int segment = -1,
                int item = -1, bool optional = false);
  bool group_optional(int g) const { return info_[g].optional; }
  int group_count() const { return static_cast<int>(groups_.size()); }
  const std::vector<UnitUse>& group(int g) const { return groups_[g]; }
  GroupWork group_work(int g) const { return info_[g].work; }
  int group_segment(int g) const { return info_[g].segment; }
  int group_item(int g) const { return info_[g].item; }
  // The share of its work's compute the group does: 1, or less for a part of it (a block's
  // half, Note [block halves] in model/param_layout.h); the planner times groups by it.
  double group_share(int g) const { return info_[g].share; }
  void group_share_set(int g, double share) { info_[g].share = share; }
  // How many consecutive uses of group g are held at once (kOptimizerChunkUses, kGradAccumChunkUses or all).
  int hold_span(int g) const;

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

  struct Info {
    GroupWork work;
    int segment, item;
    bool optional;
    double share = 1.0;
  };
  std::vector<std::vector<UnitUse>> groups_;
  std::vector<Info> info_;
  std::vector<std::vector<Use>> uses_of_unit_;  // per unit, in group order
};

// The bytes group g holds at once: its largest hold (hold_span uses, each unit counted once).
std::size_t group_hold_bytes(const StepSchedule& schedule, const UnitTable& units, int g);

// The most store bytes a run of the schedule holds at once: the largest hold (hold_span) of any
// group, plus, with `worker`, one Optimizer hold beside every other group that lies between the
// schedule's first and last Optimizer group (where an optimizer worker may be updating beside
// the training thread: the forward when updates are pipelined, the backward when they overlap it).
// updates_elsewhere: the Optimizer groups hold nothing of this store (AdamW on the host store
// beside a device tier, Note [host optimizer] in store/device_segment_store.h).
std::size_t schedule_min_bytes(const StepSchedule& schedule, const UnitTable& units, bool worker,
                               bool updates_elsewhere = false);

}  // namespace stratum
