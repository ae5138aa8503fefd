// StepSchedule; see step_schedule.h.
#include "store/step_schedule.h"

#include <algorithm>

#include "stratum/error.h"

namespace stratum {

int StepSchedule::group_add(std::vector<UnitUse> uses, GroupWork work, int segment, int item, bool optional) {
  const int g = static_cast<int>(groups_.size());
  for (const UnitUse& u : uses) {
    STRATUM_ASSERT(u.unit >= 0 && static_cast<std::size_t>(u.unit) < uses_of_unit_.size());
    if (optional) continue;  // Note [optional groups]: not a next use
    auto& list = uses_of_unit_[u.unit];
    if (!list.empty() && list.back().group == g) {
      // The same unit twice in one group: the strongest access wins (Update > Overwrite > Read).
      if (u.access == Access::Update || (u.access == Access::Overwrite && list.back().access == Access::Read))
        list.back().access = u.access;
    } else {
      list.push_back({g, u.access});
    }
  }
  STRATUM_ASSERT(work != GroupWork::Optimizer || uses.size() % kOptimizerChunkUses == 0);
  STRATUM_ASSERT(work != GroupWork::GradAccum || uses.size() % kGradAccumChunkUses == 0);
  groups_.push_back(std::move(uses));
  info_.push_back({work, segment, item, optional});
  return g;
}

int StepSchedule::hold_span(int g) const {
  switch (info_[g].work) {
    case GroupWork::Optimizer: return kOptimizerChunkUses;
    case GroupWork::GradAccum: return kGradAccumChunkUses;
    case GroupWork::GradShare: return 1;
    default: return static_cast<int>(groups_[g].size());
  }
}

const StepSchedule::Use* StepSchedule::next_use(int unit, int now, long* distance) const {
  const auto& list = uses_of_unit_[unit];
  if (list.empty()) {
    *distance = kNever;
    return nullptr;
  }
  auto it = std::lower_bound(list.begin(), list.end(), now, [](const Use& u, int g) { return u.group < g; });
  if (it != list.end()) {
    *distance = it->group - now;
    return &*it;
  }
  *distance = list.front().group + group_count() - now;  // wraps into the next step
  return &list.front();
}

long StepSchedule::next_use_distance(int unit, int now) const {
  long distance = 0;
  next_use(unit, now, &distance);
  return distance;
}

Access StepSchedule::next_use_access(int unit, int now) const {
  long distance = 0;
  const Use* use = next_use(unit, now, &distance);
  return use == nullptr ? Access::Read : use->access;
}

std::size_t group_hold_bytes(const StepSchedule& schedule, const UnitTable& units, int g) {
  const auto& uses = schedule.group(g);
  const std::size_t span = static_cast<std::size_t>(schedule.hold_span(g));
  std::size_t most = 0;
  for (std::size_t i = 0; i < uses.size(); i += span) {
    std::vector<int> distinct;
    std::size_t bytes = 0;
    for (std::size_t j = i; j < std::min(uses.size(), i + span); ++j) {
      if (std::find(distinct.begin(), distinct.end(), uses[j].unit) != distinct.end()) continue;
      distinct.push_back(uses[j].unit);
      bytes += units.held_bytes(uses[j].unit);
    }
    most = std::max(most, bytes);
  }
  return most;
}

std::size_t schedule_min_bytes(const StepSchedule& schedule, const UnitTable& units, bool worker,
                               bool updates_elsewhere) {
  const int G = schedule.group_count();
  std::vector<std::size_t> held(static_cast<std::size_t>(G), 0);  // the largest hold of each group
  int first_update = G, last_update = -1;
  std::size_t update_hold = 0;
  for (int g = 0; g < G; ++g) {
    if (updates_elsewhere && schedule.group_work(g) == GroupWork::Optimizer) continue;
    held[g] = group_hold_bytes(schedule, units, g);
    if (schedule.group_work(g) == GroupWork::Optimizer) {
      first_update = std::min(first_update, g);
      last_update = g;
      update_hold = std::max(update_hold, held[g]);
    }
  }
  std::size_t most = 0;
  for (int g = 0; g < G; ++g) {
    const bool beside = worker && schedule.group_work(g) != GroupWork::Optimizer && g > first_update && g < last_update;
    most = std::max(most, held[g] + (beside ? update_hold : 0));
  }
  return most;
}

}  // namespace stratum
