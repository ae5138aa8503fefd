// Executor: the per-step schedule over segments; see executor.h and Note [step schedule].
#include "train/executor.h"

#include <cstring>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "stratum/error.h"

namespace stratum {

Executor::Executor(ThreadPool& pool, const GptConfig& config, const ParamLayout& layout, SegmentStore& store,
                   int max_batch, int max_seq, bool keep_activations)
    : pool_(pool),
      cfg_(config),
      layout_(layout),
      store_(store),
      max_batch_(max_batch),
      max_seq_(max_seq),
      act_stride_(align_up(static_cast<std::size_t>(max_batch) * max_seq * config.n_embd, 16)),
      acts_(static_cast<std::size_t>(config.n_layer + 1) * act_stride_ * sizeof(float)),
      dacts_(2 * act_stride_ * sizeof(float)),
      keep_activations_(keep_activations),
      workspace_(config, max_batch, max_seq),
      head_scratch_(config, max_batch * max_seq) {
  STRATUM_CHECK(max_seq <= config.n_ctx, "[train] sequence length ", max_seq, " exceeds the model context ",
                config.n_ctx, " (use --seq <= ", config.n_ctx, ")");
  const int copies = keep_activations ? config.n_layer : 1;
  block_acts_.reserve(static_cast<std::size_t>(copies));
  for (int i = 0; i < copies; ++i) block_acts_.emplace_back(config, max_batch, max_seq);
}

std::size_t Executor::activation_bytes() const {
  return acts_.size_bytes() + dacts_.size_bytes() + block_acts_.size() * block_acts_[0].size_bytes() +
         workspace_.size_bytes() + head_scratch_.size_bytes();
}

void Executor::check_shape(int B, int T) const {
  STRATUM_ASSERT(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_);
}

void Executor::forward_blocks(const std::int32_t* inputs, int B, int T) {
  const auto& segs = layout_.segments();
  {
    SegmentHold embed(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
    const auto& seg = segs[layout_.embed_segment()];
    embedding_forward(pool_, act(0), inputs, embed.data() + seg.tensors[kWte].offset_floats,
                      embed.data() + seg.tensors[kWpe].offset_floats, B, T, cfg_.n_embd);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const int s = layout_.layer_segment(l);
    SegmentHold params(store_, s, SegmentKind::Params, Access::Read);
    gpt2_block_forward(pool_, cfg_, gpt2_block_tensors(segs[s], params.data()), act(l), act(l + 1),
                       block_acts(l), workspace_, B, T);
  }
}

float Executor::forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  check_shape(B, T);
  const auto& segs = layout_.segments();
  const int C = cfg_.n_embd;
  const auto& embed_seg = segs[layout_.embed_segment()];
  const auto& head_seg = segs[layout_.head_segment()];
  forward_blocks(inputs, B, T);

  float* dcur = dacts_.as_f32();
  float* dnext = dacts_.as_f32() + act_stride_;
  float loss = 0.0f;
  {
    SegmentHold head_p(store_, layout_.head_segment(), SegmentKind::Params, Access::Read);
    SegmentHold head_g(store_, layout_.head_segment(), SegmentKind::Grads, Access::Overwrite);
    SegmentHold embed_p(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
    SegmentHold embed_g(store_, layout_.embed_segment(), SegmentKind::Grads, Access::Overwrite);
    // wte's gradient is overwritten by the head's first chunk (Note [head chunks]); wpe's is
    // accumulated by the embedding backward, so it starts from zero.
    std::memset(embed_g.data() + embed_seg.tensors[kWpe].offset_floats, 0,
                embed_seg.tensors[kWpe].numel * sizeof(float));
    Gpt2HeadParams hp{head_p.data() + head_seg.tensors[kLnFW].offset_floats,
                      head_p.data() + head_seg.tensors[kLnFB].offset_floats,
                      embed_p.data() + embed_seg.tensors[kWte].offset_floats};
    Gpt2HeadGrads hg{head_g.data() + head_seg.tensors[kLnFW].offset_floats,
                     head_g.data() + head_seg.tensors[kLnFB].offset_floats,
                     embed_g.data() + embed_seg.tensors[kWte].offset_floats, dcur};
    loss = gpt2_head_loss(pool_, cfg_, hp, &hg, act(cfg_.n_layer), targets, B * T, head_scratch_);
  }
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const int s = layout_.layer_segment(l);
    SegmentHold params(store_, s, SegmentKind::Params, Access::Read);
    SegmentHold grads(store_, s, SegmentKind::Grads, Access::Overwrite);
    gpt2_block_backward(pool_, cfg_, gpt2_block_tensors(segs[s], params.data()),
                        gpt2_block_tensors(segs[s], grads.data()), act(l), dcur, dnext, block_acts(l), workspace_, B, T,
                        !keep_activations_);
    std::swap(dcur, dnext);
  }
  {
    SegmentHold embed_g(store_, layout_.embed_segment(), SegmentKind::Grads, Access::Update);
    embedding_backward(pool_, embed_g.data() + embed_seg.tensors[kWte].offset_floats,
                       embed_g.data() + embed_seg.tensors[kWpe].offset_floats, dcur, inputs, B, T, C);
  }
  return loss;
}

float Executor::head_inference(const std::int32_t* targets, int BT, int logits_row, float* logits) {
  const auto& segs = layout_.segments();
  SegmentHold head_p(store_, layout_.head_segment(), SegmentKind::Params, Access::Read);
  SegmentHold embed_p(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
  const auto& head_seg = segs[layout_.head_segment()];
  Gpt2HeadParams hp{head_p.data() + head_seg.tensors[kLnFW].offset_floats,
                    head_p.data() + head_seg.tensors[kLnFB].offset_floats,
                    embed_p.data() + segs[layout_.embed_segment()].tensors[kWte].offset_floats};
  if (logits == nullptr) return gpt2_head_loss(pool_, cfg_, hp, nullptr, act(cfg_.n_layer), targets, BT, head_scratch_);
  const float* row = act(cfg_.n_layer) + static_cast<std::size_t>(logits_row) * cfg_.n_embd;
  gpt2_head_logits_row(pool_, cfg_, hp, row, logits, head_scratch_);
  return 0.0f;
}

float Executor::loss(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  check_shape(B, T);
  forward_blocks(inputs, B, T);
  return head_inference(targets, B * T, 0, nullptr);
}

void Executor::logits_last(const std::int32_t* tokens, int T, float* logits) {
  check_shape(1, T);
  forward_blocks(tokens, 1, T);
  head_inference(nullptr, T, T - 1, logits);
}

double Executor::grad_sum_squares() {
  double total = 0.0;
  for (int s = 0; s < layout_.segment_count(); ++s) {
    SegmentHold grads(store_, s, SegmentKind::Grads, Access::Read);
    for (const auto& t : layout_.segments()[s].tensors)
      total += sum_squares(pool_, grads.data() + t.offset_floats, t.numel);
  }
  return total;
}

void Executor::optimizer_step(const AdamWHyper& hyper, double weight_decay, float grad_scale) {
  for (int s = 0; s < layout_.segment_count(); ++s) {
    SegmentHold params(store_, s, SegmentKind::Params, Access::Update);
    SegmentHold grads(store_, s, SegmentKind::Grads, Access::Read);
    SegmentHold m(store_, s, SegmentKind::AdamM, Access::Update);
    SegmentHold v(store_, s, SegmentKind::AdamV, Access::Update);
    for (const auto& t : layout_.segments()[s].tensors) {
      const std::size_t o = t.offset_floats;
      adamw_update(pool_, params.data() + o, m.data() + o, v.data() + o, grads.data() + o, t.numel, hyper,
                   t.weight_decay ? weight_decay : 0.0, grad_scale);
    }
  }
}

}  // namespace stratum
