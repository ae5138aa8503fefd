// `stratum plan`: flags -> PlanRequest -> calibration + plan_make -> the plan on stdout.
#include <cstdio>

#include "core/file_util.h"
#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/process_memory.h"
#include "core/byte_size.h"
#include "core/thread_pool.h"
#include "weights/model_io.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"
#include "train/checkpoint.h"
#include "train/train_options.h"

namespace stratum {

int cmd_plan(const std::vector<std::string>& argv) {
  Args args("plan", argv,
            concat_specs(model_flag_specs(),
                         {{"batch", "B", "sequences per step (default 4)"},
                          {"seq", "T", "tokens per sequence (default 64)"},
                          {"grad-accum", "N", "micro-batches of B sequences per step, as for train (default 1)"},
                          {"ranks", "P", "plan the step of `mpirun -np P` on P machines (--grad-accum a multiple of P; default 1)"},
                          {"net-gbps", "X", "with --ranks: the network between the machines, in Gb/s each way"},
                          {"grad-clip", "X", "as for train: 0 = off, which lets updates overlap the backward (default 1.0)"},
                          {"activations", "MODE", "auto (default) | recompute | offload | keep, as for train"},
                          {"mem-budget", "SIZE", "the memory budget to plan for, e.g. 512M or 4G (default, or 0: all in RAM)"},
                          {"offload-dir", "DIR", "with --mem-budget: the directory the run would stream through (its disk is measured)"},
                          {"prefetch", "K", "with --mem-budget: plan with this prefetch depth instead of choosing one"},
                          {"precision", "P", "fp32 (default) | bf16, as for train"},
                          {"optimizer", "NAME", "adamw (default) | zo-sgd, as for train"},
                          {"lora-r", "R", "plan LoRA adapters of rank R over a frozen base, as for train (default 0: off)"},
                          {"lora-alpha", "X", "as for train (default 16)"},
                          {"lora-targets", "LIST", "as for train (default: PEFT's for the family)"},
                          {"lora-rslora", "", "as for train"},
                          {"lora-dropout", "X", "as for train (default 0; its scratch buffer counts)"},
                          {"lora-base-bf16", "", "plan the frozen layers kept in bf16 (default: when --model's "
                                                 "weights are stored in bf16, as train does)"},
                          {"row-chunk", "N", "rows of the blocks' chunks, as for train (default 1024)"},
                          {"mlp-rows", "N", "rows of the MLP's sub-chunks where it trains nothing (zo-sgd, LoRA without MLP "
                                            "adapters), 1 to --row-chunk (default: the largest of --row-chunk, half of it, "
                                            "... 256 whose minimum fits --mem-budget; train passes its choice to its "
                                            "measurement)"},
                          {"recalibrate", "", "measure the disk again instead of using the cached numbers"},
                          {"measure-json", "", "print only the measurements (disk, compute) as JSON; train uses this to measure in a separate process"},
                          {"threads", "N", "worker threads (default: STRATUM_THREADS or all CPUs)"}}));
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum plan [--model HF_DIR | --layers L --heads H --embd C --ctx N --vocab V] "
                              "--batch B --seq T [--mem-budget SIZE --offload-dir DIR]")
                   .c_str(),
               stdout);
    return 0;
  }
  PlanRequest r;
  model_flags_alone_check(args);
  r.config = args.has("model") ? model_read_config(model_dir_resolve(args.str("model"))) : model_flags_config(args);
  r.config.validate();
  r.batch = static_cast<int>(args.integer("batch", 4, 1, 65536));
  r.seq = static_cast<int>(args.integer("seq", 64, 1, 1 << 20));
  STRATUM_CHECK(r.seq <= r.config.context(), "[plan] --seq ", r.seq, " is longer than the model context ",
                r.config.context_text(Backend::Cpu), "; use --seq <= ", r.config.context());
  r.grad_accum = static_cast<int>(args.integer("grad-accum", 1, 1, 65536));
  r.ranks = static_cast<int>(args.integer("ranks", 1, 1, 65536));
  r.net_gbps = args.number("net-gbps", 0.0);
  // 1 Mb/s to 1 Pb/s: outside that, a typo (1e-300 printed a 300-digit step time).
  STRATUM_CHECK(!args.has("net-gbps") || (r.net_gbps >= 1e-3 && r.net_gbps <= 1e6),
                "[plan] --net-gbps must be > 0 (Gb/s, between 0.001 and 1000000), got ", r.net_gbps);
  STRATUM_CHECK(r.ranks == 1 || r.net_gbps > 0, "[plan] --ranks ", r.ranks, " needs --net-gbps X (e.g. 25)");
  STRATUM_CHECK(r.ranks > 1 || !args.has("net-gbps"), "[plan] --net-gbps only applies with --ranks P");
  plan_ranks_check(r);
  r.grad_clip = args.number("grad-clip", 1.0);
  STRATUM_CHECK(r.grad_clip >= 0, "[cli] --grad-clip must be >= 0 (0 = off), got ", r.grad_clip);
  r.mem_budget_bytes = args.size_bytes("mem-budget", 0);  // 0: all in RAM, as train takes it
  const std::string offload_dir = args.str("offload-dir");
  STRATUM_CHECK(r.mem_budget_bytes == 0 || !offload_dir.empty(),
                "[cli] --mem-budget needs --offload-dir DIR (the plan measures that directory's disk)");
  STRATUM_CHECK(r.mem_budget_bytes > 0 || (offload_dir.empty() && !args.has("prefetch")),
                "[cli] --offload-dir and --prefetch only apply with --mem-budget SIZE");
  r.prefetch = static_cast<int>(args.integer("prefetch", -1, 0, 64));
  r.precision = precision_parse(args.str("precision", "fp32"));
  r.zeroth_order = train_optimizer_parse(args.str("optimizer", "adamw")) == TrainOptimizer::ZoSgd;
  r.activations = plan_activations_resolve(activation_policy_parse(args.str("activations", "auto")), r.zeroth_order);
  STRATUM_CHECK(r.grad_accum == 1 || !r.zeroth_order,
                "[plan] --grad-accum sums backpropagated gradients, and --optimizer zo-sgd has none; drop one of them");
  const int lora_r = static_cast<int>(args.integer("lora-r", 0, 0, 65536));
  STRATUM_CHECK(lora_r > 0 || !(args.has("lora-alpha") || args.has("lora-targets") || args.has("lora-rslora") ||
                                         args.has("lora-dropout") || args.has("lora-base-bf16")),
                "[plan] --lora-alpha, --lora-targets, --lora-rslora, --lora-dropout and --lora-base-bf16 shape LoRA "
                "adapters: add --lora-r R to plan adapters (or drop them to plan training every weight)");
  r.lora = lora_config_make(lora_family(r.config), lora_r,
                            args.number("lora-alpha", 16.0), args.str("lora-targets"), args.flag("lora-rslora"),
                            args.number("lora-dropout", 0.0));
  // As train: LoRA over a checkpoint stored in bf16 keeps its frozen layers bf16 (a --model
  // directory without weights, as the trainer's measurement passes, says so with the flag).
  r.base_bf16 = r.lora.on() && (args.flag("lora-base-bf16") ||
                                (args.has("model") && model_weights_bf16(model_dir_resolve(args.str("model")))));
  r.row_chunk = static_cast<int>(args.integer("row-chunk", kRowChunk, 1, kMaxRowChunk));
  r.mlp_rows = static_cast<int>(args.integer("mlp-rows", 0, 1, r.row_chunk));
  STRATUM_CHECK(r.mlp_rows == 0 || r.mlp_rows == r.row_chunk || plan_mlp_may_sub_chunk(r), "[plan] --mlp-rows ", r.mlp_rows,
                " needs MLPs that train nothing (--optimizer zo-sgd, or --lora-targets without MLP modules), in fp32, "
                "wider than n_embd x MLP width 2^20");
  const int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  ThreadPool pool(threads > 0 ? threads : default_thread_count());
  backend_set_threads(pool.num_threads());
  r.threads = pool.num_threads();

  CalibrationOptions co;
  if (r.mem_budget_bytes > 0) {
    co.offload_dir = offload_dir;
    co.threads = pool.num_threads();
    co.refresh = args.flag("recalibrate");
  }
  // A budget below the minimum is refused before anything is measured (Note [bounded measurement]).
  if (!args.flag("measure-json") && r.mem_budget_bytes > 0) {
    plan_budget_check(r, plan_min_budget_bytes(r));
    offload_disk_check(offload_dir, offload_free_bytes(offload_dir), plan_offload_floor_bytes(r));  // each rank's
  }
  // The measurement in a process of its own, as train's (a child of --measure-json measures here):
  // Ctrl-C stops it and the files it made are removed, where a plan measuring in this process
  // left them behind (Note [stale plan directories]).
  const bool measuring_child = args.flag("measure-json");
  if (!measuring_child) stop_signals_install("\n[stratum] stopping the plan's measurement\n");
  const PlanMeasurement measured =
      plan_measure(r, co, pool.num_threads(), measuring_child ? std::string() : "/proc/self/exe");
  if (measuring_child) {
    std::printf("%s\n", plan_measurement_json(measured).dump().c_str());
    return 0;
  }
  std::string choice_text;
  if (r.activations == ActivationPolicy::Auto) {  // Note [activations offload]: the plan chooses
    const ActivationChoice choice =
        plan_choose_activations(r, measured.timing, measured.read_gbps, measured.write_gbps,
                                r.mem_budget_bytes > 0 ? offload_free_bytes(offload_dir) : 0);
    r.activations = choice.policy;
    choice_text = choice.why + "\n";
  }
  const Plan plan = plan_make(r, measured.timing, measured.read_gbps, measured.write_gbps);
  std::fputs(plan_describe(plan, r).c_str(), stdout);
  std::fputs(choice_text.c_str(), stdout);
  // In RAM, what train would refuse (memory_fit_check) is said, with the way out.
  if (const std::size_t available = memory_available_bytes();
      r.mem_budget_bytes == 0 && available > 0 && plan.peak_ram_bytes > available)
    std::printf("does not fit: this run needs %s of RAM and this machine has %s available, so train refuses it in "
                "RAM; plan it under a budget: --mem-budget SIZE (at least %s) --offload-dir DIR\n",
                bytes_text(static_cast<double>(plan.peak_ram_bytes)).c_str(),
                bytes_text(static_cast<double>(available)).c_str(),
                bytes_text(static_cast<double>(plan.min_budget_bytes)).c_str());
  if (r.mem_budget_bytes > 0)
    std::printf("calibration: %s, %s; compute measured on a one-layer model with %d threads, streamed under the "
                "budget (peak RSS %s)\n",
                calibration_device(offload_dir).c_str(), measured.disk_from_cache ? "cached" : "measured now",
                pool.num_threads(), bytes_text(measured.peak_rss_bytes).c_str());
  return 0;
}

}  // namespace stratum
