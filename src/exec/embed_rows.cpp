// Executor: the embedding lookup's rows taken ahead of the token embedding's update (Note
// [embedding rows ahead] in executor.h).
#include <algorithm>
#include <cstring>

#include "exec/executor.h"
#include "stratum/error.h"

namespace stratum {

bool Executor::rows_target(int ahead, const InputsAhead& fn) {
  next_.known = false;
  next_pmv_blocks_ = 0;
  next_g_blocks_ = 0;
  if (!fn) return false;
  next_.inputs.resize(rows_n_);
  if (!fn(ahead, next_.inputs.data(), rows_n_)) return false;
  for (std::int32_t t : next_.inputs)
    if (t < 0 || t >= cfg_.vocab_size) return false;  // that step itself will say what is wrong
  next_.rows = next_.inputs;
  std::sort(next_.rows.begin(), next_.rows.end());
  next_.rows.erase(std::unique(next_.rows.begin(), next_.rows.end()), next_.rows.end());
  STRATUM_ASSERT(next_.rows.size() <= rows_max_);
  next_.local.resize(next_.inputs.size());
  for (std::size_t i = 0; i < next_.inputs.size(); ++i)
    next_.local[i] = static_cast<std::int32_t>(
        std::lower_bound(next_.rows.begin(), next_.rows.end(), next_.inputs[i]) - next_.rows.begin());
  next_.known = true;
  return true;
}

void Executor::rows_gather(int block, const float* data, float* rows) const {
  const SegmentLayout& seg = layout_.segments()[layout_.vocab_segment(block)];
  const float* const base = data + seg.offset_in_chunk(seg.tensors[0]);
  const std::size_t C = static_cast<std::size_t>(cfg_.n_embd);
  const int r0 = layout_.vocab_row0(block), r1 = r0 + layout_.vocab_rows(block);
  const auto first = std::lower_bound(next_.rows.begin(), next_.rows.end(), r0);
  const auto last = std::lower_bound(first, next_.rows.end(), r1);
  for (auto it = first; it != last; ++it)
    std::memcpy(rows + static_cast<std::size_t>(it - next_.rows.begin()) * C,
                base + static_cast<std::size_t>(*it - r0) * C, C * sizeof(float));
}

void Executor::rows_gather_state(int block, const float* params, const float* m, const float* v) {
  rows_gather(block, params, next_p_);
  rows_gather(block, m, next_m_);
  rows_gather(block, v, next_v_);
  ++next_pmv_blocks_;
}

bool Executor::rows_optional_run(int g, const Pass& pass) const {
  const bool train = pass.kind == PassKind::Train;
  switch (schedule_.group_work(g)) {
    case GroupWork::VocabForward: return !(train && rows_use_);  // the lookup from the blocks
    case GroupWork::VocabRows: return train && rows_direct_;
    default: STRATUM_ASSERT(false);
  }
  return false;
}

void Executor::rows_blocks_wait() {
  for (int k = 0; k < layout_.vocab_block_count(); ++k) update_wait(layout_.vocab_segment(k), false);
}

void Executor::rows_begin(const std::int32_t* inputs, std::size_t n, const InputsAhead& ahead) {
  rows_n_ = n;
  rows_use_ = ready_valid_ && ready_.inputs.size() == n && std::equal(inputs, inputs + n, ready_.inputs.begin());
  ready_valid_ = false;
  // The updates queued last step did not know this step's successor (the first step, or no
  // InputsAhead then): this step's VocabRows groups gather its rows from the blocks as they are
  // before this step's update. The queued updates do not touch next_ (next_by_jobs_ is false).
  rows_direct_ = !next_.known && rows_target(1, ahead);
  rows_gather_g_ = next_.known;
  if (rows_use_) ++rows_ahead_steps_;
}

void Executor::rows_end(const AdamWHyper& hyper, double weight_decay, float grad_scale, const InputsAhead& ahead) {
  rows_blocks_wait();  // the head's Optimizer groups waited for them already
  const int nv = layout_.vocab_block_count();
  if (next_.known && next_pmv_blocks_ == nv && next_g_blocks_ == nv) {
    // The update the blocks are about to get, on the next step's rows: the same elementwise AdamW.
    const std::size_t n = next_.rows.size() * static_cast<std::size_t>(cfg_.n_embd);
    const TensorSlot& t = layout_.segments()[layout_.vocab_segment(0)].tensors[0];
    ops_->copy(ready_p_, next_p_, n);
    ops_->adamw_update(ready_p_, next_m_, next_v_, next_g_, n, hyper, t.weight_decay ? weight_decay : 0.0, grad_scale);
    std::swap(ready_, next_);
    ready_valid_ = true;
  }
  next_by_jobs_ = rows_target(2, ahead);  // before the updates that gather it are queued
  rows_use_ = false;
  rows_direct_ = false;
  rows_gather_g_ = false;
}

void Executor::rows_lookup(const Pass& pass, float* out) {
  if (pass.kind != PassKind::Train || !rows_use_) return;  // the optional groups read the blocks
  const int B = pass.B, T = pass.T;
  ops_->embedding_forward_block(out, ready_.local.data() + static_cast<std::size_t>(pass.micro) * B * T, ready_p_, 0,
                                static_cast<int>(ready_.rows.size()), B, T, cfg_.n_embd, cfg_.embed_scale());
}

}  // namespace stratum
