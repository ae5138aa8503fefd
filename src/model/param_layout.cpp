// GPT-2 parameter layout; see param_layout.h and Note [segment layout].
#include "model/param_layout.h"

#include <algorithm>

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
  SegmentBuilder(std::string name, SegmentRole role) {
    seg_.name = std::move(name);
    seg_.role = role;
    seg_.chunk_first = {0};
  }
  void add(std::string name, std::vector<std::int64_t> shape, std::int64_t row0 = 0,
           std::vector<std::int64_t> hf_shape = {}) {
    TensorSlot slot;
    slot.name = std::move(name);
    slot.numel = 1;
    for (auto d : shape) slot.numel *= static_cast<std::size_t>(d);
    slot.hf_shape = hf_shape.empty() ? shape : std::move(hf_shape);
    slot.shape = std::move(shape);
    slot.row0 = row0;
    slot.weight_decay = slot.shape.size() >= 2;
    // Note [segment chunks]: a new chunk (4 KiB aligned) when this tensor would overflow a
    // chunk that already holds a fair share of kChunkFloats.
    const std::size_t used = cursor_ - seg_.chunk_first.back();
    if (used > 0 && used + slot.numel > kChunkFloats && used >= kChunkFloats / 8) {
      cursor_ = align_up(cursor_, 1024);
      seg_.chunk_first.push_back(cursor_);
    }
    slot.chunk = seg_.chunk_count() - 1;
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

int vocab_block_rows(const GptConfig& cfg) {
  const std::size_t by_size = std::max<std::size_t>(1, kVocabBlockFloats / static_cast<std::size_t>(cfg.n_embd));
  const std::size_t by_count = (static_cast<std::size_t>(cfg.vocab_size) + kMinVocabBlocks - 1) / kMinVocabBlocks;
  return static_cast<int>(std::max<std::size_t>(1, std::min(by_size, by_count)));
}

int ParamLayout::vocab_rows(int block) const {
  return std::min(vocab_rows_, vocab_size_ - vocab_row0(block));
}

ParamLayout ParamLayout::gpt2(const GptConfig& cfg) {
  cfg.validate();
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = cfg.n_ctx;
  ParamLayout layout;
  SegmentBuilder embed("embed", SegmentRole::Embed);
  embed.add("wpe.weight", {N, C});
  layout.segments_.push_back(embed.finish());
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    SegmentBuilder block("layer." + std::to_string(i), SegmentRole::Layer);
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
  SegmentBuilder head("head", SegmentRole::Head);
  head.add("ln_f.weight", {C});
  head.add("ln_f.bias", {C});
  layout.head_segment_ = static_cast<int>(layout.segments_.size());
  layout.segments_.push_back(head.finish());
  layout.vocab_rows_ = stratum::vocab_block_rows(cfg);
  layout.vocab_size_ = cfg.vocab_size;
  for (int b = 0; layout.vocab_row0(b) < cfg.vocab_size; ++b) {
    SegmentBuilder block("wte." + std::to_string(b), SegmentRole::Vocab);
    block.add("wte.weight", {layout.vocab_rows(b), C}, layout.vocab_row0(b), {V, C});
    layout.segments_.push_back(block.finish());
  }
  return layout;
}

std::size_t ParamLayout::num_params() const {
  std::size_t total = 0;
  for (const auto& seg : segments_)
    for (const auto& t : seg.tensors) total += t.numel;
  return total;
}

std::vector<std::pair<int, int>> ParamLayout::find(std::string_view hf_name) const {
  constexpr std::string_view kPrefix = "transformer.";
  if (hf_name.substr(0, kPrefix.size()) == kPrefix) hf_name.remove_prefix(kPrefix.size());
  std::vector<std::pair<int, int>> found;
  for (int s = 0; s < segment_count(); ++s)
    for (int t = 0; t < static_cast<int>(segments_[s].tensors.size()); ++t)
      if (segments_[s].tensors[t].name == hf_name) found.emplace_back(s, t);
  return found;
}

}  // namespace stratum
