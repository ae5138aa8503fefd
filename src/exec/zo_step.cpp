// The executor's zeroth-order step (Note [zeroth-order step] in executor.h): two forward passes
// over a schedule that perturbs each segment's parameters at their first hold, and the update
// folded into the next step's first pass.
#include <cmath>
#include <string>

#include "core/zo_noise.h"
#include "exec/executor.h"
#include "stratum/error.h"

namespace stratum {

void Executor::zo_schedule_build() {
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<bool> held(static_cast<std::size_t>(layout_.segment_count()), false);
    forward_groups_add([](int) {},
                       [&](int s) {
                         // A tied wte block again in the head, or a frozen base (LoRA: only the
                         // adapters move, Note [lora segments]).
                         if (held[s] || !layout_.trainable(s)) return Access::Read;
                         held[s] = true;
                         return Access::Update;
                       });
    if (pass == 0) forward_end_ = schedule_.group_count();
  }
  compute_end_ = schedule_.group_count();
  final_at_.assign(static_cast<std::size_t>(compute_end_), {});
  // Pass 2's holds that may be discarded: a trainable unit's one hold in the pass, for Update.
  zo_discard_at_.assign(static_cast<std::size_t>(compute_end_), {});
  std::vector<int> holds(static_cast<std::size_t>(units_.count()), 0);
  for (int g = forward_end_; g < compute_end_; ++g)
    for (const UnitUse& use : schedule_.group(g)) ++holds[use.unit];
  for (int g = forward_end_; g < compute_end_; ++g)
    for (const UnitUse& use : schedule_.group(g))
      if (use.access == Access::Update && units_.kind(use.unit) == SegmentKind::Params && holds[use.unit] == 1)
        zo_discard_at_[g].push_back(use.unit);
}

void Executor::zo_apply(int g, const GroupHolds& holds, const Pass& pass) {
  for (const UnitUse& use : schedule_.group(g)) {
    if (use.access != Access::Update || units_.kind(use.unit) != SegmentKind::Params) continue;
    const int s = units_.segment(use.unit), c = units_.chunk(use.unit);
    const SegmentLayout& seg = layout_.segments()[s];
    float* const base = holds.data(s, SegmentKind::Params, c);
    // A stale unit holds the pass-1 weights of the step whose update is pending: its pass 2's
    // -2*eps*z first, as that pass applied it (Note [zeroth-order step]).
    const bool stale = store_->unit_stale(use.unit);
    STRATUM_ASSERT(!stale || pass.zo_update.update);
    for (const TensorSlot& t : seg.tensors) {
      if (t.chunk != c) continue;
      const std::string name = layout_.hf_name(t);
      if (stale) {
        ZoUpdate redo;
        redo.perturb = true;
        redo.perturb_key = zo_tensor_key(pass.zo_update.update_key, name);
        redo.scale = -2.0f * pass.zo_update.eps;
        ops_->zo_update(base + seg.offset_in_chunk(t), t.numel, t.hf_first(), redo);
      }
      ZoUpdate u = pass.zo_update;  // step keys -> this tensor's keys (Note [zo noise])
      if (u.update) u.update_key = zo_tensor_key(u.update_key, name);
      if (u.perturb) u.perturb_key = zo_tensor_key(u.perturb_key, name);
      if (!t.weight_decay) u.weight_decay = 0.0f;
      ops_->zo_update(base + seg.offset_in_chunk(t), t.numel, t.hf_first(), u);
    }
  }
}

void Executor::zo_flush() {
  if (!zo_pending_.update) return;
  STRATUM_ASSERT(store_ != nullptr);
  Pass pass{PassKind::ZoFlush, nullptr, nullptr, 0, 0};
  pass.zo_update = zo_pending_;
  run(0, forward_end_, pass);
  zo_pending_ = ZoUpdate{};
}

StepResult Executor::zo_step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                             const ZoHyper& hyper) {
  check_shape(B, T);
  STRATUM_ASSERT(mode_ == OptimizerMode::ZerothOrder);
  const std::uint64_t key = zo_step_key(hyper.seed, hyper.step);
  const float eps = static_cast<float>(hyper.eps);
  tokens_stage(inputs, targets, B * T);
  Pass plus{PassKind::Loss, inputs, targets, B, T};  // the pending update, then +eps z
  plus.zo_update = zo_pending_;
  plus.zo_update.perturb = true;
  plus.zo_update.perturb_key = key;
  plus.zo_update.scale = eps;
  run(0, forward_end_, plus);
  zo_pending_ = ZoUpdate{};
  Pass minus{PassKind::Loss, inputs, targets, B, T};  // -2 eps z
  minus.zo_update.perturb = true;
  minus.zo_update.perturb_key = key;
  minus.zo_update.scale = -2.0f * eps;
  run(forward_end_, compute_end_, minus);
  const double g = (static_cast<double>(plus.loss) - static_cast<double>(minus.loss)) / (2.0 * hyper.eps);
  zo_pending_.update = true;
  zo_pending_.update_key = key;
  zo_pending_.eps = eps;
  zo_pending_.lr = static_cast<float>(hyper.lr);
  zo_pending_.g = static_cast<float>(g);
  zo_pending_.weight_decay = static_cast<float>(hyper.weight_decay);
  StepResult r;
  r.loss = static_cast<float>(0.5 * (static_cast<double>(plus.loss) + static_cast<double>(minus.loss)));
  r.grad_norm = static_cast<float>(std::fabs(g));
  return r;
}

}  // namespace stratum
