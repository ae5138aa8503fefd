// Executor: the per-step schedule over store units; see executor.h, Note [step schedule] and
// Note [optimizer overlap].
#include "exec/executor.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <functional>
#include <utility>

#include "backend/backend.h"
#include "core/dropout_mask.h"
#include "store/queue_span.h"
#include "stratum/error.h"

namespace stratum {

const char* optimizer_mode_name(OptimizerMode mode) {
  switch (mode) {
    case OptimizerMode::Inline: return "inline";
    case OptimizerMode::Overlapped: return "overlapped";
    case OptimizerMode::Pipelined: return "pipelined";
    case OptimizerMode::ZerothOrder: return "zeroth-order";
  }
  return "?";
}

namespace {
// Whether a step in this mode runs a backward: zeroth-order runs forward passes only, and its
// engine keeps none of the backward's buffers.
bool has_backward(OptimizerMode mode) { return mode != OptimizerMode::ZerothOrder; }
}  // namespace

OptimizerMode optimizer_mode_for(double grad_clip, bool worker, bool streamed) {
  if (grad_clip <= 0 && !streamed) return OptimizerMode::Overlapped;
  return worker || streamed ? OptimizerMode::Pipelined : OptimizerMode::Inline;
}

bool optimizer_worker_wanted(int compute_threads) { return usable_cpu_count() > compute_threads; }

std::size_t Executor::activation_unit_floats(const GptConfig& config, int max_batch, int max_seq,
                                             bool zeroth_order) {
  return (zeroth_order ? 2 : 1) * static_cast<std::size_t>(max_batch) * max_seq * config.n_embd;
}

std::size_t Executor::internals_unit_floats(const GptConfig& config, int max_batch, int max_seq,
                                            const ParamLayout& layout) {
  return TransformerBlock::held_floats(config, max_batch, max_seq, &layout);
}

const char* activation_policy_name(ActivationPolicy policy) {
  switch (policy) {
    case ActivationPolicy::Recompute: return "recompute";
    case ActivationPolicy::Keep: return "keep";
    case ActivationPolicy::Offload: return "offload";
    case ActivationPolicy::Auto: return "auto";
  }
  return "?";
}

ActivationPolicy activation_policy_parse(const std::string& text) {
  for (ActivationPolicy p : {ActivationPolicy::Recompute, ActivationPolicy::Keep, ActivationPolicy::Offload,
                             ActivationPolicy::Auto})
    if (text == activation_policy_name(p)) return p;
  STRATUM_FAIL("[cli] --activations must be recompute, keep, offload or auto, got '", text, "'");
}

Executor::Executor(ThreadPool& pool, const GptConfig& config, const UnitTable& units, int max_batch, int max_seq,
                   ActivationPolicy activations, OptimizerMode mode, Precision precision, Backend backend,
                   int micro_batches, Communicator* comm, BlockRows rows, int attention_lanes, RankShape plan_rank)
    : ops_([&] {
        std::unique_ptr<Ops> ops = ops_make(pool, precision, backend);
        if (attention_lanes > 0) ops->attention_lanes_limit(attention_lanes);  // before the blocks size their scratch
        return ops;
      }()),
      cfg_(config),
      units_(units),
      layout_(units.layout()),
      max_batch_(max_batch),
      max_seq_(max_seq),
      dacts_(*ops_, has_backward(mode)
                        ? align_up(activation_unit_floats(config, max_batch, max_seq), 16) * sizeof(float)
                        : 0),
      activations_(activations),
      mode_(mode),
      blocks_(*ops_, config, max_batch, max_seq,
              activations == ActivationPolicy::Keep ? config.n_layer : activations == ActivationPolicy::Offload ? 0 : 1,
              &units.layout(), units.param_bf16(), activations == ActivationPolicy::Recompute,
              has_backward(mode), rows),
      head_scratch_(*ops_, config, max_batch * max_seq, precision, activations == ActivationPolicy::Keep,
                    has_backward(mode)),
      schedule_(units.count()),
      micro_batches_(micro_batches),
      comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr),
      shape_(comm != nullptr ? RankShape{comm->rank(), comm->size()} : plan_rank) {
  STRATUM_ASSERT(shape_.ranks >= 1 && shape_.rank >= 0 && shape_.rank < shape_.ranks);
  STRATUM_CHECK(max_seq <= config.context(backend), "[cli] sequence length ", max_seq, " exceeds the model context ",
                config.context_text(backend), " (use --seq <= ", config.context(backend), ")");
  STRATUM_ASSERT(units.act_floats() >=
                 activation_unit_floats(config, max_batch, max_seq, mode == OptimizerMode::ZerothOrder));
  STRATUM_ASSERT(activations != ActivationPolicy::Auto);
  STRATUM_ASSERT(micro_batches >= 1 && (step_micro_batches() == 1 || mode != OptimizerMode::ZerothOrder));
  STRATUM_ASSERT(units.grad_sum() == (step_micro_batches() > 1));
  STRATUM_ASSERT(ranks() == 1 || ops_->host_memory());
  STRATUM_ASSERT(ranks() == 1 || mode != OptimizerMode::Pipelined);  // plan_mode (Note [plan ranks])
  STRATUM_ASSERT((activations == ActivationPolicy::Offload) ==
                 (units.internals_floats() > 0 &&
                  units.internals_floats() >= internals_unit_floats(config, max_batch, max_seq, units.layout())));
  for (const SegmentLayout& seg : layout_.segments())  // only blocks are held as several chunks
    STRATUM_ASSERT(seg.role == SegmentRole::Layer || seg.role == SegmentRole::Lora || seg.chunk_count() == 1);
  grad_squares_.resize(static_cast<std::size_t>(layout_.segment_count()));
  for (int s = 0; s < layout_.segment_count(); ++s) grad_squares_[s].assign(layout_.segments()[s].tensors.size(), 0.0);
  const int vocab0 = layout_.vocab_block_count() > 0 ? layout_.vocab_segment(0) : -1;
  rows_ahead_ = mode == OptimizerMode::Pipelined && ranks() == 1 && ops_->host_memory() && vocab0 >= 0 &&
                layout_.trainable(vocab0) && !units.param_bf16();
  if (rows_ahead_) {  // Note [embedding rows ahead]
    rows_max_ = std::min<std::size_t>(static_cast<std::size_t>(micro_batches) * max_batch * max_seq,
                                      static_cast<std::size_t>(config.vocab_size));
    // Its five buffers of rows stay within a quarter of the embedding (or 16 MiB): beyond that
    // (large batches) a step's compute dwarfs the update's wait anyway, and the budget needs the room.
    const std::size_t row_bytes = static_cast<std::size_t>(config.n_embd) * sizeof(float);
    rows_ahead_ = 5 * rows_max_ * row_bytes <=
                  std::max(static_cast<std::size_t>(config.vocab_size) * row_bytes / 4, std::size_t{16} << 20);
    const std::size_t n = rows_max_ * static_cast<std::size_t>(config.n_embd);
    if (rows_ahead_)
      rows_mem_ = aligned_buffer_carve({{&next_p_, n}, {&next_m_, n}, {&next_v_, n}, {&next_g_, n}, {&ready_p_, n}});
  }
  if (mode == OptimizerMode::ZerothOrder) {  // Note [zeroth-order step]: the second pass's head
    head_scratch_minus_ = std::make_unique<Gpt2HeadScratch>(*ops_, config, max_batch * max_seq, precision, false, false);
    if (layout_.head_tied() && vocab0 >= 0 && layout_.trainable(vocab0)) {  // and its tied lookup's copy
      std::size_t block = 0;  // the largest block's unit (padded as the store holds it)
      for (int k = 0; k < layout_.vocab_block_count(); ++k)
        block = std::max(block, units.bytes(units.index(layout_.vocab_segment(k), SegmentKind::Params, 0)));
      zo_block_ = OpsBuffer(*ops_, block);
    }
  }
  schedule_build();
  update_job_.assign(static_cast<std::size_t>(layout_.segment_count()), 0);
  deferred_.assign(static_cast<std::size_t>(layout_.segment_count()), DeferredUpdate{});
  host_threads_ = pool.num_threads();
  if (!ops_->host_memory())
    tokens_ = OpsBuffer(*ops_, 2 * static_cast<std::size_t>(max_batch) * max_seq * sizeof(std::int32_t));
  // Off the host, updates run on the executor's Ops in schedule order (Pipelined ones at their
  // Optimizer groups, Note [device updates before their forward]): no worker thread, unless
  // optimizer_on_host() puts them on the CPU.
  // On the host, Pipelined updates get a worker only where a CPU is spare (Note [update thread]).
  if ((mode == OptimizerMode::Overlapped || mode == OptimizerMode::Pipelined) && ops_->host_memory())
    optimizer_worker_set(mode == OptimizerMode::Overlapped || optimizer_worker_wanted(host_threads_));
}

void Executor::optimizer_worker_set(bool on) {
  STRATUM_ASSERT(store_ == nullptr && !host_optimizer_ && ops_->host_memory() &&
                 (mode_ == OptimizerMode::Overlapped || mode_ == OptimizerMode::Pipelined));
  if (on == (worker_ != nullptr)) return;
  if (!on) {
    worker_.reset();
    worker_ops_.reset();
    worker_pool_.reset();
    return;
  }
  worker_pool_ = std::make_unique<ThreadPool>(1);
  worker_ops_ = ops_make(*worker_pool_);
  worker_ = std::make_unique<OptimizerWorker>();
}

Executor::Executor(ThreadPool& pool, const GptConfig& config, SegmentStore& store, int max_batch, int max_seq,
                   ActivationPolicy activations)
    : Executor(pool, config, store.units(), max_batch, max_seq, activations, OptimizerMode::Inline) {
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

void Executor::optimizer_on_host() {
  STRATUM_ASSERT(store_ == nullptr && ranks() == 1 &&
                 (mode_ == OptimizerMode::Overlapped || mode_ == OptimizerMode::Pipelined));
  host_optimizer_ = true;
  if (rows_ahead_) {  // the moments are the host store's (Note [embedding rows ahead]: not with it)
    rows_ahead_ = false;
    rows_mem_ = AlignedBuffer();
    schedule_ = StepSchedule(units_.count());
    schedule_build();
  }
  if (worker_) return;  // the CPU backend's own where a CPU is spare (tests: mirror_store), one thread
  // Off the host the training pool's CPUs are idle: AdamW gets as many but one (elementwise: the
  // same bits), which stays with the training thread that drives the device; that thread yields
  // while it waits for the GPU (Note [cuda sync yields] in kernels/cuda/cuda_ops.cu). With all 16
  // of an H200's cores and a spinning training thread, a vocabulary chunk's AdamW (524K values,
  // one parallel_for) took 2.8-7 ms against 0.2 ms when the training thread slept (thirteenth
  // session); now 0.8 ms. The workers poll 200 us for the next job before sleeping (as decoding's
  // pool): each vocabulary chunk's update is one small job, 250 a step for the ~1.1B Llama. Same
  // lease, three interleaved rounds at --gpu-mem-budget 4300M: 1251, 1284, 1215 ms a step against
  // 1281, 1275, 1281 ms sleeping at once (a small gain, within the runs' spread; docs/benchmarks.md).
  worker_pool_ = std::make_unique<ThreadPool>(std::max(1, host_threads_ - 1), /*spin_us=*/200);
  worker_ops_ = ops_make(*worker_pool_);  // the CPU's kernels: the host store's memory
  worker_ = std::make_unique<OptimizerWorker>();
}

void Executor::attach(SegmentStore& store) {
  STRATUM_ASSERT(store.units().count() == units_.count() && store.units().act_floats() >= units_.act_floats());
  STRATUM_ASSERT(ranks() == 1 || comm_ != nullptr);  // a plan's rank (no communicator) runs nothing
  store_ = &store;
  ready_valid_ = false;  // rows gathered from another store's blocks (Note [embedding rows ahead])
  next_.known = next_by_jobs_ = false;
  if (host_optimizer_) {
    device_ = dynamic_cast<DeviceSegmentStore*>(&store);
    STRATUM_ASSERT(device_ != nullptr);
    device_->optimizer_on_host();
  }
  store_->schedule_set(&schedule_);
}

int Executor::act_segment(int layer) const {
  return layer < cfg_.n_layer ? layout_.layer_segment(layer) : layout_.head_segment();
}

std::size_t Executor::min_store_bytes() const {
  // Note [host optimizer]: the updates hold nothing of this store then.
  std::size_t bytes = schedule_min_bytes(schedule_, units_, worker_ != nullptr && !host_optimizer_, host_optimizer_);
  // Loading, saving and hashing hold every chunk of one segment's kind at once (SegmentChunksHold),
  // which a block's half holds less of (Note [block halves]).
  for (int s = 0; s < layout_.segment_count(); ++s)
    for (const SegmentKind kind : {SegmentKind::Params, SegmentKind::Grads, SegmentKind::AdamM, SegmentKind::AdamV})
      bytes = std::max(bytes, units_.segment_held_bytes(s, kind));
  return bytes;
}

std::size_t Executor::min_host_store_bytes() const {
  return host_optimizer_ ? schedule_min_bytes(schedule_, units_, true) : min_store_bytes();
}

std::size_t Executor::fixed_bytes() const {
  // The widest product: an MLP or attention projection, or a vocabulary block of the head; the
  // most rows: a block's row chunk (Note [row chunks]) or a head chunk.
  const int width = std::max({cfg_.n_embd, cfg_.mlp_width(), cfg_.q_dim() + 2 * cfg_.kv_dim(),
                              vocab_block_rows(cfg_)});
  const int rows = std::min(max_batch_ * max_seq_, std::max(blocks_.rows().chunk, head_scratch_.chunk_rows()));
  return dacts_.size_bytes() + blocks_.size_bytes() + head_scratch_.size_bytes() + rows_mem_.size_bytes() +
         (head_scratch_minus_ ? head_scratch_minus_->size_bytes() : 0) + zo_block_.size_bytes() +
         ops_->gemm_scratch_bytes(rows, width, cfg_.n_embd);
}

void Executor::check_shape(int B, int T) const {
  STRATUM_ASSERT(store_ != nullptr);
  STRATUM_ASSERT(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_);
}

void Executor::run(int first, int last, Pass& pass) {
  for (int g = first; g < last; ++g) {
    if (schedule_.group_optional(g)) {  // Note [embedding rows ahead]
      if (!rows_optional_run(g, pass)) continue;
      update_wait(schedule_.group_segment(g), false);  // the block as updated, before it is held
    }
    group_run(g, pass);
  }
}

void Executor::group_run(int g, Pass& pass) {
  const GroupWork work = schedule_.group_work(g);
  if (comm_ != nullptr) comm_->progress();  // Note [data parallel]: sends in flight advance
  if (work == GroupWork::Optimizer) {
    const int s = schedule_.group_segment(g);
    switch (mode_) {
      case OptimizerMode::Pipelined: update_wait(s); break;  // the previous step's update of s
      case OptimizerMode::Overlapped:
        if (pass.queue_updates) optimizer_queue(s, pass.hyper, pass.weight_decay, 1.0f);
        break;
      case OptimizerMode::Inline: break;  // after the global norm: optimizer_step()
      case OptimizerMode::ZerothOrder: STRATUM_ASSERT(false);  // its schedule has no Optimizer group
    }
    return;
  }
  if (work == GroupWork::GradAccum) {
    grad_accum_run(g, pass);
    return;
  }
  if (work == GroupWork::GradShare) {
    grad_share_run(g, pass);
    return;
  }
  at(g);
  // A pass without a backward (loss, logits) has no reader for the internals it writes: they are
  // Scratch there, so a tiered store neither writes them behind nor keeps them dirty.
  const std::vector<UnitUse>* uses = &schedule_.group(g);
  std::vector<UnitUse> scratch;
  if (pass.kind != PassKind::Train && activations_ == ActivationPolicy::Offload && work == GroupWork::LayerForward) {
    scratch = *uses;
    for (UnitUse& use : scratch)
      if (units_.kind(use.unit) == SegmentKind::Internals) use.access = Access::Scratch;
    uses = &scratch;
  }
  // A tied block's second hold changes it only in a zeroth-order step (Note [zeroth-order step]).
  if (!pass.dual && mode_ == OptimizerMode::ZerothOrder && !zo_discard_at_[g].empty()) {
    scratch = *uses;
    for (UnitUse& use : scratch)
      if (std::find(zo_discard_at_[g].begin(), zo_discard_at_[g].end(), use.unit) != zo_discard_at_[g].end())
        use.access = Access::Read;
    uses = &scratch;
  }
  if (comm_ != nullptr)  // another rank's update of a segment this group reads (Note [zero sharding])
    for (const UnitUse& use : *uses)
      if (units_.kind(use.unit) == SegmentKind::Params) params_receive(units_.segment(use.unit));
  GroupHolds holds(*store_, *uses);
  if (pass.kind == PassKind::ZoFlush) {  // a pending zeroth-order update alone, no compute
    zo_apply(g, holds, pass);
    return;
  }
  {
    const char* phase = work <= GroupWork::LayerForward ? "forward" : work <= GroupWork::HeadEnd ? "head" : "backward";
    TraceSpan span(trace_, TraceRecorder::kCompute, phase, trace_ != nullptr ? group_name(g, pass) : std::string(),
                   tag(work));
    // After the holds: the device reaches it once their uploads are in (Note [device timeline]).
    const QueueSpan device(*ops_, Ops::Queue::Compute, device_trace(), TraceRecorder::kDevice, phase,
                           trace_ != nullptr ? group_name(g, pass) : std::string(), tag(work));
    if (pass.dual) {
      zo_dual_compute(g, holds, pass);
    } else {
      if (pass.zo()) zo_apply(g, holds, pass);
      group_compute(g, holds, pass);
    }
  }
  if (pass.dual)  // Note [zeroth-order step]
    for (int u : zo_discard_at_[g]) holds.discard(u);
  if (pass.kind == PassKind::Train)
    for (int s : final_at_[g]) {
      float* const* chunks = holds.chunks(s, SegmentKind::Grads);
      for (int c = 0; c < units_.chunk_count(s, SegmentKind::Grads); ++c) grads_final(s, c, chunks[c]);
    }
}

std::string Executor::group_name(int g, const Pass& pass) const {
  const std::string& seg = layout_.segments()[schedule_.group_segment(g)].name;
  switch (schedule_.group_work(g)) {
    case GroupWork::EmbedForward: return "embed forward";
    case GroupWork::VocabForward: return schedule_.group_item(g) < 0 ? "embed rows forward" : seg + " embed forward";
    case GroupWork::VocabRows: return seg + " rows ahead";
    case GroupWork::LayerForward:
      return seg + (group_part(g) == BlockPart::Attention ? " forward (attention)"
                    : group_part(g) == BlockPart::Mlp    ? " forward (MLP)"
                                                         : " forward");
    case GroupWork::HeadBegin: return "head: final norm";
    case GroupWork::HeadLse: return seg + (pass.kind == PassKind::Logits ? " logits" : " head log-sum-exp");
    case GroupWork::HeadBackward: return seg + " head backward";
    case GroupWork::HeadEnd: return "head: final norm backward";
    case GroupWork::LayerBackward:
      return seg + (group_part(g) == BlockPart::Attention ? " backward: attention recompute" : " backward");
    case GroupWork::EmbedBackward: return "embed backward";
    case GroupWork::VocabBackward: return seg + " embed backward";
    case GroupWork::GradAccum: return seg + " grads micro-batch " + std::to_string(schedule_.group_item(g));
    case GroupWork::GradShare: return seg + " final grads";
    case GroupWork::Optimizer: return seg + " AdamW";
  }
  return seg;
}

TransformerBlock::InternalsAt Executor::internals_at(const GroupHolds& holds, int layer) const {
  switch (activations_) {
    case ActivationPolicy::Keep: return {layer, nullptr};
    case ActivationPolicy::Offload: return {0, holds.data(layout_.layer_segment(layer), SegmentKind::Internals)};
    case ActivationPolicy::Recompute:
    case ActivationPolicy::Auto: break;
  }
  return {0, nullptr};
}

void Executor::group_compute(int g, const GroupHolds& holds, Pass& p) {
  using K = SegmentKind;
  const int s = schedule_.group_segment(g), item = schedule_.group_item(g);
  const SegmentLayout& seg = layout_.segments()[s];
  const int C = cfg_.n_embd, B = p.B, T = p.T, BT = p.B * p.T;
  // A zeroth-order step's second pass: the second hidden state of each activation unit, the
  // second head scratch (Note [zeroth-order step]).
  const std::size_t half = static_cast<std::size_t>(p.half) * BT * C;
  Gpt2HeadScratch& hs = p.half == 0 ? head_scratch_ : *head_scratch_minus_;
  switch (schedule_.group_work(g)) {
    case GroupWork::EmbedForward: {
      float* const out = holds.data(act_segment(0), K::Activations) + half;
      if (cfg_.llama())  // no positions: the token rows are added to zeros, which is exact
        ops_->fill(out, 0.0f, static_cast<std::size_t>(BT) * C);
      else
        ops_->embedding_forward_positions(out, holds.data(s, K::Params) + seg.tensors[kWpe].offset_floats, B, T, C);
      return;
    }
    case GroupWork::VocabForward:
      if (item < 0) {  // Note [embedding rows ahead]
        rows_lookup(p, holds.data(act_segment(0), K::Activations));
        return;
      }
      ops_->embedding_forward_block(holds.data(act_segment(0), K::Activations) + half, p.inputs,
                                    p.vocab_copy != nullptr ? p.vocab_copy : holds.data(s, K::Params),
                                    layout_.vocab_row0(item), layout_.vocab_rows(item), B, T, C, cfg_.embed_scale());
      return;
    case GroupWork::LayerForward: {
      if (group_part(g) != BlockPart::Whole) {
        layer_half_forward(g, holds, p, half);
        return;
      }
      const LoraChunks lora = lora_chunks(holds, item, false, p);
      blocks_.forward(*ops_, seg, holds.views(s, K::Params), holds.data(s, K::Activations) + half,
                      holds.data(act_segment(item + 1), K::Activations) + half, internals_at(holds, item), B, T,
                      layout_.has_lora() ? &lora : nullptr);
      return;
    }
    case GroupWork::HeadBegin: {
      const float* params = holds.data(s, K::Params);
      const float* lnf_b = cfg_.llama() ? nullptr : params + seg.tensors[kLnFB].offset_floats;
      const float* in = holds.data(s, K::Activations) + half;
      if (p.kind == PassKind::Logits)
        gpt2_head_begin(*ops_, cfg_, params + seg.tensors[kLnFW].offset_floats, lnf_b,
                        in + static_cast<std::size_t>(p.logits_row) * C, 1, head_scratch_);
      else
        gpt2_head_begin(*ops_, cfg_, params + seg.tensors[kLnFW].offset_floats, lnf_b, in, BT, hs);
      return;
    }
    case GroupWork::HeadLse:
      if (p.kind == PassKind::Logits) {
        gpt2_head_logits_block(*ops_, GemmLinear{}, cfg_, holds.view(s, K::Params), layout_.vocab_rows(item), 1,
                               p.logits + layout_.vocab_row0(item), cfg_.vocab_size, head_scratch_);
        return;
      }
      gpt2_head_lse_block(*ops_, cfg_, holds.data(s, K::Params), layout_.vocab_row0(item), layout_.vocab_rows(item),
                          p.targets, BT, hs);
      if (item == layout_.vocab_block_count() - 1)
        (p.half == 0 ? p.loss : p.loss_minus) = gpt2_head_loss_finish(*ops_, p.targets, BT, hs);
      return;
    case GroupWork::HeadBackward:
      gpt2_head_backward_block(*ops_, cfg_, holds.data(s, K::Params),
                               layout_.trainable(s) ? holds.data(s, K::Grads) : nullptr,
                               layout_.vocab_row0(item), layout_.vocab_rows(item), p.targets, BT, item == 0,
                               head_scratch_, p.mean_rows);
      return;
    case GroupWork::HeadEnd: {
      const float* params = holds.data(s, K::Params);
      float* const grads = layout_.trainable(s) ? holds.data(s, K::Grads) : nullptr;  // null: frozen
      gpt2_head_backward_finish(*ops_, cfg_, params + seg.tensors[kLnFW].offset_floats,
                                holds.data(s, K::Activations), p.dcur,
                                grads != nullptr ? grads + seg.tensors[kLnFW].offset_floats : nullptr,
                                cfg_.llama() || grads == nullptr ? nullptr : grads + seg.tensors[kLnFB].offset_floats,
                                BT, head_scratch_);
      return;
    }
    case GroupWork::LayerBackward: {
      if (group_part(g) == BlockPart::Attention) {  // Note [attention recompute first]
        HeldLayer held(*this, g, holds, p);
        blocks_.backward(*ops_, seg, held.views.data(), nullptr, holds.data(s, K::Activations), p.dcur, p.dcur,
                         internals_at(holds, item), B, T, true, &held.lora, BlockPart::Attention);
        return;
      }
      const LoraChunks lora = lora_chunks(holds, item, true, p);
      blocks_.backward(*ops_, seg, holds.views(s, K::Params),
                       layout_.trainable(s) ? holds.views(s, K::Grads) : nullptr, holds.data(s, K::Activations),
                       p.dcur, p.dcur, internals_at(holds, item), B, T, activations_ == ActivationPolicy::Recompute,
                       layout_.has_lora() ? &lora : nullptr, group_part(g));  // in place
      return;
    }
    case GroupWork::EmbedBackward:
      if (!cfg_.llama()) {  // Llama's embed segment is empty
        float* dwpe = holds.data(s, K::Grads) + seg.tensors[kWpe].offset_floats;
        ops_->fill(dwpe, 0.0f, seg.tensors[kWpe].numel);
        ops_->embedding_backward_positions(dwpe, p.dcur, B, T, C);
      }
      return;
    case GroupWork::VocabBackward: {
      float* const dwte = holds.data(s, K::Grads);
      if (!layout_.head_tied())  // tied: adds to the head's gradient
        ops_->fill(dwte, 0.0f, static_cast<std::size_t>(layout_.vocab_rows(item)) * C);
      ops_->embedding_backward_block(dwte, p.dcur, p.inputs, layout_.vocab_row0(item), layout_.vocab_rows(item), B, T,
                                     C, cfg_.embed_scale());
      return;
    }
    case GroupWork::VocabRows:
      rows_gather_state(item, holds.data(s, K::Params), holds.data(s, K::AdamM), holds.data(s, K::AdamV));
      return;
    case GroupWork::GradAccum:
    case GroupWork::GradShare:
    case GroupWork::Optimizer: break;
  }
  STRATUM_ASSERT(false);  // GradAccum, GradShare and Optimizer groups are run by group_run()
}

Executor::HeldLayer::HeldLayer(const Executor& e, int g, const GroupHolds& holds, const Pass& p) {
  // The held chunks of the layer and of its adapters; the others empty (Note [block halves]).
  const int s = e.schedule_.group_segment(g), layer = e.schedule_.group_item(g);
  const int a = e.layout_.has_lora() ? e.layout_.lora_segment(layer) : -1;
  views.resize(static_cast<std::size_t>(e.units_.chunk_count(s, SegmentKind::Params)));
  adapters.assign(a >= 0 ? static_cast<std::size_t>(e.units_.chunk_count(a, SegmentKind::Params)) : 0, nullptr);
  for (const UnitUse& use : e.schedule_.group(g)) {
    if (e.units_.kind(use.unit) != SegmentKind::Params) continue;
    const int c = e.units_.chunk(use.unit);
    if (e.units_.segment(use.unit) == s) views[static_cast<std::size_t>(c)] = holds.view(s, SegmentKind::Params, c);
    else adapters[static_cast<std::size_t>(c)] = holds.data(a, SegmentKind::Params, c);
  }
  lora = LoraChunks{a >= 0 ? &e.layout_.segments()[a] : nullptr, adapters.data(), nullptr,
                    p.kind == PassKind::Train && a >= 0 && e.layout_.lora().dropout > 0, e.dropout_step_key_};
}

void Executor::layer_half_forward(int g, const GroupHolds& holds, const Pass& p, std::size_t half) {
  const int s = schedule_.group_segment(g), layer = schedule_.group_item(g);
  const HeldLayer held(*this, g, holds, p);
  const BlockPart part = group_part(g);
  // The MLP half reads res2 from out (where the attention half left it), not x.
  float* const out = holds.data(act_segment(layer + 1), SegmentKind::Activations) + half;
  const float* const x = part == BlockPart::Attention ? holds.data(s, SegmentKind::Activations) + half : out;
  blocks_.forward(*ops_, layout_.segments()[s], held.views.data(), x, out, internals_at(holds, layer), p.B, p.T,
                  layout_.has_lora() ? &held.lora : nullptr, part);
}

LoraChunks Executor::lora_chunks(const GroupHolds& holds, int layer, bool grads, const Pass& pass) const {
  if (!layout_.has_lora()) return {};
  const int a = layout_.lora_segment(layer);
  return {&layout_.segments()[a], holds.chunks(a, SegmentKind::Params),
          grads ? holds.chunks(a, SegmentKind::Grads) : nullptr,
          pass.kind == PassKind::Train && layout_.lora().dropout > 0, dropout_step_key_};
}

void Executor::lora_dropout_step(std::uint64_t seed, long step) {
  dropout_step_key_ = dropout_step_key(seed, step);
  dropout_seed_ = seed;
  dropout_step_ = step;
}

void Executor::tokens_stage(const std::int32_t*& inputs, const std::int32_t*& targets, int BT) {
  if (ops_->host_memory()) return;
  std::int32_t* const dev = tokens_.as<std::int32_t>();
  const std::size_t bytes = static_cast<std::size_t>(BT) * sizeof(std::int32_t);
  ops_->upload(dev, inputs, bytes);
  inputs = dev;
  if (targets != nullptr) {
    ops_->upload(dev + static_cast<std::size_t>(max_batch_) * max_seq_, targets, bytes);
    targets = dev + static_cast<std::size_t>(max_batch_) * max_seq_;
  }
}

float Executor::train_pass(const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool queue_updates,
                           const AdamWHyper& hyper, double weight_decay) {
  const int BT = B * T, step_n = step_micro_batches();
  // Note [masked loss]: the targets that count, per micro-batch of the step (k order), known to
  // every rank before the first backward.
  std::vector<std::int32_t> counts(static_cast<std::size_t>(micro_batches_));
  for (int mb = 0; mb < micro_batches_; ++mb) {
    const std::int32_t* tg = targets + static_cast<std::size_t>(mb) * BT;
    counts[static_cast<std::size_t>(mb)] =
        static_cast<std::int32_t>(std::count_if(tg, tg + BT, [](std::int32_t t) { return t >= 0; }));
  }
  std::vector<std::int32_t> all_counts = counts;  // rank r's micro-batch i at r * micro_batches_ + i
  if (comm_ != nullptr) {
    all_counts.resize(static_cast<std::size_t>(step_n));
    comm_->allgather(counts.data(), counts.size() * sizeof(std::int32_t), all_counts.data());
  }
  std::int64_t counted = 0;
  for (const std::int32_t c : all_counts) counted += c;
  std::vector<float> losses(static_cast<std::size_t>(micro_batches_));
  for (int mb = 0; mb < micro_batches_; ++mb) {
    const std::int32_t* in = inputs + static_cast<std::size_t>(mb) * BT;
    const std::int32_t* tg = targets + static_cast<std::size_t>(mb) * BT;
    tokens_stage(in, tg, BT);
    const int k = mb * ranks() + rank();  // in the whole step (Note [data parallel])
    if (step_n > 1) dropout_step_key_ = dropout_step_key(dropout_seed_, dropout_step_ * step_n + k);
    Pass pass{PassKind::Train, in, tg, B, T, queue_updates, hyper, weight_decay};
    pass.mean_rows = static_cast<int>(counted);  // step_n * BT without a mask
    pass.micro = mb;
    pass.dcur = dacts_.as_f32();
    run(micro_begin_[mb], mb + 1 < micro_batches_ ? micro_begin_[mb + 1] : compute_end_, pass);
    losses[static_cast<std::size_t>(mb)] = pass.loss;
  }
  grad_squares_flush();  // the gradients listed by grads_final (Note [norm in one pass])
  std::vector<float> all = losses;  // rank r's micro-batch i at r * micro_batches_ + i
  if (comm_ != nullptr) {
    all.resize(static_cast<std::size_t>(step_n));
    comm_->allgather(losses.data(), losses.size() * sizeof(float), all.data());
  }
  double total = 0.0;  // the micro-batches' losses, in order (Note [gradient accumulation])
  const bool masked = counted != static_cast<std::int64_t>(step_n) * BT;
  for (int k = 0; k < step_n; ++k) {
    const std::size_t at = static_cast<std::size_t>((k % ranks()) * micro_batches_ + k / ranks());
    total += masked ? static_cast<double>(all[at]) * all_counts[at] : all[at];  // Note [masked loss]
  }
  if (!masked) return static_cast<float>(total / step_n);
  return counted == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(counted));
}

float Executor::forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  check_shape(B, T);
  return train_pass(inputs, targets, B, T, false, AdamWHyper{}, 0.0);
}

StepResult Executor::train_step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                                const AdamWHyper& hyper, double weight_decay, double grad_clip,
                                const InputsAhead& ahead) {
  check_shape(B, T);
  STRATUM_ASSERT(mode_ != OptimizerMode::Overlapped || grad_clip <= 0);
  STRATUM_ASSERT(mode_ != OptimizerMode::ZerothOrder);
  StepResult r;
  const bool overlap = mode_ == OptimizerMode::Overlapped;
  if (rows_ahead_) rows_begin(inputs, static_cast<std::size_t>(micro_batches_) * B * T, ahead);
  r.loss = train_pass(inputs, targets, B, T, overlap, hyper, weight_decay);
  if (comm_ != nullptr) {
    comm_->sends_wait();  // every rank has received what the step sent it
    grad_squares_share();
  }
  if (overlap && worker_) {
    const auto t0 = std::chrono::steady_clock::now();
    TraceSpan span(trace_, TraceRecorder::kCompute, "stall", "wait for the updates");
    worker_->wait_idle();
    update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  r.grad_norm = static_cast<float>(std::sqrt(grad_sum_squares()));
  if (grad_clip > 0) r.grad_scale = std::min(1.0f, static_cast<float>(grad_clip) / (r.grad_norm + 1e-6f));
  if (mode_ == OptimizerMode::Inline) optimizer_step(hyper, weight_decay, r.grad_scale);
  if (rows_ahead_) rows_end(hyper, weight_decay, r.grad_scale, ahead);
  if (mode_ == OptimizerMode::Pipelined)
    for (int s : update_order_) optimizer_queue(s, hyper, weight_decay, r.grad_scale);
  if (comm_ != nullptr) params_share();
  r.optimizer_wait_ms = std::exchange(update_wait_ms_, 0.0);
  return r;
}

float Executor::loss(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  check_shape(B, T);
  zo_flush();
  tokens_stage(inputs, targets, B * T);
  Pass pass{PassKind::Loss, inputs, targets, B, T};
  run(0, forward_end_, pass);
  return pass.loss;
}

void Executor::logits_last(const std::int32_t* tokens, int T, float* logits) {
  check_shape(1, T);
  STRATUM_CHECK(ops_->host_memory(), "[exec] logits on the ", ops_->name(), " backend are not supported yet");
  zo_flush();
  Pass pass{PassKind::Logits, tokens, nullptr, 1, T};
  pass.logits_row = T - 1;
  pass.logits = logits;
  run(0, forward_end_, pass);
}

}  // namespace stratum
