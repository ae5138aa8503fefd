// TrainRun's executor and stores (store_make: RAM, the tiered store under --mem-budget with the
// plan, the device tier in front of either) and its end-of-run report; see train_run.h.
#include <algorithm>
#include <optional>
#include <cstdio>
#include <memory>

#include "core/hash.h"
#include "backend/backend.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "weights/model_io.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/device_segment_store.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "core/byte_size.h"
#include "core/process_memory.h"
#include "stratum/error.h"
#include "exec/executor.h"

#include "train/train_run.h"

namespace stratum::detail {

void TrainRun::store_make() {
  layout_ = std::make_unique<ParamLayout>(ParamLayout::of(cfg_, lora_));
  // The run as the planner sees it: its units and optimizer mode come from the same request.
  // A LoRA run over a base stored in bf16 keeps its frozen layers bf16 (Note [frozen bf16 base]).
  const bool base_bf16 = lora_.on() && !o_.model_dir.empty() && model_weights_bf16(o_.model_dir);
  const bool zo = o_.optimizer == TrainOptimizer::ZoSgd;
  PlanRequest request{cfg_,         o_.batch,           o_.seq,      plan_activations_resolve(o_.activations, zo),
                      o_.grad_clip, o_.mem_budget_bytes, o_.prefetch, o_.precision,
                      zo,           lora_,              base_bf16,   pool_->num_threads(), o_.grad_accum};
  request.row_chunk = o_.row_chunk;
  request.ranks = ranks();  // this rank's plan (Note [plan ranks]); the network is not planned
  request.rank = rank();
  const bool budget = o_.mem_budget_bytes > 0;
  STRATUM_CHECK(budget || o_.offload_dir.empty(), "[train] --offload-dir needs --mem-budget SIZE (e.g. --mem-budget 2G)");
  // Ranks on one machine share its disk (their --offload-dir is one): for its room, and each
  // plans with its share of the measured rates (Note [plan ranks]).
  const int sharing = o_.comm != nullptr ? o_.comm->node_size() : 1;
  // A disk without room for the state refused before the plan measures (which takes a while on a
  // large model); the store checks the exact need when made. With ranks, this rank's files hold
  // only its own moments; those of every rank on this machine must fit.
  if (budget && dir_exists(o_.offload_dir))
    offload_disk_check(o_.offload_dir, offload_free_bytes(o_.offload_dir), plan_offload_shared_bytes(request, sharing));
  // The smallest --mem-budget this command takes, as `stratum plan` gives it: the smallest MLP
  // sub-chunk's, under auto the smaller policy's, the plan's measurement included (Note [bounded
  // measurement]; a run refused at its own minimum used to be refused again there). With ranks,
  // the largest rank's: every rank refuses the same budget with the same line (Note [plan ranks]).
  // The header prints it; refused here, before anything is measured.
  const bool host_buffers = o_.backend == Backend::Cpu && !o_.mirror_store;
  std::size_t job_min = 0;
  if (budget && host_buffers) {
    PlanRequest job = request;
    if (job.ranks > 1) job.rank = -1;
    job_min = plan_min_budget_bytes(job);
    STRATUM_CHECK(o_.mem_budget_bytes >= job_min, "[train] ",
                  plan_budget_refusal("--mem-budget", o_.mem_budget_bytes, job_min, o_.batch, o_.seq, "",
                                      plan_row_chunk_advice(job, o_.mem_budget_bytes)));
  }
  // The plan's measurement (Note [plan model]), with a budget: before the executor when the plan
  // chooses the activations policy (Note [activations offload]), which the executor is made with.
  PlanMeasurement measured;
  std::optional<Plan> plan;  // auto under a budget: the chosen policy's, made with `measured`
  CalibrationOptions co;
  co.offload_dir = o_.offload_dir;
  co.threads = threads_;
  auto measure = [&] {
    PlanMeasurement m = plan_measure(request, co, threads_, o_.measure_exe);
    m.read_gbps /= sharing;
    m.write_gbps /= sharing;
    return m;
  };
  if (request.activations == ActivationPolicy::Auto) {
    if (!budget || o_.backend != Backend::Cpu || o_.mirror_store) {  // the plan models the CPU's compute only
      request.activations = ActivationPolicy::Recompute;
    } else {
      measured = measure();
      const ActivationChoice choice = plan_choose_activations(
          request, measured.timing, measured.read_gbps, measured.write_gbps, offload_free_bytes(o_.offload_dir));
      request.activations = choice.policy;
      plan = choice.plan;
      activations_line_ = "[stratum] " + choice.why + "\n";
    }
  }
  activations_ = request.activations;
  // Note [frozen MLP rows]: the MLP's sub-chunk for the chosen policy (as its plan took it),
  // for the CPU's buffers under the budget (on a device tier they are device memory, outside
  // --mem-budget).
  request.mlp_rows = host_buffers ? plan_mlp_rows(request) : o_.row_chunk;
  if (request.mlp_rows < o_.row_chunk)
    mlp_line_ = "[stratum] MLP in sub-chunks of " + std::to_string(request.mlp_rows) +
                " rows (it trains nothing here; the largest sub-chunk whose buffers fit --mem-budget; same bits)\n";
  units_ = std::make_unique<UnitTable>(
      plan_units(*layout_, Executor::activation_unit_floats(cfg_, o_.batch, o_.seq, request.zeroth_order), request));
  OptimizerMode exec_mode = OptimizerMode::Inline;  // the executor's, for the --row-chunk advice below
  // Note [attention lanes] (kernels/cuda/cuda_context.cuh): under --gpu-mem-budget one sequence's
  // attention at a time, whose scratch leaves the room to the state (GPT-2 small at 1000M: 194 ms
  // a step with one lane, 214 with four, 96 against 384 MiB of scratch; in GPU memory four lanes
  // make the keep step 104.1-104.4 ms against 108.9-109.2). The same bits either way.
  const int attention_lanes = o_.gpu_mem_budget_bytes > 0 ? 1 : 0;
  auto exec_make = [&](OptimizerMode mode) {
    exec_mode = mode;
    exec_.reset();  // a previous one's device buffers first
    exec_ = std::make_unique<Executor>(*pool_, cfg_, *units_, o_.batch, o_.seq, request.activations, mode,
                                       o_.precision, o_.backend, o_.grad_accum / ranks(), o_.comm,
                                       BlockRows{o_.row_chunk, request.mlp_rows}, attention_lanes);
  };
  exec_make(plan_mode(request, budget));
  if (const std::string note = backend_precision_note(o_.precision); !note.empty())
    std::fprintf(stderr, "[stratum] %s\n", note.c_str());
  // Off the host the executor computes on the device tier (Note [device tier]) in front of the
  // RAM store or the RAM-over-NVMe store; its buffers (fixed_bytes) are device memory then.
  const bool device_tier = !exec_->ops().host_memory() || o_.mirror_store;
  if (device_tier && !zo) {  // Note [host optimizer]: where AdamW runs, and why
    const std::size_t state = units_->total_bytes() + exec_->fixed_bytes();
    const bool fits = o_.gpu_mem_budget_bytes == 0 || state <= o_.gpu_mem_budget_bytes;
    const std::string device = exec_->ops().name();
    const std::string why =
        o_.adamw_on != AdamWOn::Auto ? std::string(o_.adamw_on == AdamWOn::Host ? "--adamw-on cpu" : "--adamw-on gpu")
        : o_.gpu_mem_budget_bytes == 0
            ? std::string("the whole state is there: no --gpu-mem-budget")
            : "the state and the engine buffers (" + bytes_text(state) + ") " + (fits ? "fit" : "exceed") +
                  " --gpu-mem-budget " + bytes_text(o_.gpu_mem_budget_bytes);
    if (o_.adamw_on == AdamWOn::Host || (o_.adamw_on == AdamWOn::Auto && !fits)) {
      const OptimizerMode mode = optimizer_mode_for(o_.grad_clip, true, budget);  // on the worker thread
      if (mode != plan_mode(request, budget)) exec_make(mode);
      exec_->optimizer_on_host();
      result_.adamw_on_host = true;
      std::size_t moments = 0;
      for (int u = 0; u < units_->count(); ++u)
        if (units_->kind(u) == SegmentKind::AdamM || units_->kind(u) == SegmentKind::AdamV) moments += units_->bytes(u);
      optimizer_line_ = "[stratum] AdamW on the CPU beside the " + device + " (ZeRO-Offload; " + why +
                        "): its moments (" + bytes_text(moments) +
                        ") stay in host memory, gradients come down, updated parameters go up\n";
    } else {
      optimizer_line_ = "[stratum] AdamW on the " + device + " (" + why + ")\n";
      // Note [device updates before their forward] (exec/executor.h).
      if (exec_mode == OptimizerMode::Inline && ranks() == 1) exec_make(OptimizerMode::Pipelined);
    }
  }
  const Executor& exec = *exec_;
  const std::size_t host_fixed = device_tier ? 0 : exec.fixed_bytes();
  if (device_tier) result_.prefetch = o_.prefetch >= 0 ? o_.prefetch : 2;  // the plan models the CPU's compute only
  min_budget_ = job_min > 0 ? job_min : exec.fixed_bytes() + exec.min_store_bytes();
  if (o_.gpu_mem_budget_bytes > 0 && o_.gpu_mem_budget_bytes < min_budget_) {
    const std::string parts = plan_min_parts(exec.fixed_bytes(), exec.min_store_bytes());
    // The same run at a smaller --row-chunk (the GPU's default is 4096: Note [device row chunk]),
    // whose engine buffers are smaller: the largest whose minimum fits, measured by making it.
    exec_.reset();
    const std::string advice = plan_row_chunk_advice(
        o_.row_chunk, static_cast<std::size_t>(o_.batch) * static_cast<std::size_t>(o_.seq), o_.gpu_mem_budget_bytes,
        [&](int chunk) {
          Executor smaller(*pool_, cfg_, *units_, o_.batch, o_.seq, request.activations, exec_mode, o_.precision,
                           o_.backend, o_.grad_accum / ranks(), o_.comm, BlockRows::whole(chunk), attention_lanes);
          if (result_.adamw_on_host) smaller.optimizer_on_host();
          return smaller.fixed_bytes() + smaller.min_store_bytes();
        });
    STRATUM_FAIL("[train] ", plan_budget_refusal("--gpu-mem-budget", o_.gpu_mem_budget_bytes, min_budget_, o_.batch,
                                                 o_.seq, parts, advice));
  }
  auto device_attach = [&] {
    const std::size_t device_budget = o_.gpu_mem_budget_bytes > 0 ? o_.gpu_mem_budget_bytes - exec.fixed_bytes() : 0;
    mirror_ = std::make_unique<DeviceSegmentStore>(*store_, exec_->ops_shared(), device_budget, result_.prefetch);
    exec_->attach(*mirror_);
    store_text_ = std::string(exec.ops().name()) + " memory " +
                  (device_budget > 0 ? "budget " + bytes_text(o_.gpu_mem_budget_bytes) + " (minimum " + bytes_text(min_budget_) + ")"
                                     : std::string("holds everything")) +
                  " over " + (budget ? store_text_ : std::string("RAM (checkpoints are written from there)"));
  };
  if (!budget) {
    memory_fit_check(units_->used_bytes(exec.units_unused()) + host_fixed, "train",
                     "the run (parameters, gradients, optimizer state, activations, engine buffers)",
                     "train under a budget: --mem-budget SIZE --offload-dir DIR (`stratum plan` shows the smallest)");
    store_ = std::make_unique<RamSegmentStore>(*units_);
    if (device_tier) device_attach();
    else exec_->attach(*store_);
    return;
  }
  const std::size_t host_min = host_fixed + exec.min_host_store_bytes();
  STRATUM_CHECK(o_.mem_budget_bytes >= host_min, "[train] ",
                plan_budget_refusal("--mem-budget", o_.mem_budget_bytes, host_min, o_.batch, o_.seq,
                                    plan_min_parts(host_fixed, exec.min_host_store_bytes()),
                                    device_tier ? std::string() : plan_row_chunk_advice(request, o_.mem_budget_bytes)));
  if (!device_tier) {
    // The plan (Note [plan model]): the predicted step time for the log, and the prefetch depth
    // unless --prefetch chose one.
    if (!plan) {
      measured = measure();
      plan = plan_make(request, measured.timing, measured.read_gbps, measured.write_gbps);
    }
    result_.predicted_step_ms = plan->step_ms;
    result_.prefetch = plan->prefetch;
    char plan_text[400];
    std::snprintf(plan_text, sizeof plan_text,
                  "[stratum] plan: %s per step read, %s written, predicted step %.0f ms (bottleneck: %s), prefetch %d "
                  "(%s); measured with a peak RSS of %s%s\n",
                  bytes_text(plan->read_bytes).c_str(), bytes_text(plan->write_bytes).c_str(), plan->step_ms,
                  plan->bottleneck.c_str(), plan->prefetch, o_.prefetch >= 0 ? "--prefetch" : "chosen by the plan",
                  bytes_text(measured.peak_rss_bytes).c_str(),
                  sharing > 1 ? ("; the disk shared by the " + std::to_string(sharing) + " ranks on this machine")
                                    .c_str()
                              : "");
    plan_line_ = plan_text;
  }
  TieredStoreOptions so;
  so.budget_bytes = o_.mem_budget_bytes - host_fixed;
  so.offload_dir = o_.offload_dir;
  so.prefetch_depth = result_.prefetch;
  so.io.backend = o_.io_backend;
  so.io.block_bytes = o_.io_block_bytes;
  so.io.queue_depth = o_.io_queue_depth;
  so.io.fault = o_.io_fault;
  so.unused = exec.units_unused();  // another rank's moments: no files (Note [zero sharding])
  auto tiered = std::make_unique<TieredSegmentStore>(*units_, so);
  store_text_ = "budget " + bytes_text(o_.mem_budget_bytes) + " (minimum " + bytes_text(min_budget_) + "), offload to " +
                o_.offload_dir + ": " + tiered->describe();
  store_ = std::move(tiered);
  if (device_tier) device_attach();
  else exec_->attach(*store_);
}

void TrainRun::report(double total_ms) {
  if (ranks() > 1 && result_.steps_done > start_step_)
    std::fprintf(stderr, "[stratum] rank 0 of %d: sent %s a step, waited %.0f ms a step for the other ranks (%.1f%% of "
                 "the step)\n", ranks(), bytes_text(o_.comm->sent_bytes() / (result_.steps_done - start_step_)).c_str(),
                 o_.comm->wait_ms() / (result_.steps_done - start_step_), 100.0 * o_.comm->wait_ms() / std::max(1.0, total_ms));
  exec_->sync();
  if (mirror_) mirror_->pull();
  result_.params_hash = model_params_hash(*layout_, *store_);
  result_.min_budget_bytes = min_budget_;
  const StoreStats s = store_->stats();
  if (s.read_busy_ms > 0) result_.read_gbps = s.read_bytes / (s.read_busy_ms * 1e6);
  if (s.write_busy_ms > 0) result_.write_gbps = s.write_bytes / (s.write_busy_ms * 1e6);
  if (o_.mem_budget_bytes > 0) {
    std::fprintf(stderr,
                 "[stratum] tier traffic: read %s (%.2f GB/s while reading), written %s (%.2f GB/s), compute stalled "
                 "%.0f ms (%.1f%% of step time), peak RAM %s of the %s budget\n",
                 bytes_text(result_.read_bytes).c_str(), result_.read_gbps, bytes_text(result_.write_bytes).c_str(),
                 result_.write_gbps, result_.stall_ms, 100.0 * result_.stall_ms / std::max(1.0, total_ms),
                 bytes_text(result_.peak_mem_bytes).c_str(), bytes_text(o_.mem_budget_bytes).c_str());
    if (result_.predicted_step_ms > 0)
      std::fprintf(stderr, "[stratum] plan check: median step %.0f ms, predicted %.0f ms (%+.0f%%)\n",
                 result_.step_ms_median, result_.predicted_step_ms,
                 100.0 * (result_.predicted_step_ms - result_.step_ms_median) / std::max(1e-9, result_.step_ms_median));
  }
  if (mirror_ && o_.gpu_mem_budget_bytes > 0)
    std::fprintf(stderr, "[stratum] %s tier traffic: copied in %s, out %s (%.0f ms on the training thread), peak %s of the %s "
                 "budget\n", exec_->ops().name(), bytes_text(result_.device_read_bytes).c_str(),
                 bytes_text(result_.device_write_bytes).c_str(), mirror_->stats().stall_ms,
                 bytes_text(result_.device_peak_bytes).c_str(), bytes_text(o_.gpu_mem_budget_bytes).c_str());
  std::fprintf(stderr,
               "[stratum] trained %ld steps: final loss %.4f, %.0f tokens/s, median step %.1f ms, peak RSS %s, params "
               "hash %s%s%s\n",
               result_.steps_done, result_.final_loss, result_.tokens_per_s, result_.step_ms_median,
               bytes_text(process_peak_rss_bytes()).c_str(),
               hash_text(result_.params_hash).c_str(), result_.checkpoint_dir.empty() ? "" : ", saved to ",
               result_.checkpoint_dir.c_str());
}

}  // namespace stratum::detail
