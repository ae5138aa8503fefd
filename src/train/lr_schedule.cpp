// LrSchedule; see lr_schedule.h.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "stratum/error.h"

namespace stratum {

LrScheduleKind lr_schedule_parse(const std::string& name) {
  if (name == "constant") return LrScheduleKind::Constant;
  if (name == "cosine") return LrScheduleKind::Cosine;
  STRATUM_FAIL("[train] --lr-schedule must be 'constant' or 'cosine', got '", name, "'");
}

double LrSchedule::lr_at(long step) const {
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == LrScheduleKind::Constant) return max_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(std::max(1L, total_steps - warmup_steps));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
}

}  // namespace stratum
