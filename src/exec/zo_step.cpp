// The executor's zeroth-order step (Note [zeroth-order step] in executor.h): both perturbed
// forward passes on one hold of each segment's parameters, and the update folded into the next
// step's first holds.
#include <cmath>
#include <string>

#include "core/zo_noise.h"
#include "exec/executor.h"
#include "stratum/error.h"

namespace stratum {

void Executor::zo_schedule_build() {
  forward_groups_add([](int) {},
                     [&](int s) {
                       // A frozen base (LoRA: only the adapters move, Note [lora segments]) is read.
                       return layout_.trainable(s) ? Access::Update : Access::Read;
                     },
                     false, false, true);
  forward_end_ = compute_end_ = schedule_.group_count();
  final_at_.assign(static_cast<std::size_t>(compute_end_), {});
  // Each trainable params unit's first hold (for a block's half: the first of its tensors of that
  // half, Note [block halves]) applies the step's update and perturbations; a tied block's second
  // hold (the head) applies the second pass's and is released discarded.
  zo_first_at_.assign(static_cast<std::size_t>(compute_end_), {});
  zo_discard_at_.assign(static_cast<std::size_t>(compute_end_), {});
  zo_held_again_.assign(static_cast<std::size_t>(units_.count()), 0);
  std::vector<int> first(static_cast<std::size_t>(units_.count()), -1);
  std::vector<int> parts(static_cast<std::size_t>(units_.count()), 0);  // the halves held so far
  auto mask = [&](int g) {
    const BlockPart part = group_part(g);
    return part == BlockPart::Whole ? 3 : part == BlockPart::Attention ? 1 : 2;
  };
  for (int g = 0; g < compute_end_; ++g)
    for (const UnitUse& use : schedule_.group(g)) {
      if (use.access != Access::Update || units_.kind(use.unit) != SegmentKind::Params) continue;
      if ((parts[use.unit] & mask(g)) == 0) {
        if (first[use.unit] < 0) first[use.unit] = g;
        parts[use.unit] |= mask(g);
        zo_first_at_[g].push_back(use.unit);
      } else {  // held twice at most: the lookup's block, again in the tied head
        STRATUM_ASSERT(zo_held_again_[use.unit] == 0 && schedule_.group_work(g) == GroupWork::HeadLse &&
                       schedule_.group_work(first[use.unit]) == GroupWork::VocabForward);
        zo_held_again_[use.unit] = 1;
        zo_discard_at_[g].push_back(use.unit);
      }
    }
}

void Executor::zo_apply_unit(int unit, float* base, const ZoUpdate& step, BlockPart part) {
  const int s = units_.segment(unit), c = units_.chunk(unit);
  const SegmentLayout& seg = layout_.segments()[s];
  for (int i = 0; i < static_cast<int>(seg.tensors.size()); ++i) {
    const TensorSlot& t = seg.tensors[static_cast<std::size_t>(i)];
    if (t.chunk != c || (part != BlockPart::Whole && tensor_part(s, i) != part)) continue;
    const std::string name = layout_.hf_name(t);
    ZoUpdate u = step;  // step keys -> this tensor's keys (Note [zo noise])
    if (u.update) u.update_key = zo_tensor_key(u.update_key, name);
    if (u.perturb) u.perturb_key = zo_tensor_key(u.perturb_key, name);
    if (!t.weight_decay) u.weight_decay = 0.0f;
    ops_->zo_update(base + seg.offset_in_chunk(t), t.numel, t.hf_first(), u);
  }
}

void Executor::zo_apply(int g, const GroupHolds& holds, const Pass& pass) {
  for (int unit : zo_first_at_[g]) {
    float* const base = holds.data(units_.segment(unit), SegmentKind::Params, units_.chunk(unit));
    // A stale unit holds the +eps*z weights of the step whose update is pending: its second
    // pass's -2*eps*z first, as that pass applied it (Note [zeroth-order step]).
    if (store_->unit_stale(unit)) {
      STRATUM_ASSERT(pass.zo_update.update);
      ZoUpdate redo;
      redo.perturb = true;
      redo.perturb_key = pass.zo_update.update_key;
      redo.scale = -2.0f * pass.zo_update.eps;
      zo_apply_unit(unit, base, redo, BlockPart::Whole);
    }
    zo_apply_unit(unit, base, pass.zo_update, group_part(g));
  }
}

void Executor::zo_dual_compute(int g, const GroupHolds& holds, Pass& pass) {
  pass.half = 0;
  zo_apply(g, holds, pass);
  group_compute(g, holds, pass);
  pass.half = 1;
  auto params = [&](int unit) { return holds.data(units_.segment(unit), SegmentKind::Params, units_.chunk(unit)); };
  for (int unit : zo_first_at_[g]) {
    if (zo_held_again_[unit] == 0) {
      zo_apply_unit(unit, params(unit), pass.zo_minus, group_part(g));
      continue;
    }
    // The tied head reads the block at +eps*z: this lookup reads a copy at -eps*z.
    STRATUM_ASSERT(schedule_.group_work(g) == GroupWork::VocabForward && pass.vocab_copy == nullptr);
    float* const copy = zo_block_.as_f32();
    STRATUM_ASSERT(units_.bytes(unit) <= zo_block_.size_bytes());
    ops_->copy(copy, params(unit), units_.bytes(unit) / sizeof(float));
    zo_apply_unit(unit, copy, pass.zo_minus, BlockPart::Whole);
    pass.vocab_copy = copy;
  }
  for (int unit : zo_discard_at_[g]) zo_apply_unit(unit, params(unit), pass.zo_minus, BlockPart::Whole);
  group_compute(g, holds, pass);
  pass.half = 0;
  pass.vocab_copy = nullptr;
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
  Pass pass{PassKind::Loss, inputs, targets, B, T};
  pass.dual = true;
  pass.zo_update = zo_pending_;  // the pending update, then +eps z
  pass.zo_update.perturb = true;
  pass.zo_update.perturb_key = key;
  pass.zo_update.scale = eps;
  pass.zo_minus.perturb = true;  // then -2 eps z
  pass.zo_minus.perturb_key = key;
  pass.zo_minus.scale = -2.0f * eps;
  run(0, forward_end_, pass);
  zo_pending_ = ZoUpdate{};
  const double plus = pass.loss, minus = pass.loss_minus;
  const double g = (plus - minus) / (2.0 * hyper.eps);
  zo_pending_.update = true;
  zo_pending_.update_key = key;
  zo_pending_.eps = eps;
  zo_pending_.lr = static_cast<float>(hyper.lr);
  zo_pending_.g = static_cast<float>(g);
  zo_pending_.weight_decay = static_cast<float>(hyper.weight_decay);
  StepResult r;
  r.loss = static_cast<float>(0.5 * (plus + minus));
  r.grad_norm = static_cast<float>(std::fabs(g));
  return r;
}

}  // namespace stratum
