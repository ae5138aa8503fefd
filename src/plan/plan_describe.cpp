// plan_describe: the plan as the lines `stratum plan` prints; see planner.h.
#include <cstdio>
#include <string>

#include "core/byte_size.h"
#include "model/param_layout.h"
#include "plan/planner.h"

namespace stratum {
namespace {
const char* segment_group_name(SegmentRole role, ModelArch arch) {
  const bool llama = arch == ModelArch::Llama;
  switch (role) {
    case SegmentRole::Embed: return llama ? "embed (empty)" : "embed (wpe)";
    case SegmentRole::Layer: return "layers";
    case SegmentRole::Head: return llama ? "head (model.norm)" : "head (ln_f)";
    case SegmentRole::Vocab: return llama ? "embed_tokens blocks" : "wte vocabulary blocks";
    case SegmentRole::HeadVocab: return "lm_head blocks";
    case SegmentRole::Lora: return "LoRA adapters";
  }
  return "?";
}
}  // namespace

std::string plan_describe(const Plan& p, const PlanRequest& r) {
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  std::string ranks_text;  // Note [plan ranks]
  if (p.ranks > 1) {
    char text[256];
    std::snprintf(text, sizeof text,
                  " on %d ranks; what follows is rank %d's%s: %d micro-batch%s, updates %.3fM of the %.3fM trainable "
                  "parameters and holds only their moments (ZeRO)",
                  p.ranks, p.rank, r.rank < 0 ? " (the slowest)" : "", r.grad_accum / p.ranks,
                  r.grad_accum / p.ranks == 1 ? "" : "es", p.owned_params / 1e6,
                  ParamLayout::of(r.config, r.lora).num_trainable_params() / 1e6);
    ranks_text = text;
  }
  add("model %s, B=%d T=%d x %d micro-batches (%d tokens/step)%s, %s activations, optimizer %s\n",
      r.config.describe().c_str(), r.batch, r.seq, r.grad_accum, r.batch * r.seq * r.grad_accum,
      ranks_text.c_str(),
      r.activations == ActivationPolicy::Keep      ? "kept"
      : r.activations == ActivationPolicy::Offload ? "offloaded"
                                                   : "recomputed",
      optimizer_mode_name(p.mode));
  add("state: params %s, grads %s, AdamW moments %s, boundary activations %s%s%s; engine buffers %s\n",
      bytes_text(p.params_bytes).c_str(), bytes_text(p.grads_bytes).c_str(), bytes_text(p.moments_bytes).c_str(),
      bytes_text(p.activation_bytes).c_str(), p.internals_bytes > 0 ? ", block internals " : "",
      p.internals_bytes > 0 ? bytes_text(p.internals_bytes).c_str() : "", bytes_text(p.engine_bytes).c_str());
  add("memory: minimum budget %s; %s\n", bytes_text(p.min_budget_bytes).c_str(),
      r.mem_budget_bytes == 0 ? "no budget: everything in RAM"
      : p.streaming ? ("budget " + bytes_text(r.mem_budget_bytes) + " = " +
                       std::to_string(static_cast<int>(
                           0.5 + 100.0 * r.mem_budget_bytes / (p.params_bytes + p.grads_bytes + p.moments_bytes))) +
                       "% of the training state: streaming, offload files " + bytes_text(p.disk_bytes) + " on disk" +
                       (p.ranks > 1 ? " (this rank's)" : ""))
                          .c_str()
                    : ("budget " + bytes_text(r.mem_budget_bytes) + " holds everything: nothing streamed").c_str());
  if (r.row_chunk != kRowChunk)
    add("blocks in row chunks of %d rows (--row-chunk; the default is %d; Note [row chunks])\n", r.row_chunk, kRowChunk);
  if (p.mlp_rows > 0 && p.mlp_rows < r.row_chunk)
    add("MLP in sub-chunks of %d rows: it trains nothing, and the largest sub-chunk whose minimum fits the budget "
        "(Note [frozen MLP rows]; same bits)\n", p.mlp_rows);
  // Segments grouped by role, in layout order.
  out += "placement (per step, steady state):\n";
  for (SegmentRole role :
       {SegmentRole::Embed, SegmentRole::Vocab, SegmentRole::Layer, SegmentRole::Head, SegmentRole::HeadVocab,
        SegmentRole::Lora}) {
    std::size_t bytes = 0, resident = 0, count = 0;
    std::uint64_t read = 0, written = 0;
    const ParamLayout layout = ParamLayout::of(r.config, r.lora);
    for (int s = 0; s < layout.segment_count(); ++s) {
      if (layout.segments()[s].role != role) continue;
      const SegmentPlace& place = p.segments[s];
      bytes += place.bytes;
      resident += place.resident_bytes;
      read += place.read_bytes;
      written += place.write_bytes;
      ++count;
    }
    if (count == 0) continue;
    const char* name = segment_group_name(role, layout.arch());
    add("  %-22s %4zu x  %10s  %s, read %s + written %s\n", name, count, bytes_text(bytes).c_str(),
        resident == bytes ? "stays in RAM" : resident == 0 ? "streamed    " : "partly in RAM", bytes_text(read).c_str(),
        bytes_text(written).c_str());
  }
  if (p.streaming) {
    add("I/O per step: read %s, written %s; offload dir %.2f GB/s read, %.2f GB/s write (calibrated); prefetch %d\n",
        bytes_text(p.read_bytes).c_str(), bytes_text(p.write_bytes).c_str(), p.read_gbps, p.write_gbps, p.prefetch);
    if (p.prefetch >= 2)
      add("reads ahead: %d of the %d groups that read have room to load before the group before them starts; the "
          "rest load while it runs or on use\n", p.groups_read_ahead, p.groups_reading);
  }
  add("peak RAM (engine): %s\n", bytes_text(p.peak_ram_bytes).c_str());
  add("measured: block forward %.1f ms, backward %.1f ms (without a recompute); per vocabulary block: embedding %.2f ms, head %.1f ms; "
      "AdamW %.2f ns/float inline, %.2f ns/float on the worker\n",
      p.timing.layer_forward_ms, p.timing.layer_backward_ms, p.timing.vocab_forward_ms + p.timing.vocab_backward_ms,
      p.timing.head_lse_ms + p.timing.head_backward_ms, p.timing.adamw_inline_ns_per_float,
      p.timing.adamw_worker_ns_per_float);
  if (p.timing.other_layer_forward_ms > 0)  // Note [mixed layers]
    add("measured: a %s layer (block forward and backward above: layer 0's kind) forward %.1f ms, backward %.1f ms\n",
        r.config.layer_sliding_attention(0) ? "full" : "sliding", p.timing.other_layer_forward_ms,
        p.timing.other_layer_backward_ms);
  add("busy per step: compute %.0f ms, optimizer %.0f ms (%s), reads %.0f ms, writes %.0f ms\n", p.compute_ms,
      p.optimizer_ms, p.mode == OptimizerMode::Inline        ? "inline"
      : p.mode == OptimizerMode::ZerothOrder ? "in the forward passes"
      : p.optimizer_worker                   ? "on the worker"
      : p.mode == OptimizerMode::Pipelined   ? "on the compute threads, before each segment's forward"
                                             : "on the compute threads, after each segment's backward",
      p.read_ms, p.write_ms);
  if (p.window.ms > 0)  // Note [update window]
    add("update window (after the gradient norm, each segment's update before its forward, to the head): read %s + "
        "written %s, %.0f ms of disk at the rates above against %.0f ms of forward compute; %.0f ms predicted\n",
        bytes_text(p.window.read_bytes).c_str(), bytes_text(p.window.write_bytes).c_str(), p.window.disk_ms,
        p.window.compute_ms, p.window.ms);
  if (p.ranks > 1 && r.net_gbps > 0)
    add("network (Note [plan ranks]): rank %d sends %s a step (gradient sums, and its updated parameters "
        "to every rank during the next forward), %.0f ms at %g Gb/s beside its compute; %.1f ms after the last "
        "backward (the sums' chain, the final gradients to their owners)\n",
        p.rank, bytes_text(p.net_sent_bytes).c_str(), p.net_ms, r.net_gbps, p.net_tail_ms);
  add("predicted step: %.0f ms (%.0f tokens/s), %.2fx the in-RAM step of %.0f ms; bottleneck: %s\n", p.step_ms,
      static_cast<double>(r.batch) * r.seq * r.grad_accum / (p.step_ms / 1000.0), p.step_ms / p.ram_step_ms,
      p.ram_step_ms, p.bottleneck.c_str());
  return out;
}

}  // namespace stratum
