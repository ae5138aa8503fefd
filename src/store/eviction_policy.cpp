// EvictionPolicy; see eviction_policy.h and Note [schedule eviction].
#include "store/eviction_policy.h"

#include <algorithm>

#include "stratum/error.h"

namespace stratum {

void EvictionPolicy::schedule_set(const StepSchedule* schedule) {
  schedule_ = schedule;
  now_ = 0;
  ++visit_;
  for (int u : ahead_units_) ahead_[u] = -1;
  ahead_units_.clear();
}

void EvictionPolicy::at(int group) {
  if (!ahead_units_.empty() && group != now_) {
    // Forget the marks of the groups the position has now passed: those in [now_, group).
    const int G = schedule_->group_count();
    const int moved = (group - now_ + G) % G;
    std::size_t kept = 0;
    for (int u : ahead_units_) {
      if ((ahead_[u] - now_ + G) % G < moved) ahead_[u] = -1;
      else ahead_units_[kept++] = u;
    }
    ahead_units_.resize(kept);
  }
  now_ = group;
  ++visit_;
}

void EvictionPolicy::done_ahead(int unit, int group) {
  if (schedule_ == nullptr || group < 0 || group >= schedule_->group_count()) return;
  if (ahead_[unit] < 0) ahead_units_.push_back(unit);
  ahead_[unit] = group;
}

void EvictionPolicy::used(int unit) { used_[unit] = visit_; }

int EvictionPolicy::from(int unit) const {
  const int G = schedule_->group_count();
  if (ahead_[unit] >= 0) return (ahead_[unit] + 1) % G;
  return used_[unit] == visit_ ? (now_ + 1) % G : now_;
}

void EvictionPolicy::pin(int unit, int group, int delta) {
  pins_[unit] += delta;
  STRATUM_ASSERT(pins_[unit] >= 0);
  if (delta > 0) owed_[unit] = group;
  if (pins_[unit] == 0) owed_[unit] = -1;
}

long EvictionPolicy::distance(int unit) const {
  if (schedule_ == nullptr || schedule_->group_count() == 0) return StepSchedule::kNever;
  const int G = schedule_->group_count();
  const int start = from(unit);
  const long d = schedule_->next_use_distance(unit, start);
  // Note [owed uses]: the pinned use is behind the position unless it is the next use from here.
  const bool owed_behind = pins_[unit] > 0 && (d == StepSchedule::kNever || (start + d) % G != owed_[unit]);
  long out = d;
  if (d != StepSchedule::kNever) {
    if (ahead_[unit] >= 0) out = (ahead_[unit] - now_ + G) % G + 1 + d;
    else if (used_[unit] == visit_) out = d + 1;
  }
  return owed_behind ? std::min(out, 1L) : out;
}

Access EvictionPolicy::next_access(int unit) const {
  if (schedule_ == nullptr || schedule_->group_count() == 0) return Access::Read;
  return schedule_->next_use_access(unit, from(unit));
}

}  // namespace stratum
