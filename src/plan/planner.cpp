// The planner's model of a step (Note [plan model]); its measurements are plan_measure.cpp's.
#include "plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/param_layout.h"
#include "plan/traffic_model.h"
#include "store/step_schedule.h"
#include "store/unit_table.h"
#include "core/byte_size.h"
#include "stratum/error.h"

namespace stratum {

namespace {

// Floats AdamW updates per step on the executor's rank: the trainable segments' (with LoRA, the
// adapters') it owns (Note [zero sharding]; all of them in one process).
std::size_t segment_floats(const ParamLayout& layout, const Executor& exec) {
  std::size_t total = 0;
  for (int s = 0; s < layout.segment_count(); ++s)
    if (layout.trainable(s) && exec.updates_segment(s)) total += layout.segments()[s].size_floats;
  return total;
}

// The executor of the rank the request plans (Note [plan ranks]): its micro-batches, its owners.
std::unique_ptr<Executor> rank_executor(ThreadPool& pool, const PlanRequest& r, const UnitTable& units,
                                        OptimizerMode mode, int mlp_rows) {
  plan_ranks_check(r);
  return std::make_unique<Executor>(pool, r.config, units, r.batch, r.seq, r.activations, mode, r.precision,
                                    Backend::Cpu, r.grad_accum / r.ranks, nullptr, BlockRows{r.row_chunk, mlp_rows},
                                    0, RankShape{std::max(r.rank, 0), r.ranks});
}

// Note [plan ranks]: one rank of each kind, by what it owns and whether it starts (0) or ends
// (P-1) the micro-batches' chain (the other ranks' schedules are their kind's), and how many
// ranks are of that kind.
std::vector<std::pair<int, int>> plan_rank_kinds(const PlanRequest& request) {
  PlanRequest r = request;
  r.rank = 0;
  r.grad_accum = r.ranks;  // the owners do not depend on the micro-batches (a smaller schedule)
  if (r.activations == ActivationPolicy::Auto) r.activations = ActivationPolicy::Recompute;  // the owners are the same
  const ParamLayout layout = ParamLayout::of(r.config, r.lora);
  const UnitTable units =
      plan_units(layout, Executor::activation_unit_floats(r.config, r.batch, r.seq, r.zeroth_order), r);
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  const std::unique_ptr<Executor> exec =
      rank_executor(pool, r, units, plan_mode(r, r.mem_budget_bytes > 0), r.row_chunk);
  std::vector<std::pair<int, int>> kinds;
  std::vector<std::vector<int>> seen;
  for (int rank = 0; rank < r.ranks; ++rank) {
    std::vector<int> kind{rank == 0, rank == r.ranks - 1};
    for (int s = 0; s < layout.segment_count(); ++s)
      if (exec->segment_owner(s) == rank) kind.push_back(s);
    const auto found = std::find(seen.begin(), seen.end(), kind);
    if (found != seen.end()) {
      ++kinds[static_cast<std::size_t>(found - seen.begin())].second;
      continue;
    }
    seen.push_back(std::move(kind));
    kinds.emplace_back(rank, 1);
  }
  return kinds;
}

// f(request of that rank, how many ranks are of its kind) for one rank of each kind (request.rank
// -1 with ranks > 1).
template <class F>
void each_rank_kind(const PlanRequest& request, F f) {
  for (const auto& [rank, count] : plan_rank_kinds(request)) {
    PlanRequest one = request;
    one.rank = rank;
    f(one, count);
  }
}
}  // namespace

void plan_ranks_check(const PlanRequest& r) {
  STRATUM_CHECK(r.grad_accum % r.ranks == 0, "[plan] --grad-accum ", r.grad_accum, " must be a multiple of --ranks ",
                r.ranks, "; use --grad-accum ", (r.grad_accum + r.ranks - 1) / r.ranks * r.ranks);
  STRATUM_ASSERT(r.rank < r.ranks);
}

namespace {

// Compute time of group g on the training thread (0 for updates on the worker).
double group_compute_ms(GroupWork work, const ComputeTiming& t) {
  switch (work) {
    case GroupWork::LayerForward: return t.layer_forward_ms;
    case GroupWork::LayerBackward: return t.layer_backward_ms;
    case GroupWork::VocabForward: return t.vocab_forward_ms;
    case GroupWork::VocabBackward: return t.vocab_backward_ms;
    case GroupWork::HeadLse: return t.head_lse_ms;
    case GroupWork::HeadBackward: return t.head_backward_ms;
    case GroupWork::EmbedForward: case GroupWork::HeadBegin: case GroupWork::HeadEnd: case GroupWork::EmbedBackward:
      return t.other_ms / 4;
    case GroupWork::GradAccum: case GroupWork::Optimizer: return 0.0;  // per float: group_update_ms
    case GroupWork::GradShare: return 0.0;  // a receive; the network is Note [plan ranks]
    case GroupWork::VocabRows: return 0.0;  // optional: a step does not run it
  }
  return 0.0;
}

// Whether layer l takes ComputeTiming's other_layer_* times (Note [mixed layers]).
bool other_kind_layer(const GptConfig& cfg, const ComputeTiming& t, int l) {
  return t.other_layer_forward_ms > 0 && cfg.layer_sliding_attention(l) != cfg.layer_sliding_attention(0);
}

// Each group's compute on the training thread: group_compute_ms by its work, a layer's groups
// by their layer's kind (Note [mixed layers]), times the group's share.
std::vector<double> group_computes(const StepSchedule& schedule, const ParamLayout& layout, const GptConfig& cfg,
                                   const ComputeTiming& t) {
  ComputeTiming other = t;
  other.layer_forward_ms = t.other_layer_forward_ms;
  other.layer_backward_ms = t.other_layer_backward_ms;
  std::vector<double> ms(static_cast<std::size_t>(schedule.group_count()), 0.0);
  for (int g = 0; g < schedule.group_count(); ++g) {
    const int seg = schedule.group_segment(g);
    const SegmentRole role = layout.segments()[seg].role;
    const int l = role == SegmentRole::Layer  ? seg - layout.layer_segment(0)
                  : role == SegmentRole::Lora ? seg - layout.lora_segment(0)
                                              : -1;
    ms[g] = group_compute_ms(schedule.group_work(g), l >= 0 && other_kind_layer(cfg, t, l) ? other : t) *
            schedule.group_share(g);
  }
  return ms;
}

// Compute time of an elementwise group over a segment's chunks: an update (AdamW at ns_per_float
// a parameter) or a GradAccum group (Note [gradient accumulation]), which moves 12 bytes a float
// (two read, one written) against AdamW's 28 (four read, three written) and is memory-bound like
// it: timed at 12/28 of AdamW's rate on the same threads.
double group_update_ms(const StepSchedule& schedule, const UnitTable& units, int g, double adamw_ns_per_float) {
  std::size_t floats = 0;  // the params (update) or grads (accumulation) chunks of the segment
  const SegmentKind counted = schedule.group_work(g) == GroupWork::Optimizer ? SegmentKind::Params : SegmentKind::Grads;
  for (const UnitUse& use : schedule.group(g))
    if (units.kind(use.unit) == counted) floats += units.bytes(use.unit) / sizeof(float);
  const double ns = schedule.group_work(g) == GroupWork::Optimizer ? adamw_ns_per_float : adamw_ns_per_float * 12 / 28;
  return floats * ns / 1e6;
}

struct PipelineResult {
  double step_ms = 0, optimizer_ms = 0;
  int groups_reading = 0, groups_read_ahead = 0;  // in the second step, Note [room for the window]
  UpdateWindow window;  // the second step's, Note [update window] (planner.h)
};

// The first group of the backward (the step's groups before it are its forward, with the
// Pipelined updates before each segment's forward), G when there is none.
int backward_begin(const StepSchedule& schedule) {
  for (int g = 0; g < schedule.group_count(); ++g)
    switch (schedule.group_work(g)) {
      case GroupWork::HeadBackward: case GroupWork::HeadEnd: case GroupWork::LayerBackward:
      case GroupWork::EmbedBackward: case GroupWork::VocabBackward:
        return g;
      default: break;
    }
  return schedule.group_count();
}

// Note [plan model]: the pipeline over two steps' groups; the second step's duration.
PipelineResult pipeline(const StepSchedule& schedule, const UnitTable& units, const std::vector<std::uint64_t>& reads,
                        const std::vector<std::uint64_t>& writes, const ComputeTiming& t,
                        const std::vector<double>& compute, OptimizerMode mode,
                        bool worker, int prefetch, double read_gbps, double write_gbps, std::size_t capacity,
                        const std::vector<std::size_t>& hold) {
  const int G = schedule.group_count();
  // Note [room for the window]: a group's reads open `prefetch` groups back only where the room
  // allows it: loading them while group o runs needs o's hold plus everything read for the groups
  // from o + 1 on; where that exceeds the store's capacity the reads open later. At 10% of GPT-2
  // small a block's backward holds 98 MB and reads 70 MB against 145 MB of store: the store loads
  // it only after the backward before it, as the traces show, and the plan was 20% optimistic
  // while it assumed otherwise. hold: each group's group_hold_bytes (empty where capacity is 0).
  std::vector<double> compute_end(static_cast<std::size_t>(2 * G), 0.0);
  double disk_free = 0, worker_free = 0, previous = 0, step_start = 0, optimizer_ms = 0;
  int groups_reading = 0, groups_read_ahead = 0;
  const int forward_end = backward_begin(schedule);
  const bool windowed = mode == OptimizerMode::Pipelined && forward_end < G;  // Note [update window]
  UpdateWindow window;
  for (int i = 0; i < 2 * G; ++i) {
    const int g = i % G;
    if (g == 0) step_start = previous;
    const double read_ms = read_gbps > 0 ? static_cast<double>(reads[g]) / (read_gbps * 1e6) : 0.0;
    // The group whose start opens i's reads: up to `prefetch` groups back (optional ones skipped)
    // as far as the room allows.
    int opens = i;
    std::uint64_t ahead = reads[g];  // read for the groups after `opens`, up to i
    int counted = 0;
    while (counted < prefetch && opens > 0) {
      int o = opens - 1;
      while (o > 0 && schedule.group_optional(o % G)) --o;
      if (schedule.group_optional(o % G) || (capacity > 0 && hold[o % G] + ahead > capacity)) break;
      ahead += reads[o % G];
      opens = o;
      ++counted;
    }
    if (i >= G && reads[g] > 0) {
      ++groups_reading;
      if (counted >= 2) ++groups_read_ahead;  // open before the group before it starts
    }
    const double window_open = opens >= 1 ? compute_end[opens - 1] : 0.0;
    const double read_start = std::max(disk_free, window_open);
    const double read_end = read_start + read_ms;
    if (read_ms > 0) disk_free = read_end;
    // The group's write-backs share the device with the reads that follow (one disk).
    if (write_gbps > 0 && writes[g] > 0)
      disk_free = std::max(disk_free, previous) + static_cast<double>(writes[g]) / (write_gbps * 1e6);
    double start = std::max(previous, read_end);
    double ms = schedule.group_optional(g) ? 0.0 : compute[g];
    if (schedule.group_work(g) == GroupWork::GradAccum) ms = group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
    if (schedule.group_work(g) == GroupWork::Optimizer) {
      if (mode == OptimizerMode::Inline || !worker) {  // Note [update thread]: at the group, on the pool
        ms = group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
      } else {
        // The worker: starts when queued (after the group's reads) and when free; the training
        // thread waits for it only before the segment's next forward (Pipelined) or at the end of
        // the step (Overlapped).
        const double worker_ms = group_update_ms(schedule, units, g, t.adamw_worker_ns_per_float);
        worker_free = std::max(worker_free, std::max(previous, read_end)) + worker_ms;
        if (i >= G) optimizer_ms += worker_ms;
        if (mode == OptimizerMode::Pipelined) start = std::max(start, worker_free);
      }
    }
    compute_end[i] = start + ms;
    previous = compute_end[i];
    if (windowed && i >= G && g < forward_end) {
      window.compute_ms += ms;
      window.read_bytes += reads[g];
      window.write_bytes += writes[g];
      window.ms = compute_end[i] - step_start;
    }
    if (mode == OptimizerMode::Overlapped && g == G - 1) previous = std::max(previous, worker_free);
  }
  window.disk_ms = (read_gbps > 0 ? static_cast<double>(window.read_bytes) / (read_gbps * 1e6) : 0.0) +
                   (write_gbps > 0 ? static_cast<double>(window.write_bytes) / (write_gbps * 1e6) : 0.0);
  return {previous - step_start, optimizer_ms, groups_reading, groups_read_ahead, window};
}

}  // namespace

OptimizerMode plan_mode(const PlanRequest& r, bool budget) {
  if (r.zeroth_order) return OptimizerMode::ZerothOrder;
  const OptimizerMode mode = optimizer_mode_for(r.grad_clip, budget, budget);
  // Note [plan ranks]: the owners send their updated parameters at the end of the step (Note
  // [zero sharding]), so a rank's updates cannot wait for its next forward: Pipelined ran them
  // all at the step's end, outside the schedule (GPT-2 L4 C256 at 40M on 2 ranks read 575 MiB a
  // step against the plan's 360; Inline reads 418 and its step is 7% shorter, same bits).
  return r.ranks > 1 && mode == OptimizerMode::Pipelined ? OptimizerMode::Inline : mode;
}

ActivationPolicy plan_activations_resolve(ActivationPolicy activations, bool zeroth_order) {
  if (!zeroth_order) return activations;
  STRATUM_CHECK(activations == ActivationPolicy::Auto || activations == ActivationPolicy::Recompute,
                "[cli] --activations ", activation_policy_name(activations),
                " keeps block internals for the backward, and --optimizer zo-sgd has none; drop one of them");
  return ActivationPolicy::Recompute;
}

UnitSet plan_unit_set(const PlanRequest& r) { return r.zeroth_order ? UnitSet::ForwardOnly : UnitSet::Training; }

UnitTable plan_units(const ParamLayout& layout, std::size_t act_floats, const PlanRequest& r) {
  STRATUM_ASSERT(r.activations != ActivationPolicy::Auto);
  const std::size_t internals = r.activations == ActivationPolicy::Offload
                                    ? Executor::internals_unit_floats(r.config, r.batch, r.seq, layout)
                                    : 0;
  return UnitTable(layout, act_floats, plan_unit_set(r), r.base_bf16 && r.lora.on(), internals,
                   r.grad_accum > 1 && !r.zeroth_order);
}

bool plan_mlp_may_sub_chunk(const PlanRequest& r) {
  return r.precision == Precision::Fp32 && mlp_sub_chunks_exact(r.config) &&
         (r.zeroth_order || ParamLayout::of(r.config, r.lora).mlp_frozen());
}

int plan_mlp_rows(const PlanRequest& r) {
  if (r.mlp_rows > 0) return r.mlp_rows;
  if (r.mem_budget_bytes == 0 || !plan_mlp_may_sub_chunk(r)) return r.row_chunk;
  PlanRequest t = r;
  const std::size_t pass = static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(r.seq);
  for (int rows = r.row_chunk; rows > kFrozenMlpRows; rows /= 2) {
    if (rows != r.row_chunk && static_cast<std::size_t>(rows) >= pass) continue;  // still one sub-chunk: as the chunk
    t.mlp_rows = rows;
    if (plan_min_budget_bytes(t) <= r.mem_budget_bytes) return rows;
  }
  return std::min(kFrozenMlpRows, r.row_chunk);
}

std::size_t plan_min_budget_bytes(const PlanRequest& request) {
  if (request.ranks > 1 && request.rank < 0) {  // Note [plan ranks]: the largest rank's
    std::size_t most = 0;
    each_rank_kind(request, [&](const PlanRequest& one, int) { most = std::max(most, plan_min_budget_bytes(one)); });
    return most;
  }
  PlanRequest r = request;
  if (r.mlp_rows == 0) r.mlp_rows = plan_mlp_may_sub_chunk(r) ? std::min(kFrozenMlpRows, r.row_chunk) : r.row_chunk;
  r.activations = plan_activations_resolve(request.activations, request.zeroth_order);
  if (r.activations == ActivationPolicy::Auto) {  // the smaller of the two it chooses from
    r.activations = ActivationPolicy::Recompute;
    const std::size_t recompute = plan_min_budget_bytes(r);
    r.activations = ActivationPolicy::Offload;
    return std::min(recompute, plan_min_budget_bytes(r));
  }
  const ParamLayout layout = ParamLayout::of(r.config, r.lora);
  const UnitTable units =
      plan_units(layout, Executor::activation_unit_floats(r.config, r.batch, r.seq, r.zeroth_order), r);
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  const std::unique_ptr<Executor> streaming = rank_executor(pool, r, units, plan_mode(r, true), r.mlp_rows);
  // The plan's measurement streams its one-layer model through the same budget first (Note
  // [bounded measurement]): a tiny model's run can need less than that.
  return std::max(streaming->fixed_bytes() + streaming->min_store_bytes(), plan_measure_min_bytes(pool, r));
}

std::size_t plan_offload_floor_bytes(const PlanRequest& request) {
  if (request.ranks > 1 && request.rank < 0) {  // Note [plan ranks]: the largest rank's
    std::size_t most = 0;
    each_rank_kind(request, [&](const PlanRequest& one, int) { most = std::max(most, plan_offload_floor_bytes(one)); });
    return most;
  }
  PlanRequest r = request;
  r.activations = plan_activations_resolve(request.activations, request.zeroth_order);
  if (r.activations == ActivationPolicy::Auto) r.activations = ActivationPolicy::Recompute;  // the fewer files
  const ParamLayout layout = ParamLayout::of(r.config, r.lora);
  const UnitTable units =
      plan_units(layout, Executor::activation_unit_floats(r.config, r.batch, r.seq, r.zeroth_order), r);
  if (r.ranks == 1) return units.total_bytes();
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  // Another rank's moments have no files here (Note [zero sharding]).
  return units.used_file_bytes(
      rank_executor(pool, r, units, plan_mode(r, true), r.row_chunk)->units_unused());
}

std::size_t plan_offload_shared_bytes(const PlanRequest& request, int ranks_here) {
  if (request.ranks == 1 || ranks_here <= 1) return plan_offload_floor_bytes(request);
  PlanRequest any = request;
  any.rank = -1;
  if (ranks_here < request.ranks) return plan_offload_floor_bytes(any) * static_cast<std::size_t>(ranks_here);
  std::size_t all = 0;  // every rank's
  each_rank_kind(any, [&](const PlanRequest& one, int count) {
    all += plan_offload_floor_bytes(one) * static_cast<std::size_t>(count);
  });
  return all;
}

std::string plan_row_chunk_advice(int row_chunk, std::size_t rows, std::size_t budget_bytes,
                                  const std::function<std::size_t(int)>& min_at) {
  for (int chunk = row_chunk / 2; chunk >= 64; chunk /= 2) {
    if (static_cast<std::size_t>(chunk) >= rows) continue;  // still one chunk of B*T rows
    const std::size_t need = min_at(chunk);
    if (need <= budget_bytes) return ", --row-chunk " + std::to_string(chunk) + " (minimum " + bytes_text(need) + ")";
  }
  return "";
}

std::string plan_row_chunk_advice(const PlanRequest& r, std::size_t budget_bytes) {
  PlanRequest t = r;
  t.mlp_rows = 0;  // the smallest MLP sub-chunk the run may take
  return plan_row_chunk_advice(r.row_chunk, static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(r.seq),
                               budget_bytes, [&](int chunk) {
                                 t.row_chunk = chunk;
                                 return plan_min_budget_bytes(t);
                               });
}

std::string plan_budget_refusal(const char* flag, std::size_t budget_bytes, std::size_t min_bytes, int batch, int seq,
                                const std::string& parts, const std::string& advice) {
  std::string budget = bytes_text(static_cast<double>(budget_bytes)), min = bytes_text(static_cast<double>(min_bytes));
  if (budget == min) {  // "16.3 MiB is below the minimum of 16.3 MiB": the bytes tell them apart
    budget += " (" + std::to_string(budget_bytes) + " bytes)";
    min += " (" + std::to_string(min_bytes) + " bytes)";
  }
  return detail::concat(flag, " ", budget, " is below the minimum of ", min, " for this model at B=", batch, " T=", seq,
                        parts.empty() ? std::string() : " (" + parts + ")", "; use ", flag, " ",
                        min_bytes < (1 << 20) ? std::to_string((min_bytes + 1023) >> 10) + "K"  // not 1M for 158K
                                              : std::to_string((min_bytes + (1 << 20) - 1) >> 20) + "M",
                        " or more", advice, ", or lower --batch/--seq");
}

std::string plan_min_parts(std::size_t engine_bytes, std::size_t working_set_bytes) {
  return "engine buffers " + bytes_text(static_cast<double>(engine_bytes)) + " + largest working set " +
         bytes_text(static_cast<double>(working_set_bytes));
}

void plan_budget_check(const PlanRequest& r, std::size_t min_budget_bytes) {
  STRATUM_CHECK(r.mem_budget_bytes == 0 || r.mem_budget_bytes >= min_budget_bytes, "[plan] ",
                plan_budget_refusal("--mem-budget", r.mem_budget_bytes, min_budget_bytes, r.batch, r.seq, "",
                                    plan_row_chunk_advice(r, r.mem_budget_bytes)));
}

// The network's share of rank p.rank's step (Note [plan ranks], Note [zero sharding]): a
// gradient copy per micro-batch it runs (the running sums; rank P-1's last one goes to the
// owners instead) and its owned parameters to every other rank (taken in during the next
// forward), overlapped with the compute; then, after the last backward, the running-sum chain's
// tail and the final hop to the owner, which nothing overlaps.
void plan_network(Plan& p, const PlanRequest& r, std::size_t owned_floats) {
  const ParamLayout layout = ParamLayout::of(r.config, r.lora);
  std::uint64_t grads = 0, chunk = 0;  // the gradient copy a message chain moves, its largest message
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (!layout.trainable(s)) continue;
    for (int c = 0; c < layout.segments()[s].chunk_count(); ++c) {
      const std::uint64_t bytes = layout.segments()[s].chunk_floats(c) * sizeof(float);
      grads += bytes;
      chunk = std::max(chunk, bytes);
    }
  }
  const double bytes_per_ms = r.net_gbps * 1e9 / 8 / 1e3;
  // Rank P-1's last micro-batch sends the final gradients to their owners: none of its own.
  const std::uint64_t owned_bytes = owned_floats * sizeof(float);
  p.net_sent_bytes = grads * static_cast<std::uint64_t>(r.grad_accum / r.ranks) -
                     (p.rank == r.ranks - 1 ? owned_bytes : 0) + owned_bytes * static_cast<std::uint64_t>(r.ranks - 1);
  p.net_ms = static_cast<double>(p.net_sent_bytes) / bytes_per_ms;
  p.net_tail_ms = r.ranks * static_cast<double>(chunk) / bytes_per_ms;
  if (p.net_ms > p.step_ms) p.bottleneck = "network";
  p.step_ms = std::max(p.step_ms, p.net_ms) + p.net_tail_ms;
}

Plan plan_make(const PlanRequest& r, const ComputeTiming& measured, double read_gbps, double write_gbps) {
  plan_ranks_check(r);
  if (r.ranks > 1 && r.rank < 0) {  // Note [plan ranks]: each kind of rank; the slowest
    const std::size_t most = plan_min_budget_bytes(r);  // the largest minimum, refused as such
    plan_budget_check(r, most);
    std::optional<Plan> slowest;
    each_rank_kind(r, [&](const PlanRequest& one, int) {
      Plan p = plan_make(one, measured, read_gbps, write_gbps);
      if (!slowest || p.step_ms > slowest->step_ms) slowest = std::move(p);
    });
    slowest->min_budget_bytes = most;
    return *slowest;
  }
  ComputeTiming t = measured;  // a recompute runs most of the block forward again in the backward
  if (r.activations == ActivationPolicy::Recompute) {
    t.layer_backward_ms += t.layer_forward_ms * plan_recompute_share(r.config, r.seq);
    t.other_layer_backward_ms += t.other_layer_forward_ms * plan_recompute_share(r.config, r.seq);
  }
  const GptConfig& cfg = r.config;
  cfg.validate();
  const ParamLayout layout = ParamLayout::of(cfg, r.lora);
  const UnitTable units = plan_units(layout, Executor::activation_unit_floats(cfg, r.batch, r.seq, r.zeroth_order), r);
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  Plan p;
  p.mode = plan_mode(r, r.mem_budget_bytes > 0);
  p.mlp_rows = plan_mlp_rows(r);
  const std::unique_ptr<Executor> made = rank_executor(pool, r, units, p.mode, p.mlp_rows);
  const Executor& exec = *made;
  p.ranks = r.ranks;
  p.rank = std::max(r.rank, 0);
  p.optimizer_worker = exec.optimizer_worker();
  const StepSchedule& schedule = exec.schedule();
  const std::vector<double> compute = group_computes(schedule, layout, cfg, t);
  p.engine_bytes = exec.fixed_bytes();
  // The minimum is a streaming run's (its optimizer mode may differ from an in-RAM run's), at the
  // smallest MLP sub-chunk the run may take.
  PlanRequest smallest = r;
  smallest.mlp_rows = 0;
  p.min_budget_bytes = plan_min_budget_bytes(smallest);
  p.read_gbps = read_gbps;
  p.write_gbps = write_gbps;
  p.timing = measured;
  // Another rank's moments are never touched here (Note [zero sharding]): not in RAM or on disk.
  const std::vector<bool> unused = exec.units_unused();
  auto others = [&](int u) { return !unused.empty() && unused[static_cast<std::size_t>(u)]; };
  const std::size_t total = units.used_bytes(unused);  // what this rank holds, as its store counts it
  for (int u = 0; u < units.count(); ++u) {
    if (others(u)) continue;
    switch (units.kind(u)) {
      case SegmentKind::Params: p.params_bytes += units.bytes(u); break;
      case SegmentKind::Grads: case SegmentKind::GradSum: p.grads_bytes += units.bytes(u); break;
      case SegmentKind::AdamM: case SegmentKind::AdamV: p.moments_bytes += units.bytes(u); break;
      case SegmentKind::Activations: p.activation_bytes += units.bytes(u); break;
      case SegmentKind::Internals: p.internals_bytes += units.bytes(u); break;
    }
  }
  plan_budget_check(r, p.min_budget_bytes);
  p.streaming = r.mem_budget_bytes > 0 && total > r.mem_budget_bytes - p.engine_bytes;  // as the store decides
  const std::size_t capacity = p.streaming ? r.mem_budget_bytes - p.engine_bytes : total;
  p.disk_bytes = r.mem_budget_bytes > 0 ? units.used_file_bytes(unused) : 0;

  // Traffic and time: the store model per prefetch depth (its write-behind depends on the depth),
  // the pipeline over each; the smallest depth from 2 within 2% of the best (deeper windows hold more).
  const int G = schedule.group_count();
  Traffic traffic;
  if (!p.streaming) {
    traffic = traffic_replay(units, schedule, capacity, -1);
    p.prefetch = 0;
    std::fill(traffic.group_read.begin(), traffic.group_read.end(), 0);
    std::fill(traffic.group_written.begin(), traffic.group_written.end(), 0);
    p.step_ms = pipeline(schedule, units, traffic.group_read, traffic.group_written, t, compute, p.mode, p.optimizer_worker, 0,
                         0.0, 0.0, 0, {})
                    .step_ms;
  } else {
    // One replay and pipeline per depth; without --prefetch, depths 0..6 for the choice.
    std::vector<std::size_t> hold(static_cast<std::size_t>(G));  // Note [room for the window]
    for (int g = 0; g < G; ++g) hold[g] = group_hold_bytes(schedule, units, g);
    auto pipeline_at = [&](int depth, const Traffic& tk) {
      return pipeline(schedule, units, tk.group_read, tk.group_written, t, compute, p.mode, p.optimizer_worker, depth,
                      read_gbps, write_gbps, capacity, hold);
    };
    PipelineResult chosen;
    if (r.prefetch >= 0) {
      p.prefetch = r.prefetch;
      traffic = traffic_replay(units, schedule, capacity, p.prefetch, &exec.discards());
      chosen = pipeline_at(p.prefetch, traffic);
    } else {
      std::vector<Traffic> by_depth_traffic;
      std::vector<PipelineResult> by_depth_result;
      std::vector<double> by_depth;
      for (int k = 0; k <= 6; ++k) {
        by_depth_traffic.push_back(traffic_replay(units, schedule, capacity, k, &exec.discards()));
        by_depth_result.push_back(pipeline_at(k, by_depth_traffic.back()));
        by_depth.push_back(by_depth_result.back().step_ms);
      }
      // The fastest depth from 1, or the smallest from 2 within 2% of it: the model does not see
      // what a second group of lookahead gains where the budget is full of write-backs, and runs
      // measured it 3-8% faster than 1 at GPT-2 small's 25%, 2-4% on an 8-layer Llama at 17%, the
      // same at 10% and in the quickstart (docs/benchmarks.md).
      const auto fastest = std::min_element(by_depth.begin() + 1, by_depth.end());
      const double best = *fastest;
      p.prefetch = static_cast<int>(fastest - by_depth.begin());
      for (int k = 2; k <= 6; ++k)
        if (by_depth[k] <= best * 1.02) {
          p.prefetch = k;
          break;
        }
      traffic = std::move(by_depth_traffic[p.prefetch]);
      chosen = by_depth_result[p.prefetch];
    }
    p.step_ms = chosen.step_ms;
    p.window = chosen.window;
    p.groups_reading = chosen.groups_reading;
    p.groups_read_ahead = chosen.groups_read_ahead;
  }
  p.read_bytes = p.streaming ? traffic.read : 0;
  p.write_bytes = p.streaming ? traffic.written : 0;
  p.peak_ram_bytes = p.engine_bytes + (p.streaming ? traffic.peak_bytes : total);

  // Where each segment lives.
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentPlace place{layout.segments()[s].name};
    for (int k = 0; k < kSegmentKindCount; ++k)
      for (int c = 0; c < units.chunk_count(s, static_cast<SegmentKind>(k)); ++c) {
        const int u = units.index(s, static_cast<SegmentKind>(k), c);
        if (others(u)) continue;
        place.bytes += units.bytes(u);
        if (!p.streaming || !traffic.evicted[u]) place.resident_bytes += units.bytes(u);
        place.read_bytes += p.streaming ? traffic.unit_read[u] : 0;
        place.write_bytes += p.streaming ? traffic.unit_written[u] : 0;
      }
    p.segments.push_back(place);
  }

  // Time.
  const std::size_t floats = segment_floats(layout, exec);
  p.owned_params = exec.owned_trainable_params();
  // On the training thread: inline, or at each segment's group without a worker (Note [update thread]).
  const bool updates_on_pool = p.mode == OptimizerMode::Inline || !p.optimizer_worker;
  const double adamw_ns = updates_on_pool ? t.adamw_inline_ns_per_float : t.adamw_worker_ns_per_float;
  p.optimizer_ms = p.mode == OptimizerMode::ZerothOrder ? 0.0 : floats * adamw_ns / 1e6;  // zo: inside the forward
  double accum_ms = 0;  // the GradAccum groups (Note [gradient accumulation])
  for (int g = 0; g < G; ++g) {
    p.compute_ms += compute[g];
    if (schedule.group_work(g) == GroupWork::GradAccum)
      accum_ms += group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
  }
  p.compute_ms += accum_ms;
  p.read_ms = read_gbps > 0 ? p.read_bytes / (read_gbps * 1e6) : 0.0;
  p.write_ms = write_gbps > 0 ? p.write_bytes / (write_gbps * 1e6) : 0.0;
  const int nv = layout.vocab_block_count();
  double layers_ms = 0;  // Note [mixed layers]
  for (int l = 0; l < cfg.n_layer; ++l)
    layers_ms += other_kind_layer(cfg, t, l) ? t.other_layer_forward_ms + t.other_layer_backward_ms
                                              : t.layer_forward_ms + t.layer_backward_ms;
  p.ram_step_ms = (r.grad_accum / r.ranks) * (t.other_ms + layers_ms +
                                  nv * (t.vocab_forward_ms + t.vocab_backward_ms + t.head_lse_ms + t.head_backward_ms)) +
                  accum_ms + floats * t.adamw_inline_ns_per_float / 1e6;
  if (p.mode == OptimizerMode::ZerothOrder) p.ram_step_ms = p.compute_ms;  // two forward passes
  const double cpu_ms = updates_on_pool ? p.compute_ms + p.optimizer_ms : p.compute_ms;
  struct Candidate {
    const char* name;
    double ms;
  };
  const Candidate candidates[] = {{"compute", cpu_ms}, {"read", p.read_ms}, {"write", p.write_ms},
                                  {"optimizer", updates_on_pool ? 0.0 : p.optimizer_ms}};
  p.bottleneck = std::max_element(std::begin(candidates), std::end(candidates),
                                  [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; })->name;
  // Compute is the busiest resource but the pipeline waits on the disk for part of the step:
  // say so (the reads cannot all be hidden behind the compute next to them), and where most of
  // that wait is the update window's, name it (Note [update window]).
  if (p.bottleneck == std::string("compute") && p.step_ms > 1.05 * cpu_ms) {
    const double window_wait = p.window.ms - p.window.compute_ms;
    p.bottleneck = p.window.disk_ms > p.window.compute_ms && window_wait >= 0.5 * (p.step_ms - cpu_ms)
                       ? "the update window (disk)"
                       : "read (stalls)";
  }
  if (r.ranks > 1 && r.net_gbps > 0) plan_network(p, r, floats);
  return p;
}

ActivationChoice plan_choose_activations(const PlanRequest& request, const ComputeTiming& timing, double read_gbps,
                                         double write_gbps, std::size_t disk_free_bytes) {
  ActivationChoice choice;
  if (request.zeroth_order) {
    choice.why = "zo-sgd: no backward, so no block internals to keep";
    return choice;
  }
  if (request.mem_budget_bytes == 0) {
    choice.why = "no budget: block internals recomputed (--activations keep keeps them, if RAM allows)";
    return choice;
  }
  PlanRequest r = request;
  struct Option {
    ActivationPolicy policy;
    std::size_t min_bytes;
    Plan plan;
  };
  std::vector<Option> options;
  for (ActivationPolicy policy : {ActivationPolicy::Recompute, ActivationPolicy::Offload}) {
    r.activations = policy;
    const std::size_t min_bytes = plan_min_budget_bytes(r);
    options.push_back({policy, min_bytes, Plan{}});
    if (request.mem_budget_bytes >= min_bytes) options.back().plan = plan_make(r, timing, read_gbps, write_gbps);
  }
  const Option& recompute = options[0];
  const Option& offload = options[1];
  const bool recompute_fits = request.mem_budget_bytes >= recompute.min_bytes;
  const bool offload_fits = request.mem_budget_bytes >= offload.min_bytes;
  if (!recompute_fits && !offload_fits) plan_budget_check(request, std::min(recompute.min_bytes, offload.min_bytes));
  // Offload's files hold every layer's internals too: where they do not fit on the disk, recompute.
  const bool offload_disk = disk_free_bytes == 0 || !offload_fits || offload.plan.disk_bytes <= disk_free_bytes;
  const bool pick_offload = offload_fits && offload_disk &&
                            (!recompute_fits || offload.plan.step_ms < 0.98 * recompute.plan.step_ms);
  const Option& chosen = pick_offload ? offload : recompute;
  choice.policy = chosen.policy;
  choice.plan = chosen.plan;
  auto predicted = [&](const Option& o) {
    if (request.mem_budget_bytes < o.min_bytes) return "does not fit (minimum " + bytes_text(o.min_bytes) + ")";
    if (&o == &offload && !offload_disk)
      return "does not fit on the disk (" + bytes_text(o.plan.disk_bytes) + " of files, " +
             bytes_text(disk_free_bytes) + " free)";
    char text[96];
    std::snprintf(text, sizeof text, "%.0f ms a step", o.plan.step_ms);
    return std::string(text);
  };
  choice.why = std::string("activations ") + activation_policy_name(choice.policy) + " (auto: recompute " +
               predicted(recompute) + ", offload " + predicted(offload) + ")";
  return choice;
}

}  // namespace stratum
