// The planner's traffic model (Note [plan model] in plan/planner.h): a step's store traffic,
// replayed over the step schedule with sizes only, through the same EvictionPolicy the tiered
// store evicts by (Note [schedule eviction]), write-behind included. Moves no data.
#pragma once

#include <cstdint>
#include <vector>

#include "store/step_schedule.h"
#include "store/unit_table.h"

namespace stratum {

// One streaming step's traffic per group and per unit, and what the store model ended up holding.
struct Traffic {
  std::vector<std::uint64_t> group_read, group_written, unit_read, unit_written;
  std::uint64_t read = 0, written = 0;
  std::size_t peak_bytes = 0;
  std::vector<bool> evicted;  // per unit: left RAM during the step (or never came)
};

// Three steps through the store model; the third is the steady state. capacity: the store's RAM
// budget; depth: the prefetch depth of a streaming run (its write-behind depends on it), -1 when
// not streaming. discards (optional, per group): units the group releases discarded (Note
// [discarded holds] in store/segment_store.h): dropped unwritten when their hold began clean.
Traffic traffic_replay(const UnitTable& units, const StepSchedule& schedule, std::size_t capacity, int depth,
                       const std::vector<std::vector<int>>* discards = nullptr);

}  // namespace stratum
