// UnitTable; see unit_table.h and Note [segment chunks].
#include "store/unit_table.h"

#include <algorithm>

#include "core/aligned_buffer.h"
#include "stratum/error.h"

namespace stratum {

UnitTable::UnitTable(const ParamLayout& layout, std::size_t act_floats, UnitSet set, bool param_bf16,
                     std::size_t internals_floats, bool grad_sum)
    : layout_(&layout),
      act_floats_(align_up(act_floats, 1024)),
      internals_floats_(align_up(internals_floats, 1024)),
      param_bf16_(param_bf16),
      grad_sum_(grad_sum && set == UnitSet::Training),
      set_(set) {
  STRATUM_ASSERT(set == UnitSet::Inference || !param_bf16 || layout.has_lora());
  STRATUM_ASSERT(set == UnitSet::Training || internals_floats == 0);
  build({});
}

UnitTable::UnitTable(const ParamLayout& layout, const std::vector<std::size_t>& layer_act_floats, bool param_bf16)
    : layout_(&layout),
      act_floats_(0),
      internals_floats_(0),
      param_bf16_(param_bf16),
      grad_sum_(false),
      set_(UnitSet::Inference) {
  STRATUM_ASSERT(std::count_if(layout.segments().begin(), layout.segments().end(), [](const SegmentLayout& seg) {
                   return seg.role == SegmentRole::Layer;
                 }) == static_cast<std::ptrdiff_t>(layer_act_floats.size()));
  std::vector<std::size_t> aligned;
  for (const std::size_t f : layer_act_floats) {
    aligned.push_back(align_up(f, 1024));
    act_floats_ = std::max(act_floats_, aligned.back());
  }
  build(aligned);
}

// The units, each (segment, kind) one file of its chunks back to back; layer l's activation unit
// is layer_act_floats[l] floats where given, else act_floats_.
void UnitTable::build(const std::vector<std::size_t>& layer_act_floats) {
  const ParamLayout& layout = *layout_;
  const UnitSet set = set_;
  const bool params_only = set != UnitSet::Training;
  const int segments = layout.segment_count();
  first_unit_.assign(static_cast<std::size_t>(segments) * kSegmentKindCount, -1);
  chunks_.assign(first_unit_.size(), 0);
  for (int s = 0; s < segments; ++s) {
    for (int k = 0; k < kSegmentKindCount; ++k) {
      const auto kind = static_cast<SegmentKind>(k);
      const bool state = kind == SegmentKind::Grads || kind == SegmentKind::AdamM || kind == SegmentKind::AdamV ||
                         kind == SegmentKind::GradSum;
      // Gradients and moments only where parameters are trained (Note [lora segments]).
      if (state && (params_only || !layout.trainable(s))) continue;
      if (kind == SegmentKind::GradSum && !grad_sum_) continue;
      std::vector<std::size_t> sizes;  // floats per chunk
      if (kind == SegmentKind::Internals) {
        if (layout.segments()[s].role == SegmentRole::Layer && internals_floats_ > 0) sizes.push_back(internals_floats_);
      } else if (kind != SegmentKind::Activations) {
        for (int c = 0; c < layout.segments()[s].chunk_count(); ++c) sizes.push_back(layout.segments()[s].chunk_floats(c));
      } else {
        const SegmentRole role = layout.segments()[s].role;
        const bool holds_act = role == SegmentRole::Layer || (role == SegmentRole::Head && set != UnitSet::Inference);
        const std::size_t floats = role == SegmentRole::Layer && !layer_act_floats.empty()
                                       ? layer_act_floats[static_cast<std::size_t>(s - layout.layer_segment(0))]
                                       : act_floats_;
        if (holds_act && floats > 0) sizes.push_back(floats);
      }
      if (sizes.empty()) continue;
      const std::size_t slot = static_cast<std::size_t>(s) * kSegmentKindCount + k;
      first_unit_[slot] = static_cast<int>(units_.size());
      chunks_[slot] = static_cast<int>(sizes.size());
      const int file = static_cast<int>(file_bytes_.size());
      std::size_t offset = 0;
      const std::size_t elem_bytes = dtype_size_bytes(dtype_of(s, kind));
      for (std::size_t c = 0; c < sizes.size(); ++c) {
        const std::size_t bytes = align_up(sizes[c] * elem_bytes, AlignedBuffer::kAlignmentBytes);  // whole 4 KiB blocks
        units_.push_back({s, kind, static_cast<int>(c), bytes, file, offset});
        offset += bytes;
      }
      file_bytes_.push_back(offset);
      file_names_.push_back(layout.segments()[s].name + "." + segment_kind_name(kind) + ".bin");
    }
  }
}

DType UnitTable::dtype_of(int segment, SegmentKind kind) const {
  if (!param_bf16_ || kind != SegmentKind::Params) return DType::F32;
  const SegmentRole role = layout_->segments()[segment].role;
  if (set_ == UnitSet::Inference) return role != SegmentRole::Lora ? DType::BF16 : DType::F32;
  // Training over a frozen base (Note [frozen bf16 base] in model/block_policy.h): its layers.
  return role == SegmentRole::Layer && !layout_->trainable(segment) ? DType::BF16 : DType::F32;
}

int UnitTable::find(int segment, SegmentKind kind, int chunk) const {
  if (segment < 0 || segment >= layout_->segment_count()) return -1;
  const std::size_t slot = static_cast<std::size_t>(segment) * kSegmentKindCount + static_cast<int>(kind);
  if (first_unit_[slot] < 0 || chunk < 0 || chunk >= chunks_[slot]) return -1;
  return first_unit_[slot] + chunk;
}

int UnitTable::index(int segment, SegmentKind kind, int chunk) const {
  const int unit = find(segment, kind, chunk);
  STRATUM_ASSERT(unit >= 0);
  return unit;
}

int UnitTable::chunk_count(int segment, SegmentKind kind) const {
  if (segment < 0 || segment >= layout_->segment_count()) return 0;
  return chunks_[static_cast<std::size_t>(segment) * kSegmentKindCount + static_cast<int>(kind)];
}

std::string UnitTable::file_name(int file) const { return file_names_[file]; }

std::string UnitTable::name(int unit) const {
  const Unit& u = units_[unit];
  std::string out = layout_->segments()[u.segment].name + "." + segment_kind_name(u.kind);
  if (chunks_[static_cast<std::size_t>(u.segment) * kSegmentKindCount + static_cast<int>(u.kind)] > 1)
    out += "[" + std::to_string(u.chunk) + "]";
  return out;
}

std::size_t UnitTable::total_bytes() const {
  std::size_t total = 0;
  for (const Unit& u : units_) total += u.bytes;
  return total;
}

std::vector<bool> UnitTable::files_used(const std::vector<bool>& unused) const {
  STRATUM_ASSERT(unused.empty() || unused.size() == units_.size());
  std::vector<bool> used(file_bytes_.size(), false);
  for (int u = 0; u < count(); ++u)
    if (unused.empty() || !unused[static_cast<std::size_t>(u)]) used[static_cast<std::size_t>(units_[u].file)] = true;
  return used;
}

std::size_t UnitTable::used_file_bytes(const std::vector<bool>& unused) const {
  const std::vector<bool> used = files_used(unused);
  std::size_t total = 0;
  for (std::size_t f = 0; f < used.size(); ++f) total += used[f] ? file_bytes_[f] : 0;
  return total;
}

std::size_t UnitTable::used_bytes(const std::vector<bool>& unused) const {
  STRATUM_ASSERT(unused.empty() || unused.size() == units_.size());
  std::size_t total = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) total += unused.empty() || !unused[u] ? units_[u].bytes : 0;
  return total;
}

std::size_t UnitTable::segment_bytes(int segment, SegmentKind kind) const {
  std::size_t total = 0;
  for (int c = 0; c < chunk_count(segment, kind); ++c) total += units_[index(segment, kind, c)].bytes;
  return total;
}

std::size_t UnitTable::held_bytes(int unit) const {  // Note [whole huge pages]
  constexpr std::size_t kBlock = AlignedBuffer::kBlockBytes;
  const std::size_t bytes = units_[unit].bytes;
  return bytes >= kBlock - kBlock / 64 ? align_up(bytes, kBlock) : bytes;
}

std::size_t UnitTable::segment_held_bytes(int segment, SegmentKind kind) const {
  std::size_t total = 0;
  for (int c = 0; c < chunk_count(segment, kind); ++c) total += held_bytes(index(segment, kind, c));
  return total;
}

}  // namespace stratum
