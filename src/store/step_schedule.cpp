// StepSchedule; see step_schedule.h.
#include "store/step_schedule.h"

#include <algorithm>

#include "stratum/error.h"

namespace stratum {

int StepSchedule::group_add(std::vector<UnitUse> uses, GroupWork work) {
  const int g = static_cast<int>(groups_.size());
  for (const UnitUse& u : uses) {
    STRATUM_ASSERT(u.unit >= 0 && static_cast<std::size_t>(u.unit) < uses_of_unit_.size());
    auto& list = uses_of_unit_[u.unit];
    if (!list.empty() && list.back().group == g) {
      // The same unit twice in one group: the strongest access wins (Update > Overwrite > Read).
      if (u.access == Access::Update || (u.access == Access::Overwrite && list.back().access == Access::Read))
        list.back().access = u.access;
    } else {
      list.push_back({g, u.access});
    }
  }
  groups_.push_back(std::move(uses));
  work_.push_back(work);
  return g;
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

}  // namespace stratum
