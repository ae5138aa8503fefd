// Learning-rate schedules: linear warmup, then constant or cosine decay to min_lr.
// Matches tools/torch_gpt2.py (see tools/README.md). Does not hold optimizer state.
#pragma once

#include <string>

namespace stratum {

enum class LrScheduleKind { Constant, Cosine };
LrScheduleKind lr_schedule_parse(const std::string& name);  // "constant" | "cosine"

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Cosine;
  double max_lr = 6e-4;
  double min_lr = 0.0;
  long warmup_steps = 0;
  long total_steps = 1;
  // lr for 0-based step s: s < W: max_lr (s+1)/W; then constant max_lr, or
  // min_lr + 0.5 (max_lr - min_lr)(1 + cos(pi (s-W)/max(1, S-W))).
  double lr_at(long step) const;
};

}  // namespace stratum
