// The units the store moves: one (segment, kind, chunk) each. Params, grads and AdamW moments are
// cut at the segment's chunks (Note [segment chunks] in model/param_layout.h), so the optimizer
// streams a block's state a few MB at a time and never holds a whole block; boundary activations
// are one unit per segment. Each (segment, kind) maps to one offload file holding its chunks back
// to back. Every unit is a multiple of 4 KiB.
// Does not allocate or move anything (see segment_store.h, tiered_segment_store.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/param_layout.h"

namespace stratum {

// How a unit is used between acquire and release: Read leaves it unchanged; Overwrite replaces
// every byte the program will read later (the old contents need not be loaded); Update reads
// and modifies it. Scratch: as Overwrite, and what is written is dead after the release too
// (never loaded, never written back): a forward-only pass's use of a layer's internals (Note
// [activations offload] in exec/executor.h); never in a schedule, only in a hold.
enum class Access { Read, Overwrite, Update, Scratch };

// Which units a table has (see the constructor).
enum class UnitSet { Training, ForwardOnly, Inference };

// Note [whole huge pages]: a tiered store holds a unit of about 2 MiB and more in whole 2 MiB
// blocks (its buffer is padded up to the next multiple, and the padding counts against the
// budget), so that every page of a pool buffer can be a transparent huge page and a buffer
// recycled for a unit of another size (Note [buffer pool] in store/tiered_segment_store.cpp)
// gains or loses whole huge pages. Unpadded, each size change left a part-block of 4 KiB pages
// at the old and the new end to fault in and zero: GPT-2 small B4 T256 at a 474 MiB budget took
// ~55k page faults a step, against ~4k padded (docs/benchmarks.md). Below that, units keep
// their size (the padding would be up to half of them). UnitTable::held_bytes.

class UnitTable {
 public:
  // act_floats: size of one boundary activation, e.g. Executor::activation_unit_floats();
  // 0 = no activation units (a store used only for loading/saving weights). set: Training has
  // every kind (gradients and moments for the layout's trainable segments only: with LoRA the
  // adapters', Note [lora segments]); ForwardOnly has no gradient or moment units (zeroth-order training, Note
  // [zeroth-order step] in exec/executor.h); Inference has no gradient or moment units and
  // activation units for layers only (the offload dir holds the weights and, as each layer's
  // activation unit, its KV cache; Note [KV cache units] in infer/decoder.h).
  // param_bf16: params units hold bfloat16 (2 bytes an element, at the same element offsets as
  // fp32) instead of fp32: an inference store keeps a bf16 checkpoint as stored (Note [bf16
  // weights] in infer/decoder.h). With Inference every params unit but the adapters'; with a
  // LoRA layout in training, the frozen layers' (Note [frozen bf16 base] in model/block_policy.h).
  // internals_floats: with Training, one Internals unit of that size per layer (--activations
  // offload, Note [activations offload] in exec/executor.h); 0 = none.
  // grad_sum: with Training, a GradSum unit beside every Grads unit (--grad-accum N > 1, Note
  // [gradient accumulation] in exec/executor.h).
  UnitTable(const ParamLayout& layout, std::size_t act_floats, UnitSet set = UnitSet::Training, bool param_bf16 = false,
            std::size_t internals_floats = 0, bool grad_sum = false);
  // An Inference table whose layer l's activation unit (its KV cache) is layer_act_floats[l]
  // floats (Note [sliding KV cache] in infer/decoder.h: a sliding layer's holds its window);
  // act_floats() is the largest.
  UnitTable(const ParamLayout& layout, const std::vector<std::size_t>& layer_act_floats, bool param_bf16 = false);

  const ParamLayout& layout() const { return *layout_; }
  int count() const { return static_cast<int>(units_.size()); }
  // Unit index of (segment, kind, chunk); -1 when there is no such unit.
  int find(int segment, SegmentKind kind, int chunk = 0) const;
  int index(int segment, SegmentKind kind, int chunk = 0) const;  // asserts it exists
  int chunk_count(int segment, SegmentKind kind) const;

  int segment(int unit) const { return units_[unit].segment; }
  SegmentKind kind(int unit) const { return units_[unit].kind; }
  int chunk(int unit) const { return units_[unit].chunk; }
  std::size_t bytes(int unit) const { return units_[unit].bytes; }
  // The RAM a unit takes while a tiered store holds it: bytes, in whole 2 MiB blocks from just
  // under 2 MiB on (Note [whole huge pages]).
  std::size_t held_bytes(int unit) const;
  // The element type of a unit's storage (BF16 for params with param_bf16, else F32) and how
  // many elements its bytes hold (padding included; Note [typed views] in core/tensor_view.h).
  DType dtype(int unit) const { return dtype_of(units_[unit].segment, units_[unit].kind); }
  std::size_t elements(int unit) const { return units_[unit].bytes / dtype_size_bytes(dtype(unit)); }
  // The (segment, kind) file a unit lives in, and its offset there.
  int file(int unit) const { return units_[unit].file; }
  std::size_t file_offset_bytes(int unit) const { return units_[unit].file_offset_bytes; }
  int file_count() const { return static_cast<int>(file_bytes_.size()); }
  std::size_t file_bytes(int file) const { return file_bytes_[file]; }
  std::string file_name(int file) const;  // "layer.3.adam_m.bin"
  std::string name(int unit) const;       // "layer.3.adam_m[2]", "embed.params"
  std::size_t total_bytes() const;        // every unit
  // For a run that never acquires the units flagged in `unused` (per unit; empty: none; another
  // rank's moments, TieredStoreOptions::unused): per file, whether it holds a unit the run uses;
  // the bytes of those files (what it keeps on disk); the bytes of the units it uses.
  std::vector<bool> files_used(const std::vector<bool>& unused) const;
  std::size_t used_file_bytes(const std::vector<bool>& unused) const;
  std::size_t used_bytes(const std::vector<bool>& unused) const;
  std::size_t segment_bytes(int segment, SegmentKind kind) const;  // every chunk of (segment, kind)
  std::size_t segment_held_bytes(int segment, SegmentKind kind) const;  // the same, as held
  std::size_t act_floats() const { return act_floats_; }  // the largest activation unit's floats
  std::size_t internals_floats() const { return internals_floats_; }
  bool param_bf16() const { return param_bf16_; }
  bool grad_sum() const { return grad_sum_; }

 private:
  struct Unit {
    int segment;
    SegmentKind kind;
    int chunk;
    std::size_t bytes;
    int file;
    std::size_t file_offset_bytes;
  };
  // BF16 for the params of a param_bf16 table (inference: all but the LoRA adapters, which stay
  // fp32 beside a bf16 base, Note [lora segments]; training: the frozen layers); else F32.
  DType dtype_of(int segment, SegmentKind kind) const;

  void build(const std::vector<std::size_t>& layer_act_floats);

  const ParamLayout* layout_;
  std::size_t act_floats_;
  std::size_t internals_floats_;
  bool param_bf16_;
  bool grad_sum_;
  UnitSet set_;
  std::vector<Unit> units_;
  std::vector<int> first_unit_;   // [segment * kSegmentKindCount + kind] -> first unit, -1 if none
  std::vector<int> chunks_;       // [segment * kSegmentKindCount + kind] -> chunk count
  std::vector<std::size_t> file_bytes_;
  std::vector<std::string> file_names_;
};

}  // namespace stratum
