// Family dispatch for one transformer block; see transformer_block.h.
#include "model/transformer_block.h"

namespace stratum {

TransformerBlock::TransformerBlock(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, int copies) : cfg_(cfg) {
  if (cfg.llama()) {
    llama_acts_.reserve(static_cast<std::size_t>(copies));
    for (int i = 0; i < copies; ++i) llama_acts_.emplace_back(cfg, max_batch, max_seq);
    llama_work_ = std::make_unique<LlamaWorkspace>(ops, cfg, max_batch, max_seq);
    rope_ = std::make_unique<RopeTable>(cfg.head_dim(), max_seq, cfg.rope_theta, cfg.rope_scaling);
  } else {
    gpt2_acts_.reserve(static_cast<std::size_t>(copies));
    for (int i = 0; i < copies; ++i) gpt2_acts_.emplace_back(cfg, max_batch, max_seq);
    gpt2_work_ = std::make_unique<Gpt2Workspace>(ops, cfg, max_batch, max_seq);
  }
}

std::size_t TransformerBlock::size_bytes() const {
  if (cfg_.llama())
    return llama_acts_.size() * llama_acts_[0].size_bytes() + llama_work_->size_bytes() +
           2 * sizeof(float) * static_cast<std::size_t>(rope_->max_pos()) * (rope_->head_dim() / 2);
  return gpt2_acts_.size() * gpt2_acts_[0].size_bytes() + gpt2_work_->size_bytes();
}

void TransformerBlock::forward(const Ops& ops, const SegmentLayout& seg, float* const* params, const float* x,
                               float* out, int copy, int B, int T) {
  if (cfg_.llama()) {
    llama_block_forward(ops, GemmLinear{}, CausalAttention{}, cfg_, *rope_, llama_block_tensors(seg, params), x, out,
                        llama_acts_[copy], llama_work_->tmp, llama_work_->attn_scratch, B, T);
  } else {
    gpt2_block_forward(ops, GemmLinear{}, CausalAttention{}, cfg_, gpt2_block_tensors(seg, params), x, out,
                       gpt2_acts_[copy], gpt2_work_->tmp, gpt2_work_->attn_scratch, B, T);
  }
}

void TransformerBlock::backward(const Ops& ops, const SegmentLayout& seg, float* const* params, float* const* grads,
                                const float* x, const float* dout, float* dx, int copy, int B, int T, bool recompute) {
  if (cfg_.llama()) {
    llama_block_backward(ops, cfg_, *rope_, llama_block_tensors(seg, params), llama_block_tensors(seg, grads), x, dout,
                         dx, llama_acts_[copy], *llama_work_, B, T, recompute);
  } else {
    gpt2_block_backward(ops, cfg_, gpt2_block_tensors(seg, params), gpt2_block_tensors(seg, grads), x, dout, dx,
                        gpt2_acts_[copy], *gpt2_work_, B, T, recompute);
  }
}

}  // namespace stratum
