// Executor: the step schedule's construction (Note [one schedule], Note [step schedule] in
// executor.h): the forward's groups, and every mode's training schedule around them.
#include <algorithm>
#include <functional>
#include <utility>

#include "exec/executor.h"
#include "model/lora.h"
#include "stratum/error.h"

namespace stratum {

void Executor::forward_groups_add(const std::function<void(int)>& before, const std::function<Access(int)>& params,
                                  bool rows, bool gather, bool halves) {
  using A = Access;
  using K = SegmentKind;
  using W = GroupWork;
  const int embed = layout_.embed_segment(), head = layout_.head_segment();
  const int nv = layout_.vocab_block_count();
  const int act0 = unit_at(act_segment(0), K::Activations);
  before(embed);
  schedule_.group_add({{unit_at(embed, K::Params), params(embed)}, {act0, A::Overwrite}}, W::EmbedForward, embed);
  // Note [embedding rows ahead]: with rows ahead the lookup from the blocks, and gathering the next
  // step's rows from them, are optional groups; the lookup from the rows holds no block.
  for (int k = 0; k < nv; ++k) {
    const int v = layout_.vocab_segment(k);
    if (!rows) before(v);
    schedule_.group_add({{unit_at(v, K::Params), params(v)}, {act0, A::Update}}, W::VocabForward, v, k, rows);
  }
  for (int k = 0; k < nv && rows && gather; ++k) {
    const int v = layout_.vocab_segment(k);
    schedule_.group_add({{unit_at(v, K::Params), A::Read}, {unit_at(v, K::AdamM), A::Read}, {unit_at(v, K::AdamV), A::Read}},
                        W::VocabRows, v, k, true);
  }
  if (rows) schedule_.group_add({{act0, A::Update}}, W::VocabForward, layout_.vocab_segment(0), -1);
  for (int l = 0; l < cfg_.n_layer && halves; ++l) {  // Note [block halves]
    const int s = layout_.layer_segment(l);
    const int a = layout_.has_lora() ? layout_.lora_segment(l) : -1;
    before(s);
    if (a >= 0) before(a);
    const A access = params(s), adapter_access = a >= 0 ? params(a) : A::Read;
    const int out = unit_at(act_segment(l + 1), K::Activations);
    for (const BlockPart part : {BlockPart::Attention, BlockPart::Mlp}) {
      std::vector<UnitUse> uses;
      if (part == BlockPart::Attention)
        uses = {{unit_at(s, K::Activations), A::Read}, {out, A::Overwrite}};
      else
        uses = {{out, A::Update}};
      part_chunks_add(uses, s, part, access);
      if (a >= 0) part_chunks_add(uses, a, part, adapter_access);
      group_part_set(schedule_.group_add(std::move(uses), W::LayerForward, s, l), part,
                     part == BlockPart::Attention ? attention_share() : 1.0 - attention_share());
    }
  }
  for (int l = 0; l < cfg_.n_layer && !halves; ++l) {
    const int s = layout_.layer_segment(l);
    before(s);
    std::vector<UnitUse> uses = {{unit_at(s, K::Activations), A::Read},
                                 {unit_at(act_segment(l + 1), K::Activations), A::Overwrite}};
    if (const int u = units_.find(s, K::Internals); u >= 0) uses.push_back({u, A::Overwrite});
    const A access = params(s);
    for (int c = 0; c < units_.chunk_count(s, K::Params); ++c) uses.push_back({unit_at(s, K::Params, c), access});
    if (layout_.has_lora()) {  // the block's adapters beside it (Note [lora segments])
      const int a = layout_.lora_segment(l);
      before(a);
      const A adapter_access = params(a);
      for (int c = 0; c < units_.chunk_count(a, K::Params); ++c) uses.push_back({unit_at(a, K::Params, c), adapter_access});
    }
    schedule_.group_add(std::move(uses), W::LayerForward, s, l);
  }
  const bool tied = layout_.head_tied();
  before(head);
  // Note [head passes]: the log-sum-exp pass, then the backward pass, over the vocabulary blocks.
  schedule_.group_add({{unit_at(head, K::Params), params(head)}, {unit_at(head, K::Activations), A::Read}}, W::HeadBegin,
                      head);
  for (int k = 0; k < nv; ++k) {
    const int v = layout_.head_vocab_segment(k);
    if (rows) before(layout_.vocab_segment(k));  // tied: v, whose first read this step is here
    if (!tied) before(v);
    schedule_.group_add({{unit_at(v, K::Params), params(v)}}, W::HeadLse, v, k);
  }
}

void Executor::group_part_set(int g, BlockPart part, double share) {
  schedule_.group_share_set(g, share);
  group_part_.resize(static_cast<std::size_t>(g) + 1, BlockPart::Whole);
  group_part_[g] = part;
}

void Executor::part_chunks_add(std::vector<UnitUse>& uses, int seg, BlockPart part, Access access) const {
  // The chunks that hold a tensor of this half (a chunk may hold both halves' tensors).
  for (int c = 0; c < units_.chunk_count(seg, SegmentKind::Params); ++c) {
    bool has = false;
    for (int i = 0; i < static_cast<int>(layout_.segments()[seg].tensors.size()); ++i)
      has = has || (layout_.segments()[seg].tensors[i].chunk == c && tensor_part(seg, i) == part);
    if (has) uses.push_back({unit_at(seg, SegmentKind::Params, c), access});
  }
}

BlockPart Executor::tensor_part(int segment, int tensor) const {
  const SegmentLayout& seg = layout_.segments()[segment];
  if (seg.role == SegmentRole::Layer) return block_tensor_part(cfg_, tensor);
  if (seg.role != SegmentRole::Lora) return BlockPart::Whole;
  for (int k = 0; k < kLoraMaxTargets; ++k) {  // lora_A at lora_slot(k), lora_B after it
    const int slot = layout_.lora_slot(k);
    if (slot >= 0 && (tensor == slot || tensor == slot + 1))
      return lora_module_in_mlp(lora_family(cfg_), k) ? BlockPart::Mlp : BlockPart::Attention;
  }
  STRATUM_ASSERT(false);
  return BlockPart::Whole;
}

double Executor::attention_share() const {
  // Multiply-adds a row: q, k, v and o, the attention (T/2 keys on average, scores and values),
  // against the MLP's (two or three matrices of C x I).
  const double C = cfg_.n_embd, I = cfg_.mlp_width(), Q = cfg_.q_dim(), KV = cfg_.kv_dim();
  const double attention = C * (Q + 2 * KV) + Q * C + Q * static_cast<double>(max_seq_);
  const double mlp = (cfg_.llama() ? 3 : 2) * C * I;
  return attention / (attention + mlp);
}

void Executor::schedule_build() {
  using A = Access;
  using K = SegmentKind;
  using W = GroupWork;
  const int embed = layout_.embed_segment(), head = layout_.head_segment();
  const int nv = layout_.vocab_block_count();
  auto opt_group = [&](int s) {  // chunk by chunk: params, grads, both moments (kOptimizerChunkUses)
    std::vector<UnitUse> uses;  // another rank's segment: an empty group (Note [zero sharding])
    for (int c = 0; c < (updates_segment(s) ? units_.chunk_count(s, K::Params) : 0); ++c) {
      uses.push_back({unit_at(s, K::Params, c), A::Update});
      uses.push_back({unit_at(s, K::Grads, c), A::Read});
      uses.push_back({unit_at(s, K::AdamM, c), A::Update});
      uses.push_back({unit_at(s, K::AdamV, c), A::Update});
    }
    group_opt_[s] = schedule_.group_add(std::move(uses), W::Optimizer, s);
  };
  auto chunks = [&](std::vector<UnitUse> uses, int s, K kind, A access) {  // every chunk of (s, kind)
    for (int c = 0; c < units_.chunk_count(s, kind); ++c) uses.push_back({unit_at(s, kind, c), access});
    return uses;
  };
  const int L = cfg_.n_layer;
  group_part_.clear();
  group_opt_.assign(layout_.segment_count(), 0);
  forward_segments_.clear();
  forward_segments_.push_back(embed);
  for (int k = 0; k < nv; ++k) forward_segments_.push_back(layout_.vocab_segment(k));
  for (int l = 0; l < L; ++l) {
    forward_segments_.push_back(layout_.layer_segment(l));
    if (layout_.has_lora()) forward_segments_.push_back(layout_.lora_segment(l));
  }
  forward_segments_.push_back(head);
  const bool tied = layout_.head_tied();
  if (!tied)
    for (int k = 0; k < nv; ++k) forward_segments_.push_back(layout_.head_vocab_segment(k));
  if (mode_ == OptimizerMode::ZerothOrder) {
    zo_schedule_build();
    return;
  }
  // Note [zero sharding]: contiguous runs of trainable segments of about total/P bytes each; the
  // segments that hold pieces of one tensor (vocabulary blocks) go together, so that each rank's
  // optimizer shard holds whole tensors.
  owner_.assign(static_cast<std::size_t>(layout_.segment_count()), -1);
  {
    auto bytes = [&](int s) { return units_.segment_bytes(s, K::Params); };
    auto shares_tensor = [&](int a, int b) {  // a tensor of b has a piece in a (both hold a few tensors)
      for (const TensorSlot& tb : layout_.segments()[b].tensors)
        for (const TensorSlot& ta : layout_.segments()[a].tensors)
          if (ta.name == tb.name) return true;
      return false;
    };
    std::vector<std::vector<int>> runs;  // trainable segments in forward order, tensor-sharing ones together
    std::size_t total = 0;
    for (int s : forward_segments_) {
      if (!layout_.trainable(s)) continue;
      if (runs.empty() || !shares_tensor(runs.back().back(), s)) runs.emplace_back();
      runs.back().push_back(s);
      total += bytes(s);
    }
    std::size_t before = 0;
    for (const std::vector<int>& run : runs) {
      std::size_t run_bytes = 0;
      for (int s : run) run_bytes += bytes(s);
      const std::size_t mid = before + run_bytes / 2;  // the run goes where its middle falls
      const int owner = static_cast<int>(std::min<std::size_t>(
          static_cast<std::size_t>(ranks()) - 1, mid * static_cast<std::size_t>(ranks()) / std::max<std::size_t>(total, 1)));
      for (int s : run) owner_[s] = owner;
      before += run_bytes;
    }
  }
  // Pipelined: a segment's update (of the previous step) runs just before its forward, so that is
  // where the schedule lists it (the forward waits for it there); its prefetch then rides the
  // forward's window.
  // With LoRA only the adapters train (Note [lora segments]): the base's groups read their
  // parameters and write no gradients, and the embedding's backward has nothing to compute.
  auto trainable = [&](int s) { return layout_.trainable(s); };
  const bool pipelined = mode_ == OptimizerMode::Pipelined;
  const bool overlap = mode_ == OptimizerMode::Overlapped;
  const int N = micro_batches_, P = ranks(), step_n = step_micro_batches();
  std::vector<int> final_order;  // P > 1: segments in the order their last micro-batch completes them
  micro_begin_.clear();
  for (int mb = 0; mb < N; ++mb) {  // Note [gradient accumulation]
    micro_begin_.push_back(schedule_.group_count());
    // Note [block halves]: a frozen base's layers (LoRA) as two groups each in the forward, so
    // that one half is read while the other computes; where the backward recomputes the internals
    // (a half keeps res2 in its output, not in the internals). Not for trained layers: on GPT-2
    // small under AdamW at 10% the step took 5% longer (docs/benchmarks.md).
    forward_groups_add([&](int s) { if (pipelined && mb == 0 && trainable(s)) opt_group(s); },
                       [](int) { return A::Read; }, rows_ahead_, mb == 0,
                       activations_ == ActivationPolicy::Recompute && layout_.has_lora());
    if (mb == 0) forward_end_ = schedule_.group_count();
    const std::vector<UnitUse> head_in = {{unit_at(head, K::Params), A::Read}, {unit_at(head, K::Activations), A::Read}};
    for (int k = 0; k < nv; ++k) {
      const int v = layout_.head_vocab_segment(k);
      std::vector<UnitUse> uses = {{unit_at(v, K::Params), A::Read}};
      if (trainable(v)) uses.push_back({unit_at(v, K::Grads), A::Overwrite});
      schedule_.group_add(std::move(uses), W::HeadBackward, v, k);
    }
    std::vector<UnitUse> head_end = head_in;
    if (trainable(head)) head_end.push_back({unit_at(head, K::Grads), A::Overwrite});
    schedule_.group_add(std::move(head_end), W::HeadEnd, head);
    // Segment s's gradients of this micro-batch are complete: fold them into the sum; after the
    // last micro-batch they are final, and Overlapped queues the update.
    auto grads_done = [&](int s) {
      if (!trainable(s)) return;
      if (step_n > 1) {
        const int k = mb * P + rank();  // the micro-batch of the whole step (Note [data parallel])
        std::vector<UnitUse> uses;     // chunk by chunk: grads, grad_sum (kGradAccumChunkUses)
        for (int c = 0; c < units_.chunk_count(s, K::Grads); ++c) {
          uses.push_back({unit_at(s, K::Grads, c), k == step_n - 1 ? A::Update : A::Read});
          // With ranks the sum so far arrives from the previous rank: nothing of it is kept here.
          const A sum = k == 0 || P > 1 ? A::Overwrite : k == step_n - 1 ? A::Read : A::Update;
          uses.push_back({unit_at(s, K::GradSum, c), sum});
        }
        schedule_.group_add(std::move(uses), W::GradAccum, s, mb);
      }
      if (mb < N - 1) return;
      if (P > 1)
        final_order.push_back(s);
      else if (overlap)
        opt_group(s);
    };
    grads_done(head);
    if (!tied)
      for (int k = 0; k < nv; ++k) grads_done(layout_.head_vocab_segment(k));
    // Note [attention recompute first]: a frozen base's recomputing backward of one row chunk
    // first holds the attention half alone.
    const bool attention_first = layout_.has_lora() && activations_ == ActivationPolicy::Recompute &&
                                 static_cast<std::size_t>(max_batch_) * max_seq_ <= static_cast<std::size_t>(blocks_.rows().chunk);
    for (int l = L - 1; l >= 0; --l) {
      const int s = layout_.layer_segment(l);
      if (attention_first) {
        std::vector<UnitUse> first = {{unit_at(s, K::Activations), A::Read}};
        part_chunks_add(first, s, BlockPart::Attention, A::Read);
        part_chunks_add(first, layout_.lora_segment(l), BlockPart::Attention, A::Read);
        // Of the backward's time (about three forwards with the recompute), the attention's forward.
        group_part_set(schedule_.group_add(std::move(first), W::LayerBackward, s, l), BlockPart::Attention,
                       attention_share() / 3.0);
      }
      std::vector<UnitUse> uses = chunks({{unit_at(s, K::Activations), A::Read}}, s, K::Params, A::Read);
      // Update, not Read: the backward recomputes a norm's statistics into it (the same values).
      // Its next use overwrites it, so it is dropped, never written back.
      if (const int u = units_.find(s, K::Internals); u >= 0) uses.push_back({u, A::Update});
      if (trainable(s)) uses = chunks(std::move(uses), s, K::Grads, A::Overwrite);
      if (layout_.has_lora()) {
        const int a = layout_.lora_segment(l);
        uses = chunks(chunks(std::move(uses), a, K::Params, A::Read), a, K::Grads, A::Overwrite);
      }
      const int g = schedule_.group_add(std::move(uses), W::LayerBackward, s, l);
      if (attention_first) group_part_set(g, BlockPart::Mlp, 1.0 - attention_share() / 3.0);  // the rest
      grads_done(s);
      if (layout_.has_lora()) grads_done(layout_.lora_segment(l));
    }
    if (trainable(embed)) {
      schedule_.group_add({{unit_at(embed, K::Grads), A::Overwrite}}, W::EmbedBackward, embed);
      grads_done(embed);
      for (int k = 0; k < nv; ++k) {
        const int v = layout_.vocab_segment(k);
        // Tied: adds to the head's gradient; untied: the embedding's is the only one.
        schedule_.group_add({{unit_at(v, K::Grads), tied ? A::Update : A::Overwrite}}, W::VocabBackward, v, k);
        grads_done(v);
      }
    }
  }  // micro-batches
  for (int s : final_order) {  // Note [data parallel]: the final gradients from rank P-1
    if (rank() != P - 1 && updates_segment(s))  // from rank P-1 to the owner (Note [zero sharding])
      schedule_.group_add(chunks({}, s, K::Grads, A::Overwrite), W::GradShare, s);
    if (overlap) opt_group(s);
  }
  compute_end_ = schedule_.group_count();
  if (mode_ == OptimizerMode::Inline)
    for (int s : forward_segments_)
      if (trainable(s)) opt_group(s);
  update_order_.clear();  // Pipelined: queued in the order the step waits for them
  for (int g = 0; g < schedule_.group_count(); ++g)
    if (schedule_.group_work(g) == W::Optimizer) update_order_.push_back(schedule_.group_segment(g));

  // Note [gradients final]: after the last group (not an update) that writes the segment's gradients.
  const int G = schedule_.group_count();
  std::vector<int> last(static_cast<std::size_t>(layout_.segment_count()), -1);
  for (int g = 0; g < G; ++g) {
    if (schedule_.group_work(g) == W::Optimizer) continue;
    for (const UnitUse& use : schedule_.group(g))  // with micro-batches: the last GradAccum group
      if (units_.kind(use.unit) == K::Grads && use.access != A::Read) last[units_.segment(use.unit)] = g;
  }
  final_at_.assign(static_cast<std::size_t>(G), {});
  for (int s = 0; s < layout_.segment_count(); ++s) {
    if (!layout_.trainable(s)) continue;
    STRATUM_ASSERT(last[s] >= 0 && last[s] < group_opt_[s] + (mode_ == OptimizerMode::Pipelined ? G : 0));
    final_at_[last[s]].push_back(s);
  }
}

}  // namespace stratum
