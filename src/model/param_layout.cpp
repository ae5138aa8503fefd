// GPT-2 parameter layout; see param_layout.h and Note [segment layout].
#include "model/param_layout.h"

#include "core/aligned_buffer.h"

namespace stratum {

const char* segment_kind_name(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::Params: return "params";
    case SegmentKind::Grads: return "grads";
    case SegmentKind::AdamM: return "adam_m";
    case SegmentKind::AdamV: return "adam_v";
    case SegmentKind::Activations: return "acts";
  }
  return "?";
}

namespace {
class SegmentBuilder {
 public:
  explicit SegmentBuilder(std::string name) { seg_.name = std::move(name); }
  void add(std::string name, std::vector<std::int64_t> shape) {
    TensorSlot slot;
    slot.name = std::move(name);
    slot.numel = 1;
    for (auto d : shape) slot.numel *= static_cast<std::size_t>(d);
    slot.shape = std::move(shape);
    slot.weight_decay = slot.shape.size() >= 2;
    slot.offset_floats = cursor_;
    cursor_ = align_up(cursor_ + slot.numel, 16);  // 64-byte alignment
    seg_.tensors.push_back(std::move(slot));
  }
  SegmentLayout finish() {
    seg_.size_floats = align_up(cursor_, 1024);  // 4 KiB
    return std::move(seg_);
  }

 private:
  SegmentLayout seg_;
  std::size_t cursor_ = 0;
};
}  // namespace

ParamLayout ParamLayout::gpt2(const GptConfig& cfg) {
  cfg.validate();
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = cfg.n_ctx;
  ParamLayout layout;
  SegmentBuilder embed("embed");
  embed.add("wte.weight", {V, C});
  embed.add("wpe.weight", {N, C});
  layout.segments_.push_back(embed.finish());
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    SegmentBuilder block("layer." + std::to_string(i));
    block.add(p + "ln_1.weight", {C});
    block.add(p + "ln_1.bias", {C});
    block.add(p + "attn.c_attn.weight", {C, 3 * C});
    block.add(p + "attn.c_attn.bias", {3 * C});
    block.add(p + "attn.c_proj.weight", {C, C});
    block.add(p + "attn.c_proj.bias", {C});
    block.add(p + "ln_2.weight", {C});
    block.add(p + "ln_2.bias", {C});
    block.add(p + "mlp.c_fc.weight", {C, 4 * C});
    block.add(p + "mlp.c_fc.bias", {4 * C});
    block.add(p + "mlp.c_proj.weight", {4 * C, C});
    block.add(p + "mlp.c_proj.bias", {C});
    layout.segments_.push_back(block.finish());
  }
  SegmentBuilder head("head");
  head.add("ln_f.weight", {C});
  head.add("ln_f.bias", {C});
  layout.segments_.push_back(head.finish());
  return layout;
}

std::size_t ParamLayout::num_params() const {
  std::size_t total = 0;
  for (const auto& seg : segments_)
    for (const auto& t : seg.tensors) total += t.numel;
  return total;
}

bool ParamLayout::find(std::string_view hf_name, int* segment, int* tensor) const {
  constexpr std::string_view kPrefix = "transformer.";
  if (hf_name.substr(0, kPrefix.size()) == kPrefix) hf_name.remove_prefix(kPrefix.size());
  for (int s = 0; s < segment_count(); ++s)
    for (int t = 0; t < static_cast<int>(segments_[s].tensors.size()); ++t)
      if (segments_[s].tensors[t].name == hf_name) {
        *segment = s;
        *tensor = t;
        return true;
      }
  return false;
}

}  // namespace stratum
