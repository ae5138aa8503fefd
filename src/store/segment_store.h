// The segment store: where each (segment, kind) buffer lives and how the executor gets at it.
// Note [acquire/release]: the executor brackets every use of a segment with acquire() and
// release(), in the step's schedule order, and says whether it reads, overwrites or updates
// it. A store that keeps everything in RAM (RamSegmentStore) ignores the bracketing; a tiered
// store uses it to load, evict and write back. Kernels never see anything but the pointer.
// Does not decide placement or do I/O itself.
#pragma once

#include <cstddef>
#include <vector>

#include "core/aligned_buffer.h"
#include "model/param_layout.h"

namespace stratum {

enum class Access { Read, Overwrite, Update };

class SegmentStore {
 public:
  virtual ~SegmentStore() = default;
  // Returns the segment's buffer (layout.segments()[segment].size_bytes() bytes, 4 KiB aligned),
  // valid until the matching release(). A segment never written reads as zeros.
  virtual float* acquire(int segment, SegmentKind kind, Access access) = 0;
  virtual void release(int segment, SegmentKind kind) = 0;
  // Bytes currently held in RAM by the store.
  virtual std::size_t resident_bytes() const = 0;
};

// Everything in RAM; buffers are allocated (zeroed) the first time a (segment, kind) is acquired,
// so inference never allocates gradients or moments.
class RamSegmentStore final : public SegmentStore {
 public:
  explicit RamSegmentStore(const ParamLayout& layout);
  float* acquire(int segment, SegmentKind kind, Access access) override;
  void release(int segment, SegmentKind kind) override;
  std::size_t resident_bytes() const override { return resident_bytes_; }

 private:
  const ParamLayout& layout_;
  std::vector<AlignedBuffer> buffers_;  // [segment * kSegmentKindCount + kind]
  std::vector<int> holds_;              // acquire count per buffer, checked on release
  std::size_t resident_bytes_ = 0;
};

// RAII bracket around acquire/release.
class SegmentHold {
 public:
  SegmentHold(SegmentStore& store, int segment, SegmentKind kind, Access access)
      : store_(&store), segment_(segment), kind_(kind), data_(store.acquire(segment, kind, access)) {}
  SegmentHold(const SegmentHold&) = delete;
  SegmentHold& operator=(const SegmentHold&) = delete;
  ~SegmentHold() { store_->release(segment_, kind_); }
  float* data() const { return data_; }

 private:
  SegmentStore* store_;
  int segment_;
  SegmentKind kind_;
  float* data_;
};

}  // namespace stratum
