// Executor: where a step's gradients go once computed: the micro-batches' accumulation (Note
// [gradient accumulation]), the point they become final (Note [gradients final]), and AdamW
// inline, on the worker or waited for (Note [optimizer overlap]); see executor.h.
#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "exec/executor.h"
#include "store/queue_span.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// The units of one chunk of a segment's update, as its Optimizer group lists them.
constexpr SegmentKind kUpdateKinds[] = {SegmentKind::Params, SegmentKind::Grads, SegmentKind::AdamM,
                                        SegmentKind::AdamV};
}  // namespace

void Executor::chunks_run(int g, const Pass& pass, const std::function<void(const GroupHolds&, int)>& each) {
  at(g);
  TraceSpan span(trace_, TraceRecorder::kCompute, "backward", trace_ != nullptr ? group_name(g, pass) : std::string(),
                 tag(schedule_.group_work(g)));
  const std::vector<UnitUse>& uses = schedule_.group(g);
  const std::size_t held = static_cast<std::size_t>(schedule_.hold_span(g));
  for (std::size_t i = 0; i < uses.size(); i += held) {
    {
      const GroupHolds holds(*store_, uses.data() + i, held);
      each(holds, units_.chunk(uses[i].unit));
    }
    store_->schedule_refresh();  // this chunk was released: load further ahead
  }
}

void Executor::grad_accum_run(int g, const Pass& pass) {
  STRATUM_ASSERT(pass.kind == PassKind::Train);
  const int s = schedule_.group_segment(g), step_n = step_micro_batches();
  const int k = schedule_.group_item(g) * ranks() + rank();  // in the whole step (Note [data parallel])
  const bool final = !final_at_[g].empty();
  chunks_run(g, pass, [&](const GroupHolds& holds, int c) {
    float* const grads = holds.data(s, SegmentKind::Grads, c);
    float* const sum = holds.data(s, SegmentKind::GradSum, c);
    const std::size_t n = layout_.segments()[s].chunk_floats(c);
    const std::size_t bytes = n * sizeof(float);
    if (k > 0 && comm_ != nullptr) comm_->recv((rank() + ranks() - 1) % ranks(), kTagGradSum, sum, bytes);
    if (k == 0)
      ops_->copy(sum, grads, n);
    else if (k < step_n - 1)
      ops_->add(sum, sum, grads, n);
    else
      ops_->add(grads, sum, grads, n);
    if (comm_ != nullptr && k < step_n - 1) comm_->send((rank() + 1) % ranks(), kTagGradSum, sum, bytes);
    if (comm_ != nullptr && k == step_n - 1 && owner_[s] != rank())  // to the owner (Note [zero sharding])
      comm_->send(owner_[s], kTagGradFinal, grads, bytes);
    if (final) grads_final(s, c, grads);
  });
}

void Executor::grads_final(int segment, int chunk, const float* grads) {
  const SegmentLayout& seg = layout_.segments()[segment];
  for (std::size_t t = 0; t < seg.tensors.size(); ++t) {
    const TensorSlot& slot = seg.tensors[t];
    if (slot.chunk != chunk) continue;
    squares_pending_.push_back({segment, static_cast<int>(t), grads + seg.offset_in_chunk(slot), slot.numel});
  }
  if (!store_->buffers_stable()) grad_squares_flush();  // Note [norm in one pass]
  if (rows_gather_g_ && seg.role == SegmentRole::Vocab) {  // Note [embedding rows ahead]
    rows_gather(segment - layout_.vocab_segment(0), grads, next_g_);
    ++next_g_blocks_;
  }
}

void Executor::grad_share_run(int g, const Pass& pass) {
  const int s = schedule_.group_segment(g);
  chunks_run(g, pass, [&](const GroupHolds& holds, int c) {
    float* const grads = holds.data(s, SegmentKind::Grads, c);
    // From rank P-1, which completed them, to this segment's owner (Note [zero sharding]).
    const std::size_t bytes = layout_.segments()[s].chunk_floats(c) * sizeof(float);
    comm_->recv(ranks() - 1, kTagGradFinal, grads, bytes);
    grads_final(s, c, grads);
  });
}

void Executor::grad_squares_flush() {
  if (squares_pending_.empty()) return;
  std::vector<const float*> xs;
  std::vector<std::size_t> ns;
  for (const SquaresPending& p : squares_pending_) {
    xs.push_back(p.grads);
    ns.push_back(p.n);
  }
  std::vector<double> sums(squares_pending_.size());
  ops_->sum_squares_many(sums.data(), xs.data(), ns.data(), sums.size());
  for (std::size_t i = 0; i < sums.size(); ++i)
    grad_squares_[squares_pending_[i].segment][squares_pending_[i].tensor] = sums[i];
  squares_pending_.clear();
}

double Executor::grad_sum_squares() const {
  double total = 0.0;
  for (const auto& segment : grad_squares_)
    for (double t : segment) total += t;
  return total;
}

void Executor::chunk_pin(int s, int c, int delta) {
  for (SegmentKind k : kUpdateKinds) store_->unit_pin(units_.index(s, k, c), group_opt_[s], delta);
}

void Executor::optimizer_segment(const Ops& ops, int s, const AdamWHyper& hyper, double weight_decay,
                                 float grad_scale, int* pinned, bool share) {
  TraceSpan span(trace_, &ops == worker_ops_.get() ? TraceRecorder::kOptimizer : TraceRecorder::kCompute,
                 "optimizer", layout_.segments()[s].name + " AdamW", tag(GroupWork::Optimizer));
  // Note [host optimizer]: on the host store, each chunk's gradients and parameters taken from
  // the device tier around the update (the gradients downloaded, the parameters' device copy
  // dropped after).
  SegmentStore& store = device_ != nullptr && &ops == worker_ops_.get() ? device_->host() : *store_;
  DeviceSegmentStore* const device = &store == store_ ? nullptr : device_;
  // Read-ahead of the next chunks: the worker may run ahead of the schedule position, where the
  // store's prefetch window does not reach (no-op when they are resident or in RAM).
  const int chunks = units_.chunk_count(s, SegmentKind::Params);
  auto read_ahead = [&](int c) {
    if (c >= chunks) return;
    for (SegmentKind k : kUpdateKinds) store.unit_prefetch(units_.index(s, k, c));
  };
  read_ahead(0);
  read_ahead(1);
  const SegmentLayout& seg = layout_.segments()[s];
  for (int c = 0; c < chunks; ++c) {
    read_ahead(c + 2);
    // Given back on every path out, so a failed update never leaves the device waiting.
    const DeviceSegmentStore::HostTaken grads_taken(device, units_.index(s, SegmentKind::Grads, c));
    DeviceSegmentStore::HostTaken params_taken(device, units_.index(s, SegmentKind::Params, c));
    {
      SegmentHold params(store, s, SegmentKind::Params, Access::Update, c);
      SegmentHold grads(store, s, SegmentKind::Grads, Access::Read, c);
      SegmentHold m(store, s, SegmentKind::AdamM, Access::Update, c);
      SegmentHold v(store, s, SegmentKind::AdamV, Access::Update, c);
      const QueueSpan device(ops, Ops::Queue::Compute, &ops == ops_.get() ? device_trace() : nullptr,
                             TraceRecorder::kDevice, "optimizer",
                             trace_ != nullptr ? seg.name + " AdamW " + std::to_string(c) : std::string(),
                             tag(GroupWork::Optimizer));
      for (const TensorSlot& t : seg.tensors) {
        if (t.chunk != c) continue;
        const std::size_t at = seg.offset_in_chunk(t);
        ops.adamw_update(params.data() + at, m.data() + at, v.data() + at, grads.data() + at, t.numel, hyper,
                     t.weight_decay ? weight_decay : 0.0, grad_scale);
      }
      if (share) params_send(s, c, params.data());
      if (next_by_jobs_ && seg.role == SegmentRole::Vocab)  // Note [embedding rows ahead]
        rows_gather_state(s - layout_.vocab_segment(0), params.data(), m.data(), v.data());
      // Ahead of the schedule position (the forward waits for this update): this chunk's use of
      // the update group is made, so its moments and gradients are far from their next use and
      // the parameters near (Note [done ahead] in store/eviction_policy.h).
      if (&ops == worker_ops_.get() && mode_ == OptimizerMode::Pipelined)
        for (SegmentKind k : kUpdateKinds) store.unit_done_ahead(units_.index(s, k, c), group_opt_[s]);
      // Made: the chunk's units go by their next uses from here on (Note [owed uses]).
      if (pinned != nullptr) {
        chunk_pin(s, c, -1);
        *pinned = c + 1;
      }
    }
    params_taken.changed();
    store_->schedule_refresh();  // this chunk was released (written behind): load further ahead
  }
}

void Executor::grad_squares_share() {
  std::vector<double> mine;  // every trainable tensor's squared norm, this rank's segments' filled in
  for (int s = 0; s < layout_.segment_count(); ++s)
    if (layout_.trainable(s))
      for (double t : grad_squares_[s]) mine.push_back(updates_segment(s) ? t : 0.0);
  std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks()));
  comm_->allgather(mine.data(), mine.size() * sizeof(double), all.data());
  std::size_t i = 0;
  for (int s = 0; s < layout_.segment_count(); ++s)
    if (layout_.trainable(s))
      for (double& t : grad_squares_[s]) t = all[static_cast<std::size_t>(owner_[s]) * mine.size() + i++];
}

// Each segment's parameters, chunk by chunk, from its owner to every other rank, in forward order
// (every rank walks the same order; sends are copies, so owners never wait on a receiver).
// Inline's updates sent theirs already, in the same order (optimizer_step).
void Executor::params_share() {
  sync();  // the owners' updates are applied
  params_pending_.resize(static_cast<std::size_t>(layout_.segment_count()), 0);
  for (int s : forward_segments_) {
    if (!layout_.trainable(s)) continue;
    if (!updates_segment(s)) {  // received where it is next read (Note [zero sharding])
      params_pending_[static_cast<std::size_t>(s)] = 1;
      continue;
    }
    if (mode_ == OptimizerMode::Inline) continue;
    for (int c = 0; c < units_.chunk_count(s, SegmentKind::Params); ++c) {
      const SegmentHold params(*store_, s, SegmentKind::Params, Access::Read, c);
      params_send(s, c, params.data());
    }
  }
}

void Executor::params_send(int s, int chunk, const float* params) {
  const std::size_t bytes = layout_.segments()[s].chunk_floats(chunk) * sizeof(float);
  for (int r = 0; r < ranks(); ++r)
    if (r != rank()) comm_->send(r, kTagParams, params, bytes);
}

void Executor::params_receive(int s) {
  if (static_cast<std::size_t>(s) >= params_pending_.size() || params_pending_[static_cast<std::size_t>(s)] == 0) return;
  params_pending_[static_cast<std::size_t>(s)] = 0;
  for (int c = 0; c < units_.chunk_count(s, SegmentKind::Params); ++c) {
    const SegmentHold params(*store_, s, SegmentKind::Params, Access::Overwrite, c);
    comm_->recv(owner_[s], kTagParams, params.data(), layout_.segments()[s].chunk_floats(c) * sizeof(float));
  }
}

void Executor::params_settle() {
  for (int s : forward_segments_) params_receive(s);
}

std::vector<bool> Executor::units_unused() const {
  if (ranks() == 1) return {};
  std::vector<bool> unused(static_cast<std::size_t>(units_.count()), false);
  for (int u = 0; u < units_.count(); ++u) {
    const SegmentKind kind = units_.kind(u);
    unused[static_cast<std::size_t>(u)] =
        (kind == SegmentKind::AdamM || kind == SegmentKind::AdamV) && !updates_segment(units_.segment(u));
  }
  return unused;
}

std::size_t Executor::owned_trainable_params() const {
  std::size_t n = 0;
  for (int s = 0; s < layout_.segment_count(); ++s)
    if (layout_.trainable(s) && updates_segment(s))
      for (const TensorSlot& t : layout_.segments()[s].tensors) n += t.numel;
  return n;
}

void Executor::update_wait(int segment, bool at_group) {
  if (mode_ == OptimizerMode::Pipelined && at_group) at(group_opt_[segment]);
  DeferredUpdate& deferred = deferred_[static_cast<std::size_t>(segment)];
  if (deferred.pending) {  // Note [update thread]: the training thread's turn to run it
    deferred.pending = false;
    if (!at_group) at(group_opt_[segment]);  // ahead (sync, a lookup from the blocks): it is that group's work
    optimizer_segment_owed(*ops_, segment, deferred.hyper, deferred.weight_decay, deferred.grad_scale);
    return;
  }
  if (update_job_[segment] == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  const long job = std::exchange(update_job_[segment], 0);
  TraceSpan span(trace_, TraceRecorder::kCompute, "stall", "wait for " + layout_.segments()[segment].name + " update");
  worker_->wait_done(job);
  update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Executor::sync() {
  if (comm_ != nullptr) params_settle();
  zo_flush();
  for (int s : update_order_)  // deferred ones in the order the next forward would run them
    if (deferred_[static_cast<std::size_t>(s)].pending) update_wait(s, false);
  if (!worker_) return;
  std::fill(update_job_.begin(), update_job_.end(), 0);
  worker_->wait_idle();
}

void Executor::optimizer_segment_owed(const Ops& ops, int segment, const AdamWHyper& hyper, double weight_decay,
                                      float grad_scale) {
  struct Unpin {  // the chunks a failed update did not reach
    Executor* self;
    int segment, chunks;
    int done = 0;
    ~Unpin() {
      for (int c = done; c < chunks; ++c) self->chunk_pin(segment, c, -1);
    }
  } unpin{this, segment, units_.chunk_count(segment, SegmentKind::Params)};
  optimizer_segment(ops, segment, hyper, weight_decay, grad_scale, &unpin.done);
}

void Executor::optimizer_queue(int segment, const AdamWHyper& hyper, double weight_decay, float grad_scale) {
  if (mode_ == OptimizerMode::Overlapped) at(group_opt_[segment]);
  if (!updates_segment(segment)) return;  // its owner updates it (Note [zero sharding])
  // Owed: to the worker, or without one, Pipelined, to the segment's Optimizer group in the next
  // step (Note [update thread]; off the host Note [device updates before their forward]).
  // Otherwise (Overlapped, at that group now) now, on the executor's own Ops.
  if (!worker_ && mode_ != OptimizerMode::Pipelined) {
    optimizer_segment(*ops_, segment, hyper, weight_decay, grad_scale);
    return;
  }
  // An owed update may run away from its group (the worker behind or ahead of the schedule
  // position; a deferred one run ahead, which moves the position past other segments' groups):
  // pin what it will use, so the store does not take the gradients for dead (their next use in
  // the schedule is the next step's overwrite) and keeps the chunks near while the update is owed
  // (Note [owed uses]).
  for (int c = 0; c < units_.chunk_count(segment, SegmentKind::Params); ++c) chunk_pin(segment, c, +1);
  if (!worker_) {
    deferred_[static_cast<std::size_t>(segment)] = DeferredUpdate{true, hyper, weight_decay, grad_scale};
    return;
  }
  const long job = worker_->submit([this, segment, hyper, weight_decay, grad_scale] {
    optimizer_segment_owed(*worker_ops_, segment, hyper, weight_decay, grad_scale);
  });
  if (mode_ == OptimizerMode::Pipelined) update_job_[segment] = job;
}

void Executor::optimizer_step(const AdamWHyper& hyper, double weight_decay, float grad_scale) {
  STRATUM_ASSERT(store_ != nullptr);
  sync();
  for (int s : forward_segments_) {
    if (!layout_.trainable(s)) continue;
    if (mode_ != OptimizerMode::Overlapped) at(group_opt_[s]);
    if (updates_segment(s))  // Inline with ranks: the other ranks take these parameters (params_share)
      optimizer_segment(*ops_, s, hyper, weight_decay, grad_scale, nullptr,
                        comm_ != nullptr && mode_ == OptimizerMode::Inline);
  }
}

}  // namespace stratum
