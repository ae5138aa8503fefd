// EvictionPolicy; see eviction_policy.h and Note [schedule eviction].
#include "store/eviction_policy.h"

namespace stratum {

void EvictionPolicy::schedule_set(const StepSchedule* schedule) {
  schedule_ = schedule;
  now_ = 0;
  ++visit_;
}

void EvictionPolicy::at(int group) {
  now_ = group;
  ++visit_;
}

void EvictionPolicy::used(int unit) { used_[unit] = visit_; }

int EvictionPolicy::from(int unit) const {
  return used_[unit] == visit_ ? (now_ + 1) % schedule_->group_count() : now_;
}

long EvictionPolicy::distance(int unit) const {
  if (schedule_ == nullptr || schedule_->group_count() == 0) return StepSchedule::kNever;
  const long d = schedule_->next_use_distance(unit, from(unit));
  return used_[unit] == visit_ && d != StepSchedule::kNever ? d + 1 : d;
}

Access EvictionPolicy::next_access(int unit) const {
  if (schedule_ == nullptr || schedule_->group_count() == 0) return Access::Read;
  return schedule_->next_use_access(unit, from(unit));
}

}  // namespace stratum
