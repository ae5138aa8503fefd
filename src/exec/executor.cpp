// Executor: the per-step schedule over store units; see executor.h, Note [step schedule] and
// Note [optimizer overlap].
#include "exec/executor.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <utility>

#include "backend/backend.h"
#include "stratum/error.h"

namespace stratum {

const char* optimizer_mode_name(OptimizerMode mode) {
  switch (mode) {
    case OptimizerMode::Inline: return "inline";
    case OptimizerMode::Overlapped: return "overlapped";
    case OptimizerMode::Pipelined: return "pipelined";
  }
  return "?";
}

OptimizerMode optimizer_mode_for(double grad_clip, bool budget) {
  if (grad_clip <= 0) return OptimizerMode::Overlapped;
  return budget ? OptimizerMode::Pipelined : OptimizerMode::Inline;
}

std::size_t Executor::activation_unit_floats(const GptConfig& config, int max_batch, int max_seq) {
  return static_cast<std::size_t>(max_batch) * max_seq * config.n_embd;
}

Executor::Executor(ThreadPool& pool, const GptConfig& config, const UnitTable& units, int max_batch, int max_seq,
                   bool keep_activations, OptimizerMode mode)
    : ops_(ops_make(pool)),
      cfg_(config),
      units_(units),
      layout_(units.layout()),
      max_batch_(max_batch),
      max_seq_(max_seq),
      dacts_(2 * align_up(activation_unit_floats(config, max_batch, max_seq), 16) * sizeof(float)),
      keep_activations_(keep_activations),
      mode_(mode),
      blocks_(*ops_, config, max_batch, max_seq, keep_activations ? config.n_layer : 1),
      head_scratch_(config, max_batch * max_seq),
      schedule_(units.count()) {
  STRATUM_CHECK(max_seq <= config.n_ctx, "[train] sequence length ", max_seq, " exceeds the model context ",
                config.n_ctx, " (use --seq <= ", config.n_ctx, ")");
  STRATUM_ASSERT(units.act_floats() >= activation_unit_floats(config, max_batch, max_seq));
  for (const SegmentLayout& seg : layout_.segments())  // only blocks are held as several chunks
    STRATUM_ASSERT(seg.role == SegmentRole::Layer || seg.chunk_count() == 1);
  grad_squares_.resize(static_cast<std::size_t>(layout_.segment_count()));
  for (int s = 0; s < layout_.segment_count(); ++s) grad_squares_[s].assign(layout_.segments()[s].tensors.size(), 0.0);
  schedule_build();
  update_job_.assign(static_cast<std::size_t>(layout_.segment_count()), 0);
  if (mode != OptimizerMode::Inline) {
    worker_pool_ = std::make_unique<ThreadPool>(1);
    worker_ops_ = ops_make(*worker_pool_);
    worker_ = std::make_unique<OptimizerWorker>();
  }
}

Executor::Executor(ThreadPool& pool, const GptConfig& config, SegmentStore& store, int max_batch, int max_seq,
                   bool keep_activations)
    : Executor(pool, config, store.units(), max_batch, max_seq, keep_activations, OptimizerMode::Inline) {
  attach(store);
}

Executor::~Executor() {
  if (worker_) {
    try {
      worker_->wait_idle();
    } catch (...) {  // the step that queued the job already failed and reported
    }
  }
  if (store_ != nullptr) store_->schedule_set(nullptr);
}

void Executor::attach(SegmentStore& store) {
  STRATUM_ASSERT(store.units().count() == units_.count() && store.units().act_floats() >= units_.act_floats());
  store_ = &store;
  store_->schedule_set(&schedule_);
}

int Executor::act_segment(int layer) const {
  return layer < cfg_.n_layer ? layout_.layer_segment(layer) : layout_.head_segment();
}

void Executor::schedule_build() {
  using A = Access;
  using K = SegmentKind;
  const int embed = layout_.embed_segment(), head = layout_.head_segment();
  const int nv = layout_.vocab_block_count();
  auto unit = [&](int s, K k, int c = 0) { return units_.index(s, k, c); };
  auto opt_group = [&](int s) {  // chunk by chunk: params, grads, both moments
    std::vector<UnitUse> uses;
    for (int c = 0; c < units_.chunk_count(s, K::Params); ++c) {
      uses.push_back({unit(s, K::Params, c), A::Update});
      uses.push_back({unit(s, K::Grads, c), A::Read});
      uses.push_back({unit(s, K::AdamM, c), A::Update});
      uses.push_back({unit(s, K::AdamV, c), A::Update});
    }
    group_opt_[s] = schedule_.group_add(std::move(uses), GroupWork::Optimizer);
  };
  auto chunks = [&](std::vector<UnitUse> uses, int s, K kind, A access) {  // every chunk of (s, kind)
    for (int c = 0; c < units_.chunk_count(s, kind); ++c) uses.push_back({unit(s, kind, c), access});
    return uses;
  };
  const int L = cfg_.n_layer;
  group_fwd_.assign(L, 0);
  group_bwd_.assign(L, 0);
  group_vocab_fwd_.assign(nv, 0);
  group_head_lse_.assign(nv, 0);
  group_head_bwd_.assign(nv, 0);
  group_vocab_bwd_.assign(nv, 0);
  group_opt_.assign(layout_.segment_count(), 0);
  forward_segments_.clear();
  forward_segments_.push_back(embed);
  for (int k = 0; k < nv; ++k) forward_segments_.push_back(layout_.vocab_segment(k));
  for (int l = 0; l < L; ++l) forward_segments_.push_back(layout_.layer_segment(l));
  forward_segments_.push_back(head);
  const bool tied = layout_.head_tied();
  if (!tied)
    for (int k = 0; k < nv; ++k) forward_segments_.push_back(layout_.head_vocab_segment(k));
  // Pipelined: a segment's update (of the previous step) runs just before its forward, so that is
  // where the schedule lists it; its prefetch then rides the forward's window.
  const bool pipelined = mode_ == OptimizerMode::Pipelined;
  if (pipelined) opt_group(embed);
  group_embed_fwd_ = schedule_.group_add(
      {{unit(embed, K::Params), A::Read}, {unit(act_segment(0), K::Activations), A::Overwrite}}, GroupWork::EmbedForward);
  for (int k = 0; k < nv; ++k) {
    const int v = layout_.vocab_segment(k);
    if (pipelined) opt_group(v);
    group_vocab_fwd_[k] = schedule_.group_add({{unit(v, K::Params), A::Read}}, GroupWork::VocabForward);
  }
  for (int l = 0; l < L; ++l) {
    const int s = layout_.layer_segment(l);
    if (pipelined) opt_group(s);
    group_fwd_[l] = schedule_.group_add(
        chunks({{unit(s, K::Activations), A::Read}, {unit(act_segment(l + 1), K::Activations), A::Overwrite}}, s,
               K::Params, A::Read),
        GroupWork::LayerForward);
  }
  if (pipelined) {
    opt_group(head);
    if (!tied)
      for (int k = 0; k < nv; ++k) opt_group(layout_.head_vocab_segment(k));
  }
  // Note [head passes]: the log-sum-exp pass, then the backward pass, over the vocabulary blocks.
  group_head_ = schedule_.group_add({{unit(head, K::Params), A::Read}, {unit(head, K::Activations), A::Read}},
                                    GroupWork::HeadBegin);
  for (int k = 0; k < nv; ++k)
    group_head_lse_[k] =
        schedule_.group_add({{unit(layout_.head_vocab_segment(k), K::Params), A::Read}}, GroupWork::HeadLse);
  for (int k = 0; k < nv; ++k) {
    const int v = layout_.head_vocab_segment(k);
    group_head_bwd_[k] =
        schedule_.group_add({{unit(v, K::Params), A::Read}, {unit(v, K::Grads), A::Overwrite}}, GroupWork::HeadBackward);
  }
  group_head_end_ = schedule_.group_add({{unit(head, K::Grads), A::Overwrite}}, GroupWork::HeadEnd);
  const bool overlap = mode_ == OptimizerMode::Overlapped;
  if (overlap) {
    opt_group(head);
    if (!tied)
      for (int k = 0; k < nv; ++k) opt_group(layout_.head_vocab_segment(k));
  }
  for (int l = L - 1; l >= 0; --l) {
    const int s = layout_.layer_segment(l);
    group_bwd_[l] = schedule_.group_add(
        chunks(chunks({{unit(s, K::Activations), A::Read}}, s, K::Params, A::Read), s, K::Grads, A::Overwrite),
        GroupWork::LayerBackward);
    if (overlap) opt_group(s);
  }
  group_embed_bwd_ = schedule_.group_add({{unit(embed, K::Grads), A::Overwrite}}, GroupWork::EmbedBackward);
  if (overlap) opt_group(embed);
  for (int k = 0; k < nv; ++k) {
    const int v = layout_.vocab_segment(k);
    // Tied: adds to the head's gradient; untied: the embedding's is the only one.
    group_vocab_bwd_[k] =
        schedule_.group_add({{unit(v, K::Grads), tied ? A::Update : A::Overwrite}}, GroupWork::VocabBackward);
    if (overlap) opt_group(v);
  }
  if (mode_ == OptimizerMode::Inline)
    for (int s : forward_segments_) opt_group(s);
}

std::size_t Executor::set_bytes(std::initializer_list<int> units) const {
  std::size_t total = 0;
  for (int u : units) total += units_.bytes(u);
  return total;
}

std::size_t Executor::min_store_bytes() const {
  using K = SegmentKind;
  const int embed = layout_.embed_segment(), head = layout_.head_segment();
  auto u = [&](int s, K k, int c = 0) { return units_.index(s, k, c); };
  auto all = [&](int s, K k) {  // every chunk of (s, k)
    std::size_t total = 0;
    for (int c = 0; c < units_.chunk_count(s, k); ++c) total += units_.bytes(u(s, k, c));
    return total;
  };
  auto opt_set = [&](int s) {  // the optimizer holds one chunk of each kind at a time
    std::size_t most = 0;
    for (int c = 0; c < units_.chunk_count(s, K::Params); ++c)
      most = std::max(most, set_bytes({u(s, K::Params, c), u(s, K::Grads, c), u(s, K::AdamM, c), u(s, K::AdamV, c)}));
    return most;
  };
  // Sets the training thread holds in the forward, the head (the worker is idle then: the head
  // waits for every update) and the backward; with a worker, one segment's update may run beside
  // the forward (Pipelined) or the backward (Overlapped). Vocabulary blocks are held one at a
  // time beside what their phase holds throughout.
  std::size_t vocab_p = 0, vocab_pg = 0, vocab_g = 0;
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    const int v = layout_.vocab_segment(k);
    vocab_p = std::max(vocab_p, all(v, K::Params));
    vocab_g = std::max(vocab_g, all(v, K::Grads));
    vocab_pg = std::max(vocab_pg, all(v, K::Params) + all(v, K::Grads));
  }
  std::size_t forward = all(embed, K::Params) + set_bytes({u(act_segment(0), K::Activations)}) + vocab_p;
  const std::size_t head_set = all(head, K::Params) + all(head, K::Grads) + set_bytes({u(head, K::Activations)}) + vocab_pg;
  std::size_t backward = all(embed, K::Grads) + vocab_g;
  std::size_t any_opt = 0;
  for (int s = 0; s < layout_.segment_count(); ++s) any_opt = std::max(any_opt, opt_set(s));
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const int s = layout_.layer_segment(l);
    forward = std::max(forward, all(s, K::Params) + set_bytes({u(s, K::Activations), u(act_segment(l + 1), K::Activations)}));
    backward = std::max(backward, all(s, K::Params) + all(s, K::Grads) + set_bytes({u(s, K::Activations)}));
  }
  if (mode_ == OptimizerMode::Pipelined) forward += any_opt;
  if (mode_ == OptimizerMode::Overlapped) backward += any_opt;
  return std::max({forward, head_set, backward, any_opt});
}

std::size_t Executor::fixed_bytes() const {
  return dacts_.size_bytes() + blocks_.size_bytes() + head_scratch_.size_bytes();
}

void Executor::check_shape(int B, int T) const {
  STRATUM_ASSERT(store_ != nullptr);
  STRATUM_ASSERT(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_);
}

void Executor::forward_blocks(const std::int32_t* inputs, int B, int T) {
  const auto& segs = layout_.segments();
  {
    update_wait(layout_.embed_segment());
    at(group_embed_fwd_);
    SegmentHold out(*store_, act_segment(0), SegmentKind::Activations, Access::Overwrite);
    {
      SegmentHold embed(*store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
      TraceSpan span(trace_, TraceRecorder::kCompute, "forward", "embed forward", tag(GroupWork::EmbedForward));
      if (cfg_.llama())  // no positions: the token rows are added to zeros, which is exact
        std::memset(out.data(), 0, sizeof(float) * static_cast<std::size_t>(B) * T * cfg_.n_embd);
      else
        ops_->embedding_forward_positions(out.data(),
                                    embed.data() + segs[layout_.embed_segment()].tensors[kWpe].offset_floats, B, T,
                                    cfg_.n_embd);
    }
    for (int k = 0; k < layout_.vocab_block_count(); ++k) {
      const int v = layout_.vocab_segment(k);
      update_wait(v);
      at(group_vocab_fwd_[k]);
      SegmentHold wte(*store_, v, SegmentKind::Params, Access::Read);
      TraceSpan span(trace_, TraceRecorder::kCompute, "forward", segs[v].name + " embed forward",
                     tag(GroupWork::VocabForward));
      ops_->embedding_forward_block(out.data(), inputs, wte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k), B, T,
                              cfg_.n_embd);
    }
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const int s = layout_.layer_segment(l);
    update_wait(s);
    at(group_fwd_[l]);
    SegmentChunksHold params(*store_, s, SegmentKind::Params, Access::Read);
    SegmentHold in(*store_, s, SegmentKind::Activations, Access::Read);
    SegmentHold out(*store_, act_segment(l + 1), SegmentKind::Activations, Access::Overwrite);
    TraceSpan span(trace_, TraceRecorder::kCompute, "forward", segs[s].name + " forward", tag(GroupWork::LayerForward));
    blocks_.forward(*ops_, segs[s], params.chunks(), in.data(), out.data(), block_copy(l), B, T);
  }
}

float Executor::head_lse(const std::int32_t* targets, int BT) {
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    const int v = layout_.head_vocab_segment(k);
    at(group_head_lse_[k]);
    SegmentHold wte(*store_, v, SegmentKind::Params, Access::Read);
    TraceSpan span(trace_, TraceRecorder::kCompute, "head", layout_.segments()[v].name + " head log-sum-exp",
                   tag(GroupWork::HeadLse));
    gpt2_head_lse_block(*ops_, cfg_, wte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k), targets, BT,
                        head_scratch_);
  }
  return gpt2_head_loss_finish(BT, head_scratch_);
}

void Executor::grads_final(int segment, float* const* grad_chunks) {
  const SegmentLayout& seg = layout_.segments()[segment];
  for (std::size_t t = 0; t < seg.tensors.size(); ++t) {
    const TensorSlot& slot = seg.tensors[t];
    grad_squares_[segment][t] = ops_->sum_squares(grad_chunks[slot.chunk] + seg.offset_in_chunk(slot), slot.numel);
  }
}

float Executor::backward_pass(const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool overlap,
                              const AdamWHyper& hyper, double weight_decay) {
  const auto& segs = layout_.segments();
  const int C = cfg_.n_embd;
  const int embed = layout_.embed_segment(), head = layout_.head_segment();
  const auto& embed_seg = segs[embed];
  const auto& head_seg = segs[head];
  const std::size_t stride = dacts_.size_bytes() / sizeof(float) / 2;
  float* dcur = dacts_.as_f32();
  float* dnext = dacts_.as_f32() + stride;
  float loss = 0.0f;
  {
    head_updates_wait();  // the last queued updates: every update is done after this
    at(group_head_);
    SegmentHold head_p(*store_, head, SegmentKind::Params, Access::Read);
    SegmentHold in(*store_, head, SegmentKind::Activations, Access::Read);
    const float* lnf_w = head_p.data() + head_seg.tensors[kLnFW].offset_floats;
    const float* lnf_b = cfg_.llama() ? nullptr : head_p.data() + head_seg.tensors[kLnFB].offset_floats;
    {
      TraceSpan span(trace_, TraceRecorder::kCompute, "head", "head: final norm", tag(GroupWork::HeadBegin));
      gpt2_head_begin(*ops_, cfg_, lnf_w, lnf_b, in.data(), B * T, head_scratch_);
    }
    loss = head_lse(targets, B * T);
    for (int k = 0; k < layout_.vocab_block_count(); ++k) {
      const int v = layout_.head_vocab_segment(k);
      at(group_head_bwd_[k]);
      SegmentHold wte(*store_, v, SegmentKind::Params, Access::Read);
      SegmentHold dwte(*store_, v, SegmentKind::Grads, Access::Overwrite);
      TraceSpan span(trace_, TraceRecorder::kCompute, "head", segs[v].name + " head backward",
                     tag(GroupWork::HeadBackward));
      gpt2_head_backward_block(*ops_, cfg_, wte.data(), dwte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k),
                               targets, B * T, k == 0, head_scratch_);
      if (!layout_.head_tied()) {  // final now (tied: the embedding backward adds to it)
        float* const grads = dwte.data();
        grads_final(v, &grads);
      }
    }
    at(group_head_end_);
    SegmentHold head_g(*store_, head, SegmentKind::Grads, Access::Overwrite);
    TraceSpan span(trace_, TraceRecorder::kCompute, "head", "head: final norm backward", tag(GroupWork::HeadEnd));
    gpt2_head_backward_finish(*ops_, cfg_, lnf_w, in.data(), dcur, head_g.data() + head_seg.tensors[kLnFW].offset_floats,
                              cfg_.llama() ? nullptr : head_g.data() + head_seg.tensors[kLnFB].offset_floats, B * T,
                              head_scratch_);
    float* const head_grads = head_g.data();
    grads_final(head, &head_grads);
  }
  if (overlap) {
    optimizer_queue(head, hyper, weight_decay, 1.0f);
    if (!layout_.head_tied())
      for (int k = 0; k < layout_.vocab_block_count(); ++k)
        optimizer_queue(layout_.head_vocab_segment(k), hyper, weight_decay, 1.0f);
  }
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const int s = layout_.layer_segment(l);
    {
      at(group_bwd_[l]);
      SegmentChunksHold params(*store_, s, SegmentKind::Params, Access::Read);
      SegmentChunksHold grads(*store_, s, SegmentKind::Grads, Access::Overwrite);
      SegmentHold in(*store_, s, SegmentKind::Activations, Access::Read);
      TraceSpan span(trace_, TraceRecorder::kCompute, "backward", segs[s].name + " backward",
                     tag(GroupWork::LayerBackward));
      blocks_.backward(*ops_, segs[s], params.chunks(), grads.chunks(), in.data(), dcur, dnext, block_copy(l), B, T,
                       !keep_activations_);
      grads_final(s, grads.chunks());
    }
    if (overlap) optimizer_queue(s, hyper, weight_decay, 1.0f);
    std::swap(dcur, dnext);
  }
  {
    at(group_embed_bwd_);
    SegmentHold embed_g(*store_, embed, SegmentKind::Grads, Access::Overwrite);
    TraceSpan span(trace_, TraceRecorder::kCompute, "backward", "embed backward", tag(GroupWork::EmbedBackward));
    if (!cfg_.llama()) {  // Llama's embed segment is empty
      float* dwpe = embed_g.data() + embed_seg.tensors[kWpe].offset_floats;
      std::memset(dwpe, 0, embed_seg.tensors[kWpe].numel * sizeof(float));
      ops_->embedding_backward_positions(dwpe, dcur, B, T, C);
    }
    float* const embed_grads = embed_g.data();
    grads_final(embed, &embed_grads);
  }
  if (overlap) optimizer_queue(embed, hyper, weight_decay, 1.0f);
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    const int v = layout_.vocab_segment(k);
    {
      at(group_vocab_bwd_[k]);
      const bool tied = layout_.head_tied();
      SegmentHold dwte(*store_, v, SegmentKind::Grads, tied ? Access::Update : Access::Overwrite);
      TraceSpan span(trace_, TraceRecorder::kCompute, "backward", segs[v].name + " embed backward",
                     tag(GroupWork::VocabBackward));
      if (!tied) std::memset(dwte.data(), 0, sizeof(float) * static_cast<std::size_t>(layout_.vocab_rows(k)) * C);
      ops_->embedding_backward_block(dwte.data(), dcur, inputs, layout_.vocab_row0(k), layout_.vocab_rows(k), B, T, C);
      float* const wte_grads = dwte.data();
      grads_final(v, &wte_grads);
    }
    if (overlap) optimizer_queue(v, hyper, weight_decay, 1.0f);
  }
  return loss;
}

float Executor::forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  check_shape(B, T);
  forward_blocks(inputs, B, T);
  return backward_pass(inputs, targets, B, T, false, AdamWHyper{}, 0.0);
}

StepResult Executor::train_step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                                const AdamWHyper& hyper, double weight_decay, double grad_clip) {
  check_shape(B, T);
  STRATUM_ASSERT(mode_ != OptimizerMode::Overlapped || grad_clip <= 0);
  StepResult r;
  forward_blocks(inputs, B, T);
  const bool overlap = mode_ == OptimizerMode::Overlapped;
  r.loss = backward_pass(inputs, targets, B, T, overlap, hyper, weight_decay);
  if (overlap) {
    const auto t0 = std::chrono::steady_clock::now();
    TraceSpan span(trace_, TraceRecorder::kCompute, "stall", "wait for the updates");
    worker_->wait_idle();
    update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  r.grad_norm = static_cast<float>(std::sqrt(grad_sum_squares()));
  if (grad_clip > 0) r.grad_scale = std::min(1.0f, static_cast<float>(grad_clip) / (r.grad_norm + 1e-6f));
  if (mode_ == OptimizerMode::Inline) optimizer_step(hyper, weight_decay, r.grad_scale);
  if (mode_ == OptimizerMode::Pipelined)
    for (int s : forward_segments_) optimizer_queue(s, hyper, weight_decay, r.grad_scale);
  r.optimizer_wait_ms = std::exchange(update_wait_ms_, 0.0);
  return r;
}

float Executor::head_inference(const std::int32_t* targets, int BT, int logits_row, float* logits) {
  const auto& segs = layout_.segments();
  const int head = layout_.head_segment();
  head_updates_wait();
  at(group_head_);
  SegmentHold head_p(*store_, head, SegmentKind::Params, Access::Read);
  SegmentHold in(*store_, head, SegmentKind::Activations, Access::Read);
  const float* lnf_w = head_p.data() + segs[head].tensors[kLnFW].offset_floats;
  const float* lnf_b = cfg_.llama() ? nullptr : head_p.data() + segs[head].tensors[kLnFB].offset_floats;
  if (logits == nullptr) {
    gpt2_head_begin(*ops_, cfg_, lnf_w, lnf_b, in.data(), BT, head_scratch_);
    return head_lse(targets, BT);
  }
  gpt2_head_begin(*ops_, cfg_, lnf_w, lnf_b, in.data() + static_cast<std::size_t>(logits_row) * cfg_.n_embd, 1,
                  head_scratch_);
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    const int v = layout_.head_vocab_segment(k);
    at(group_head_lse_[k]);
    SegmentHold wte(*store_, v, SegmentKind::Params, Access::Read);
    TraceSpan span(trace_, TraceRecorder::kCompute, "head", segs[v].name + " logits");
    gpt2_head_logits_block(*ops_, GemmLinear{}, cfg_, wte.view(), layout_.vocab_rows(k), 1,
                           logits + layout_.vocab_row0(k), cfg_.vocab_size, head_scratch_);
  }
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

double Executor::grad_sum_squares() const {
  double total = 0.0;
  for (const auto& segment : grad_squares_)
    for (double t : segment) total += t;
  return total;
}

void Executor::optimizer_segment(const Ops& ops, int s, const AdamWHyper& hyper, double weight_decay,
                                 float grad_scale) {
  TraceSpan span(trace_, &ops == worker_ops_.get() ? TraceRecorder::kOptimizer : TraceRecorder::kCompute,
                 "optimizer", layout_.segments()[s].name + " AdamW", tag(GroupWork::Optimizer));
  // Read-ahead of the next chunks: the worker may run ahead of the schedule position, where the
  // store's prefetch window does not reach (no-op when they are resident or in RAM).
  const int chunks = units_.chunk_count(s, SegmentKind::Params);
  auto read_ahead = [&](int c) {
    if (c >= chunks) return;
    for (SegmentKind k : {SegmentKind::Params, SegmentKind::Grads, SegmentKind::AdamM, SegmentKind::AdamV})
      store_->unit_prefetch(units_.index(s, k, c));
  };
  read_ahead(0);
  read_ahead(1);
  const SegmentLayout& seg = layout_.segments()[s];
  for (int c = 0; c < chunks; ++c) {
    read_ahead(c + 2);
    {
      SegmentHold params(*store_, s, SegmentKind::Params, Access::Update, c);
      SegmentHold grads(*store_, s, SegmentKind::Grads, Access::Read, c);
      SegmentHold m(*store_, s, SegmentKind::AdamM, Access::Update, c);
      SegmentHold v(*store_, s, SegmentKind::AdamV, Access::Update, c);
      for (const TensorSlot& t : seg.tensors) {
        if (t.chunk != c) continue;
        const std::size_t at = seg.offset_in_chunk(t);
        ops.adamw_update(params.data() + at, m.data() + at, v.data() + at, grads.data() + at, t.numel, hyper,
                     t.weight_decay ? weight_decay : 0.0, grad_scale);
      }
    }
    store_->schedule_refresh();  // this chunk was released (written behind): load further ahead
  }
}

void Executor::head_updates_wait() {
  update_wait(layout_.head_segment());
  if (!layout_.head_tied())
    for (int k = 0; k < layout_.vocab_block_count(); ++k) update_wait(layout_.head_vocab_segment(k));
}

void Executor::update_wait(int segment) {
  if (mode_ == OptimizerMode::Pipelined) at(group_opt_[segment]);
  if (update_job_[segment] == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  const long job = std::exchange(update_job_[segment], 0);
  TraceSpan span(trace_, TraceRecorder::kCompute, "stall", "wait for " + layout_.segments()[segment].name + " update");
  worker_->wait_done(job);
  update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Executor::sync() {
  if (!worker_) return;
  std::fill(update_job_.begin(), update_job_.end(), 0);
  worker_->wait_idle();
}

void Executor::optimizer_queue(int segment, const AdamWHyper& hyper, double weight_decay, float grad_scale) {
  if (mode_ == OptimizerMode::Overlapped) at(group_opt_[segment]);
  // The worker runs behind the schedule position: pin what it will use so the store does not
  // take the gradients for dead (their next use in the schedule is the next step's overwrite).
  for (const UnitUse& use : schedule_.group(group_opt_[segment])) store_->unit_pin(use.unit, +1);
  const long job = worker_->submit([this, segment, hyper, weight_decay, grad_scale] {
    struct Unpin {
      Executor* self;
      int group;
      ~Unpin() {
        for (const UnitUse& use : self->schedule_.group(group)) self->store_->unit_pin(use.unit, -1);
      }
    } unpin{this, group_opt_[segment]};
    optimizer_segment(*worker_ops_, segment, hyper, weight_decay, grad_scale);
  });
  if (mode_ == OptimizerMode::Pipelined) update_job_[segment] = job;
}

void Executor::optimizer_step(const AdamWHyper& hyper, double weight_decay, float grad_scale) {
  STRATUM_ASSERT(store_ != nullptr);
  sync();
  for (int s : forward_segments_) {
    if (mode_ != OptimizerMode::Overlapped) at(group_opt_[s]);
    optimizer_segment(*ops_, s, hyper, weight_decay, grad_scale);
  }
}

}  // namespace stratum
