// The device tier for a run whose whole state fits in device memory: every unit of a host store
// mirrored in the memory of an Ops (Ops::memory_alloc; device memory for CUDA). The executor
// computes on the mirror; weights I/O, initialisation, hashing and checkpoints keep using the host
// store, and the trainer moves the state that outlives a step (parameters and AdamW moments)
// across with push() after loading and pull() before reading it. No budget, no eviction: a
// device budget (--gpu-mem-budget) is the tier this grows into (docs/architecture.md). Does not
// own the host store; shares the Ops (its buffers must not outlive it).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "ops/ops_buffer.h"
#include "store/segment_store.h"

namespace stratum {

class MirrorSegmentStore final : public SegmentStore {
 public:
  MirrorSegmentStore(SegmentStore& host, std::shared_ptr<const Ops> ops);
  // Device memory of `unit`, allocated (zeroed) the first time it is asked for.
  void* acquire_unit(int unit, Access access) override;
  void release_unit(int unit) override;
  StoreStats stats() const override;
  void stats_reset_peak() override {}

  // Host -> mirror / mirror -> host for every Params, AdamM and AdamV unit (the state a step
  // leaves behind); pull waits for the ops queued before it.
  void push();
  void pull();

 private:
  OpsBuffer& buffer(int unit);  // under mutex_
  static bool persistent(SegmentKind kind);

  SegmentStore& host_;
  std::shared_ptr<const Ops> ops_;  // before buffers_: outlives them
  mutable std::mutex mutex_;
  std::vector<OpsBuffer> buffers_;  // per unit
  std::vector<int> holds_;
  std::size_t held_bytes_ = 0;
};

}  // namespace stratum
