// GPT-2 and Llama parameter layouts; see param_layout.h and Note [segment layout].
#include "model/param_layout.h"

#include <algorithm>

#include "core/aligned_buffer.h"
#include "stratum/error.h"

namespace stratum {

const char* segment_kind_name(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::Params: return "params";
    case SegmentKind::Grads: return "grads";
    case SegmentKind::AdamM: return "adam_m";
    case SegmentKind::AdamV: return "adam_v";
    case SegmentKind::Activations: return "acts";
    case SegmentKind::Internals: return "internals";
    case SegmentKind::GradSum: return "grad_sum";
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
    seg_.size_floats = std::max<std::size_t>(1024, align_up(cursor_, 1024));  // 4 KiB; an empty segment is one page
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

ParamLayout ParamLayout::of(const GptConfig& cfg) {
  ParamLayout layout = cfg.llama() ? llama(cfg) : gpt2(cfg);
  layout.load_prefix_ = cfg.weights_prefix;  // Note [gemma3 multimodal]
  return layout;
}

ParamLayout ParamLayout::of(const GptConfig& cfg, const LoraConfig& lora) {
  ParamLayout layout = of(cfg);
  layout.lora_family_ = lora_family(cfg);
  if (!lora.on()) return layout;
  const std::array<bool, kLoraMaxTargets> on = lora_config_validate(lora, layout.lora_family_);
  const std::vector<std::string>& modules = lora_modules(layout.lora_family_);
  layout.lora_ = lora;
  layout.lora_first_ = layout.segment_count();
  const std::int64_t r = lora.r;
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = (cfg.llama() ? "model.layers." : "h.") + std::to_string(i) + ".";
    SegmentBuilder seg("lora." + std::to_string(i), SegmentRole::Lora);
    int slot = 0;
    for (std::size_t k = 0; k < modules.size(); ++k) {
      if (!on[k]) continue;
      if (k > 0 && modules[k] == modules[k - 1]) {  // a fused module's later part (Note [fused lora])
        layout.lora_slot_[k] = layout.lora_slot_[k - 1];
        layout.lora_b_row0_[k] = layout.lora_b_row0_[k - 1] + lora_module_dims(cfg, static_cast<int>(k) - 1)[1];
        continue;
      }
      const auto [in, out] = lora_module_dims(cfg, static_cast<int>(k));
      std::int64_t rows = out;  // B's: the module's parts' outputs together
      for (std::size_t j = k + 1; j < modules.size() && modules[j] == modules[k]; ++j)
        rows += lora_module_dims(cfg, static_cast<int>(j))[1];
      seg.add(p + modules[k] + ".lora_A.weight", {r, in});
      seg.add(p + modules[k] + ".lora_B.weight", {rows, r});
      layout.lora_slot_[k] = slot;
      slot += 2;
    }
    layout.segments_.push_back(seg.finish());
  }
  return layout;
}

ParamLayout ParamLayout::gpt2(const GptConfig& cfg) {
  cfg.validate();
  STRATUM_ASSERT(!cfg.llama());
  const std::int64_t C = cfg.n_embd, N = cfg.n_ctx;
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
    layout.segments_.back().layer = i;
  }
  SegmentBuilder head("head", SegmentRole::Head);
  head.add("ln_f.weight", {C});
  head.add("ln_f.bias", {C});
  layout.head_segment_ = static_cast<int>(layout.segments_.size());
  layout.segments_.push_back(head.finish());
  layout.vocab_blocks_add("wte", "wte.weight", SegmentRole::Vocab, cfg);
  layout.hf_prefix_ = "transformer.";
  return layout;
}

void ParamLayout::vocab_blocks_add(const std::string& segment, const std::string& tensor, SegmentRole role,
                                   const GptConfig& cfg) {
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size;
  vocab_rows_ = stratum::vocab_block_rows(cfg);
  vocab_size_ = cfg.vocab_size;
  int b = 0;
  for (; vocab_row0(b) < cfg.vocab_size; ++b) {
    SegmentBuilder block(segment + "." + std::to_string(b), role);
    block.add(tensor, {vocab_rows(b), C}, vocab_row0(b), {V, C});
    segments_.push_back(block.finish());
  }
  vocab_blocks_ = b;
}

ParamLayout ParamLayout::llama(const GptConfig& cfg) {
  cfg.validate();
  STRATUM_ASSERT(cfg.llama());
  const std::int64_t C = cfg.n_embd, Q = cfg.q_dim(), KV = cfg.kv_dim(), I = cfg.mlp_width();
  ParamLayout layout;
  layout.arch_ = ModelArch::Llama;
  layout.family_title_ = cfg.family_title();
  layout.segments_.push_back(SegmentBuilder("embed", SegmentRole::Embed).finish());  // no position table
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    SegmentBuilder block("layer." + std::to_string(i), SegmentRole::Layer);
    block.add(p + "input_layernorm.weight", {C});
    if (cfg.fused_projections()) {  // Note [phi3 fused]: each slot its rows of the fused tensor
      const std::string qkv = p + "self_attn.qkv_proj.weight";
      block.add(qkv, {Q, C}, 0, {Q + 2 * KV, C});
      block.add(qkv, {KV, C}, Q, {Q + 2 * KV, C});
      block.add(qkv, {KV, C}, Q + KV, {Q + 2 * KV, C});
    } else {
      block.add(p + "self_attn.q_proj.weight", {Q, C});
      block.add(p + "self_attn.k_proj.weight", {KV, C});
      block.add(p + "self_attn.v_proj.weight", {KV, C});
    }
    block.add(p + "self_attn.o_proj.weight", {C, Q});
    // Note [gemma3]: Gemma 3's MLP input norm is pre_feedforward_layernorm; its
    // post_attention_layernorm norms the attention's output (llama_post_norm_slot, below).
    block.add(p + (cfg.post_norms() ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"), {C});
    if (cfg.fused_projections()) {
      block.add(p + "mlp.gate_up_proj.weight", {I, C}, 0, {2 * I, C});
      block.add(p + "mlp.gate_up_proj.weight", {I, C}, I, {2 * I, C});
    } else {
      block.add(p + "mlp.gate_proj.weight", {I, C});
      block.add(p + "mlp.up_proj.weight", {I, C});
    }
    block.add(p + "mlp.down_proj.weight", {C, I});
    if (cfg.qkv_bias()) {  // kQB, kKB, kVB
      block.add(p + "self_attn.q_proj.bias", {Q});
      block.add(p + "self_attn.k_proj.bias", {KV});
      block.add(p + "self_attn.v_proj.bias", {KV});
    }
    if (cfg.qk_norm()) {  // kQNormW, kKNormW
      block.add(p + "self_attn.q_norm.weight", {cfg.head_dim()});
      block.add(p + "self_attn.k_norm.weight", {cfg.head_dim()});
    }
    if (cfg.post_norms()) {  // llama_post_norm_slot and the next (Note [gemma3])
      block.add(p + "post_attention_layernorm.weight", {C});
      block.add(p + "post_feedforward_layernorm.weight", {C});
    }
    layout.segments_.push_back(block.finish());
    layout.segments_.back().layer = i;
  }
  SegmentBuilder head("head", SegmentRole::Head);
  head.add("model.norm.weight", {C});
  layout.head_segment_ = static_cast<int>(layout.segments_.size());
  layout.segments_.push_back(head.finish());
  layout.vocab_blocks_add("embed_tokens", "model.embed_tokens.weight", SegmentRole::Vocab, cfg);
  layout.head_tied_ = cfg.tie_word_embeddings;
  if (!layout.head_tied_) {
    const int embed_blocks = layout.vocab_blocks_;
    layout.vocab_blocks_add("lm_head", "lm_head.weight", SegmentRole::HeadVocab, cfg);
    STRATUM_ASSERT(layout.vocab_blocks_ == embed_blocks);
  }
  return layout;
}

std::size_t ParamLayout::num_params() const {
  std::size_t total = 0;
  for (const auto& seg : segments_)
    for (const auto& t : seg.tensors) total += t.numel;
  return total;
}

bool ParamLayout::mlp_frozen() const {
  if (!has_lora()) return false;
  for (int k = 0; k < static_cast<int>(lora_modules(lora_family_).size()); ++k)
    if (lora_slot_[k] >= 0 && lora_module_in_mlp(lora_family_, k)) return false;
  return true;
}

std::size_t ParamLayout::num_trainable_params() const {
  std::size_t total = 0;
  for (int s = 0; s < segment_count(); ++s)
    if (trainable(s))
      for (const auto& t : segments_[s].tensors) total += t.numel;
  return total;
}

std::vector<std::pair<int, int>> ParamLayout::find(std::string_view hf_name) const {
  std::string renamed;
  if (!load_prefix_.empty()) {  // Note [gemma3 multimodal]: as released, or as newer transformers save it
    if (hf_name.substr(0, load_prefix_.size()) == load_prefix_) {
      hf_name.remove_prefix(load_prefix_.size());
    } else if (hf_name.starts_with("model.") && hf_name.substr(6, load_prefix_.size()) == load_prefix_) {
      renamed = "model." + std::string(hf_name.substr(6 + load_prefix_.size()));
      hf_name = renamed;
    }
  }
  if (!hf_prefix_.empty() && hf_name.substr(0, hf_prefix_.size()) == hf_prefix_) hf_name.remove_prefix(hf_prefix_.size());
  std::vector<std::pair<int, int>> found;
  for (int s = 0; s < segment_count(); ++s)
    for (int t = 0; t < static_cast<int>(segments_[s].tensors.size()); ++t)
      if (segments_[s].tensors[t].name == hf_name) found.emplace_back(s, t);
  return found;
}

}  // namespace stratum
