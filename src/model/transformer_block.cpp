// Family dispatch for one transformer block; see transformer_block.h.
#include "model/transformer_block.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "core/zo_noise.h"
#include "stratum/error.h"

namespace stratum {

TransformerBlock::TransformerBlock(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, int copies,
                                   const ParamLayout* layout, bool bf16_weights, bool recompute, bool backward,
                                   BlockRows rows)
    : cfg_(cfg), max_batch_(max_batch), max_seq_(max_seq) {
  if (layout != nullptr && layout->has_lora()) {
    layout_ = layout;
    lora_rows_ = static_cast<std::size_t>(max_batch) * max_seq;
    const std::size_t r = static_cast<std::size_t>(layout->lora().r);
    for (int i = 0; i < copies; ++i) lora_u_.emplace_back(ops, lora_u_floats(max_batch, max_seq, layout) * sizeof(float));
    lora_du_ = OpsBuffer(ops, lora_rows_ * r * sizeof(float));
    if (layout->lora().dropout > 0) {
      std::size_t widest = 0;
      for (int k = 0; k < kLoraMaxTargets; ++k)
        if (layout->lora_slot(k) >= 0) widest = std::max<std::size_t>(widest, lora_module_dims(cfg, k)[0]);
      lora_xd_ = OpsBuffer(ops, lora_rows_ * widest * sizeof(float));
    }
  }
  // Note [frozen MLP rows]: only an MLP half with nothing to train in this run goes in sub-chunks,
  // and keeps hmid in gate's rows where its set is recomputed (Note [hmid in the workspace]).
  const bool mlp_frozen = !backward || (layout != nullptr && layout->mlp_frozen());
  STRATUM_ASSERT(rows.chunk >= 1 && rows.mlp >= 1 && rows.mlp <= rows.chunk);
  STRATUM_ASSERT(rows.mlp == rows.chunk || (mlp_sub_chunks_exact(cfg) && mlp_frozen));
  if (cfg.llama()) {
    // Note [post norms]: Gemma 3's backward needs hmid, so its gate rows keep gate.
    llama_work_ = std::make_unique<LlamaWorkspace>(ops, cfg, max_batch, max_seq, bf16_weights, backward, rows,
                                                   mlp_frozen && recompute && !cfg.post_norms());
    llama_acts_.reserve(static_cast<std::size_t>(copies));
    for (int i = 0; i < copies; ++i) llama_acts_.emplace_back(ops, cfg, max_batch, max_seq, true, llama_work_.get(), recompute);
    ropes_ = std::make_unique<LlamaRopes>(cfg, max_seq);
  } else {
    gpt2_work_ = std::make_unique<Gpt2Workspace>(ops, cfg, max_batch, max_seq, bf16_weights, backward, rows,
                                                 mlp_frozen && recompute);
    gpt2_acts_.reserve(static_cast<std::size_t>(copies));
    for (int i = 0; i < copies; ++i) gpt2_acts_.emplace_back(ops, cfg, max_batch, max_seq, true, gpt2_work_.get(), recompute);
  }
}

std::size_t TransformerBlock::size_bytes() const {
  std::size_t lora = lora_du_.size_bytes() + lora_xd_.size_bytes();
  for (const OpsBuffer& u : lora_u_) lora += u.size_bytes();
  return lora + internals_bytes();
}

std::size_t TransformerBlock::internals_bytes() const {
  std::size_t total = 0;
  if (cfg_.llama()) {
    for (const LlamaActivations& a : llama_acts_) total += a.size_bytes();
    return total + llama_work_->size_bytes() + LlamaRopes::bytes_for(cfg_, max_seq_);
  }
  for (const Gpt2Activations& a : gpt2_acts_) total += a.size_bytes();
  return total + gpt2_work_->size_bytes();
}

std::size_t TransformerBlock::held_floats(const GptConfig& cfg, int max_batch, int max_seq, const ParamLayout* layout) {
  const std::size_t acts = cfg.llama() ? LlamaActivations::bytes_for(cfg, max_batch, max_seq, true, true)
                                       : Gpt2Activations::bytes_for(cfg, max_batch, max_seq, true, true);
  return acts / sizeof(float) + lora_u_floats(max_batch, max_seq, layout);
}

std::size_t TransformerBlock::lora_u_floats(int max_batch, int max_seq, const ParamLayout* layout) {
  if (layout == nullptr || !layout->has_lora()) return 0;
  return kLoraMaxTargets * static_cast<std::size_t>(max_batch) * max_seq * static_cast<std::size_t>(layout->lora().r);
}

LlamaActivations& TransformerBlock::internals(InternalsAt at, std::optional<LlamaActivations>& view) {
  if (at.held == nullptr) return llama_acts_[static_cast<std::size_t>(at.copy)];
  return view.emplace(cfg_, max_batch_, max_seq_, *llama_work_, at.held);
}

Gpt2Activations& TransformerBlock::internals(InternalsAt at, std::optional<Gpt2Activations>& view) {
  if (at.held == nullptr) return gpt2_acts_[static_cast<std::size_t>(at.copy)];
  return view.emplace(cfg_, max_batch_, max_seq_, *gpt2_work_, at.held);
}

LoraBlock lora_block_of(const ParamLayout& layout, const LoraChunks& c) {
  STRATUM_ASSERT(layout.has_lora());
  LoraBlock l;
  l.r = layout.lora().r;
  l.scale = layout.lora().scale();
  const SegmentLayout& seg = *c.seg;
  auto at = [&](float* const* chunks, int i) {
    const TensorSlot& t = seg.tensors[i];
    return chunks[t.chunk] + seg.offset_in_chunk(t);
  };
  for (int k = 0; k < kLoraMaxTargets; ++k) {
    const int slot = layout.lora_slot(k);
    if (slot < 0 || c.params[seg.tensors[slot].chunk] == nullptr) continue;
    // A fused module's part: its rows of lora_B, dA added to the earlier parts' (Note [fused lora]).
    const std::size_t b_at = static_cast<std::size_t>(layout.lora_b_row0(k)) * static_cast<std::size_t>(l.r);
    l.t[k].da_adds = layout.lora_b_row0(k) > 0;
    l.t[k].a = at(c.params, slot);
    l.t[k].b = at(c.params, slot + 1) + b_at;
    if (c.grads != nullptr) {
      l.t[k].da = at(c.grads, slot);
      l.t[k].db = at(c.grads, slot + 1) + b_at;
    }
    if (c.dropout) {  // key of the module's HF name (Note [lora dropout])
      const std::string a_name = layout.hf_name(seg.tensors[slot]);
      static constexpr std::string_view kSuffix = ".lora_A.weight";
      STRATUM_ASSERT(a_name.size() > kSuffix.size());
      const std::string_view module = std::string_view(a_name).substr(0, a_name.size() - kSuffix.size());
      l.t[k].drop_key = zo_tensor_key(c.dropout_step_key, module);
      l.dropout = static_cast<float>(layout.lora().dropout);
    }
  }
  return l;
}

int lora_base_slot(ModelArch arch, int k) {
  static const int gpt2[] = {kAttnW, kAttnProjW, kFcW, kMlpProjW};
  static const int llama[] = {kQW, kKW, kVW, kOW, kGateW, kUpW, kDownW};
  return arch == ModelArch::Llama ? llama[k] : gpt2[k];
}

LoraBlock TransformerBlock::lora_block(const LoraChunks& c, InternalsAt at, int BT) {
  STRATUM_ASSERT(layout_ != nullptr && static_cast<std::size_t>(BT) <= lora_rows_);
  LoraBlock l = lora_block_of(*layout_, c);
  l.du = lora_du_.as_f32();
  if (l.dropout > 0) l.xd = lora_xd_.as_f32();
  // Held: the x A^T buffers follow the activations in the held memory (held_floats).
  float* const u = at.held != nullptr
                       ? at.held + held_floats(cfg_, max_batch_, max_seq_, nullptr)
                       : lora_u_[static_cast<std::size_t>(at.copy)].as_f32();
  for (int k = 0; k < kLoraMaxTargets; ++k)
    if (l.t[k].a != nullptr) l.t[k].u = u + static_cast<std::size_t>(k) * lora_rows_ * l.r;
  return l;
}

void TransformerBlock::forward(const Ops& ops, const SegmentLayout& seg, const TensorView* params, const float* x,
                               float* out, InternalsAt at, int B, int T, const LoraChunks* lora, BlockPart part) {
  // Note [longrope]: the long factors' tables are for sequences of max_seq, as transformers picks them.
  STRATUM_ASSERT(T == max_seq_ || !cfg_.rope_long_factors(max_seq_));
  const LoraBlock l = lora != nullptr ? lora_block(*lora, at, B * T) : LoraBlock{};
  const LoraBlock* lp = lora != nullptr ? &l : nullptr;
  if (cfg_.llama()) {
    LlamaWorkspace& w = *llama_work_;
    std::optional<LlamaActivations> view;
    llama_block_forward(ops, GemmLinear{w.wide, w.wide_floats}, CausalAttention{}, cfg_, ropes_->layer(seg.layer),
                        cfg_.layer_scores(seg.layer),
                        llama_block_tensors(ops, seg, params, w.wide_vectors, &cfg_), x, out, internals(at, view), w.tmp,
                        w.attn_scratch, B, T, lp, part);
  } else {
    Gpt2Workspace& w = *gpt2_work_;
    std::optional<Gpt2Activations> view;
    gpt2_block_forward(ops, GemmLinear{w.wide, w.wide_floats}, CausalAttention{}, cfg_, gpt2_block_tensors(ops, seg, params, w.wide_vectors),
                       x, out, internals(at, view), w.tmp, w.attn_scratch, B, T, lp, part);
  }
}

void TransformerBlock::backward(const Ops& ops, const SegmentLayout& seg, const TensorView* params,
                                const TensorView* grads, const float* x, const float* dout, float* dx, InternalsAt at,
                                int B, int T, bool recompute, const LoraChunks* lora, BlockPart part) {
  const LoraBlock l = lora != nullptr ? lora_block(*lora, at, B * T) : LoraBlock{};
  const LoraBlock* lp = lora != nullptr ? &l : nullptr;
  if (cfg_.llama()) {
    std::optional<LlamaActivations> view;
    const LlamaBlockTensors g = grads != nullptr ? llama_block_tensors(ops, seg, grads, nullptr, nullptr) : LlamaBlockTensors{};
    llama_block_backward(ops, cfg_, ropes_->layer(seg.layer), cfg_.layer_scores(seg.layer), llama_block_tensors(ops, seg, params, llama_work_->wide_vectors, &cfg_),
                         grads != nullptr ? &g : nullptr, x, dout, dx, internals(at, view), *llama_work_, B, T,
                         recompute, lp, part);
  } else {
    std::optional<Gpt2Activations> view;
    const Gpt2BlockTensors g = grads != nullptr ? gpt2_block_tensors(ops, seg, grads, nullptr) : Gpt2BlockTensors{};
    gpt2_block_backward(ops, cfg_, gpt2_block_tensors(ops, seg, params, gpt2_work_->wide_vectors),
                        grads != nullptr ? &g : nullptr, x, dout, dx, internals(at, view), *gpt2_work_, B, T, recompute,
                        lp, part);
  }
}

}  // namespace stratum
