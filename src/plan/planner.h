// `stratum plan` and the plan `stratum train --mem-budget` follows: before anything runs, what
// state a training run holds, where each segment lives, what moves between RAM and the offload
// dir per step, and how long a step will take and why.
// Note [plan model]: the plan replays the executor's own StepSchedule (the groups a step runs,
// with the units each uses) against a model of the tiered store (plan/traffic_model.h): units are
// loaded when a group needs them and evicted by the store's own EvictionPolicy (dirty ones
// written unless their next use overwrites them, write-behind at the prefetch depth), so the
// bytes read and written per step come from the same schedule and rule the run will follow. Time comes from a pipeline over the
// same groups: each group's compute (measured on this machine for these shapes, Note [plan
// calibration]) starts when the previous group's compute and its own reads are done; reads run
// one at a time in schedule order on the read queue, each starting once its group is within
// the prefetch window; updates run on the optimizer worker when the mode has one; writes run on
// their own queue and only bound the step when they exceed it. The prediction is that
// pipeline's steady-state step (the third simulated step).
// Note [plan calibration]: compute times are measured, not modelled from FLOPs: a one-layer
// model with the run's width, heads, batch, sequence and vocabulary-block size trains three
// steps (forward and backward) in RAM with the trace recorder on; the spans give one block's
// forward and backward, one vocabulary block's embedding and head work and the rest; AdamW's
// cost per float (on the run's pool and on the worker's single thread) is timed on buffers sized
// to the budget (Note [bounded measurement]). Disk bandwidth comes from plan/calibration.h (cached per
// device). Does not run the training itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "plan/calibration.h"
#include "exec/executor.h"

namespace stratum {

struct PlanRequest {
  GptConfig config;
  int batch = 4, seq = 64;
  // Resolved (not Auto) for plan_make and plan_units; Auto is resolved
  // by plan_choose_activations (Note [activations offload] in exec/executor.h).
  ActivationPolicy activations = ActivationPolicy::Recompute;
  double grad_clip = 1.0;
  std::size_t mem_budget_bytes = 0;  // 0 = everything in RAM
  int prefetch = -1;                 // < 0: the plan chooses
  Precision precision = Precision::Fp32;
  bool zeroth_order = false;  // --optimizer zo-sgd: two forward passes a step (Note [zeroth-order step])
  LoraConfig lora = {};       // adapters over a frozen base (Note [lora segments]); r 0 = none
  bool base_bf16 = false;     // with lora: the frozen layers kept in bf16 (Note [frozen bf16 base])
  int threads = 1;            // compute threads: the attention kernel's scratch is per thread
  int grad_accum = 1;         // micro-batches of (batch, seq) per step (Note [gradient accumulation])
  // Data parallelism (Note [data parallel]): the step on `ranks` machines, each running
  // grad_accum / ranks micro-batches, linked at net_gbps (gigabits a second each way; Note [plan ranks]).
  // rank: the one planned (train's own); -1 plans every kind of rank and keeps the slowest.
  int ranks = 1;
  int rank = -1;
  double net_gbps = 0;  // 0: the network is not planned (train: ranks on one machine, or unknown)
  // Rows of the blocks' MLP sub-chunks where the MLP trains nothing (Note [frozen MLP rows] in
  // model/block_policy.h); 0: plan_mlp_rows chooses.
  int mlp_rows = 0;
  int row_chunk = kRowChunk;  // the blocks' row chunk (Note [row chunks]; train --row-chunk)
};

// --activations for a run with or without a backward: zeroth-order training has none, so Auto
// is Recompute there and Keep or Offload are refused (one line); otherwise as given.
ActivationPolicy plan_activations_resolve(ActivationPolicy activations, bool zeroth_order);

// --grad-accum a multiple of --ranks (refused in one line otherwise).
void plan_ranks_check(const PlanRequest& request);

// How a request's executor runs its updates (with a budget or in RAM), and which units it has.
OptimizerMode plan_mode(const PlanRequest& request, bool budget);
UnitSet plan_unit_set(const PlanRequest& request);
// The request's unit table over `layout` (ParamLayout::of(config, lora)) for activation units
// of act_floats: plan_unit_set's units, bf16 frozen layers with base_bf16.
UnitTable plan_units(const ParamLayout& layout, std::size_t act_floats, const PlanRequest& request);

// Note [mixed layers]: Gemma 2's and 3's sliding layers attend to their window, their full layers
// to every key, so at a sequence past the window the two kinds take different times (Gemma 3 1B's
// heads at T 4096, W 512: the attention 4.6x). The planner times a one-layer model of layer 0's
// kind and, where the model has both, one of the other kind, and gives each layer's groups their
// kind's time (plan_group_compute).
// Measured compute of one step's pieces on this machine (Note [plan calibration]).
struct ComputeTiming {
  // One transformer block; the backward without a recompute (for --activations recompute the
  // plan adds the share of a forward the recompute runs again, Note [row chunks]). With zo-sgd
  // each forward piece is both passes' (one group computes both, Note [zeroth-order step]).
  double layer_forward_ms = 0, layer_backward_ms = 0;
  // Note [mixed layers]: the same for a layer of the other kind than layer 0's where a model has
  // both sliding and full layers (Gemma 2, Gemma 3); 0 where every layer is layer 0's kind.
  double other_layer_forward_ms = 0, other_layer_backward_ms = 0;
  double vocab_forward_ms = 0, vocab_backward_ms = 0;  // one vocabulary block: embedding
  double head_lse_ms = 0, head_backward_ms = 0;        // one vocabulary block: LM head passes
  double other_ms = 0;                                 // positions, final layernorm, their backward
  double adamw_inline_ns_per_float = 0;                // AdamW on the training thread's pool
  double adamw_worker_ns_per_float = 0;                // AdamW on the optimizer worker (1 thread)
};
// Note [bounded measurement]: the measurement counts against the budget like everything else a
// budgeted run allocates. It times the one-layer model's forward and backward only (its AdamW
// moments are never allocated), and under a budget that model streams through a TieredSegmentStore
// holding at most the budget less the engine's buffers, in a scratch subdirectory of the offload
// dir (OFFLOAD/stratum-plan-<pid>, removed after); the store and the engine are freed before
// AdamW is timed on buffers of at most a quarter of the budget (128 MiB when there is none).
// `stratum plan` refuses a budget below the minimum before measuring. The measuring process
// reports its peak RSS (PlanMeasurement::peak_rss_bytes), which the run prints.
// The share of a block forward's multiply-adds the backward's recompute runs again: all but the
// MLP's down projection (Note [row chunks] in model/block_policy.h), attention's included.
double plan_recompute_share(const GptConfig& config, int seq);
// Whether a model has layers of both kinds, sliding and full (Note [mixed layers]).
bool plan_mixed_layers(const GptConfig& config);
ComputeTiming plan_measure_compute(ThreadPool& pool, const PlanRequest& request, const std::string& offload_dir = "");
// The budget the measurement's one-layer model streams through at the least (its engine buffers
// and its store's minimum, on a pool of request.threads); plan_min_budget_bytes is never below it.
std::size_t plan_measure_min_bytes(ThreadPool& pool, const PlanRequest& request);
// The smallest --mem-budget a streaming run of `request` can run in (with activations Auto, the
// smaller of recompute's and offload's), and the check that refuses less (one line with the
// number), as plan_make and train_run do.
std::size_t plan_min_budget_bytes(const PlanRequest& request);
// Note [frozen MLP rows]: whether the request's block MLPs train nothing (zo-sgd, or LoRA without
// MLP adapters) and may run in sub-chunks with the same bits (fp32, mlp_sub_chunks_exact); and
// the sub-chunk's rows: request.mlp_rows when set, else the row chunk R in RAM or where the MLP
// may not take sub-chunks, else the largest of R, R / 2, ... above kFrozenMlpRows whose minimum
// budget fits --mem-budget (smaller sub-chunks repeat the weights' widening and packing:
// docs/benchmarks.md), the smallest where none does. plan_min_budget_bytes with mlp_rows 0 is the
// smallest sub-chunk's.
bool plan_mlp_may_sub_chunk(const PlanRequest& request);
int plan_mlp_rows(const PlanRequest& request);
// For a budget below the request's minimum: the largest smaller row chunk (Note [row chunks]; of
// R/2, R/4, ... 64, below B*T) whose minimum fits budget_bytes, as the advice ", --row-chunk N
// (minimum X)" a refusal adds; "" where none fits.
std::string plan_row_chunk_advice(const PlanRequest& request, std::size_t budget_bytes);
// The same search for any minimum: min_at(chunk) is the run's minimum at that row chunk (train's
// device budget measures it by making the executor).
std::string plan_row_chunk_advice(int row_chunk, std::size_t rows, std::size_t budget_bytes,
                                  const std::function<std::size_t(int)>& min_at);
// The one line every budget below its minimum is refused with (plan's and train's, the host's
// and the device's budgets), after the caller's "[plan] " or "[train] ": "<flag> X is below the
// minimum of Y for this model at B=b T=t[ (parts)]; use <flag> NM or more[advice], or lower
// --batch/--seq". parts says what the minimum is made of ("" for nothing); advice is
// plan_row_chunk_advice's (or "").
std::string plan_budget_refusal(const char* flag, std::size_t budget_bytes, std::size_t min_bytes, int batch, int seq,
                                const std::string& parts, const std::string& advice);
// "engine buffers E + largest working set W", the parts of an executor's minimum.
std::string plan_min_parts(std::size_t engine_bytes, std::size_t working_set_bytes);
void plan_budget_check(const PlanRequest& request, std::size_t min_budget_bytes);
// The least a streamed run writes to its offload directory (every unit's file under the
// activations policy given, recompute's under Auto: the fewer; with ranks, the rank's, without
// the other ranks' moments, or the largest rank's): checked against the disk's free space
// (offload_disk_check) before anything is measured.
std::size_t plan_offload_floor_bytes(const PlanRequest& request);
// The same for `ranks_here` ranks of the request whose offload directories share one disk (under
// mpirun, the ranks on one machine): every rank's files when all of them are there, else the
// largest rank's times ranks_here.
std::size_t plan_offload_shared_bytes(const PlanRequest& request, int ranks_here);

// What the plan needs measured: the offload dir's disk (plan/calibration.h, cached) when
// calibration.offload_dir is set, and the compute. With helper_exe (the stratum binary) the
// measurement runs in a new process (`stratum plan ... --measure-json`), so its own memory (a
// one-layer model and its buffers, the disk test's buffers) never counts against the run's budget
// or peak RSS; a failure there (a bad offload dir) comes back as its one-line Error. Without it
// the measurement runs here (tests, where the library has no binary to start).
struct PlanMeasurement {
  ComputeTiming timing;
  double read_gbps = 0, write_gbps = 0;
  bool disk_from_cache = false;
  std::size_t peak_rss_bytes = 0;  // the measuring process's peak resident memory
};
PlanMeasurement plan_measure(const PlanRequest& request, const CalibrationOptions& calibration, int threads,
                             const std::string& helper_exe = "");
nlohmann::json plan_measurement_json(const PlanMeasurement& measurement);  // what --measure-json prints

struct SegmentPlace {
  std::string name;
  std::size_t bytes = 0;           // params + grads + moments + activations units
  std::size_t resident_bytes = 0;  // of those, never evicted during a steady-state step
  std::uint64_t read_bytes = 0, write_bytes = 0;  // per step
};

// Note [update window]: with Pipelined updates (exact clipping; under --mem-budget any run, Note
// [streamed updates after the backward] in exec/executor.h) every update waits for the gradient
// norm, and the next forward waits for each segment's update: between the end of the backward and
// the head, the parameters, gradients and both moments of every trained parameter are read and
// three of them written (28 bytes a parameter, 3.5 GB on GPT-2 small), besides the forward's own
// traffic. Only the forward's compute can overlap that; the backward cannot (the norm needs all of
// it). Where the disk time of those bytes exceeds the forward's compute, the step is at least the
// backward plus that disk time, whatever the overlap elsewhere: on a ~2 GB/s disk (reads and
// writes sharing it) GPT-2 small B4 T256 cannot come within about 1.2x of its in-RAM step at
// 25% or 10% of its state, and runs measure within 0-14% of that floor (docs/benchmarks.md). The plan
// reports the window (the groups before the first backward group, in the steady-state step):
// its modelled duration, its compute, its bytes and their time at the calibrated rates, and
// names it as the bottleneck where most of the step's wait falls in it.
struct UpdateWindow {
  double ms = 0;          // modelled, from the step's start to the end of its forward
  double compute_ms = 0;  // of the forward's groups on the training thread
  double disk_ms = 0;     // read_bytes and write_bytes at the calibrated rates
  std::uint64_t read_bytes = 0, write_bytes = 0;
};

struct Plan {
  std::size_t params_bytes = 0, grads_bytes = 0, moments_bytes = 0, activation_bytes = 0;
  std::size_t internals_bytes = 0;   // --activations offload: every layer's internals units
  std::size_t engine_bytes = 0;      // the executor's fixed buffers
  std::size_t min_budget_bytes = 0;  // smallest --mem-budget that can run
  std::size_t disk_bytes = 0;        // offload files (0 without a budget; with ranks, the rank's)
  std::size_t peak_ram_bytes = 0;    // engine buffers + store, at most the budget
  bool streaming = false;
  int prefetch = 0;
  int mlp_rows = 0;  // plan_mlp_rows
  OptimizerMode mode = OptimizerMode::Inline;
  bool optimizer_worker = false;  // Overlapped/Pipelined updates on the worker, else on the pool (Note [update thread])
  std::uint64_t read_bytes = 0, write_bytes = 0;  // per step
  // Of the groups that read, those whose reads the room lets open before the group before them
  // starts (Note [room for the window]); the rest load only while that group runs or on use.
  int groups_reading = 0, groups_read_ahead = 0;
  double compute_ms = 0, optimizer_ms = 0, read_ms = 0, write_ms = 0;  // busy time per step
  double step_ms = 0;      // predicted
  double ram_step_ms = 0;  // predicted for the same run with everything in RAM
  std::string bottleneck;  // "compute", "read", "write", "optimizer", "read (stalls)", "the update window (disk)"
  UpdateWindow window;     // Note [update window]; zero unless streaming with Pipelined updates
  double read_gbps = 0, write_gbps = 0;
  ComputeTiming timing;  // what the prediction was made from
  std::vector<SegmentPlace> segments;
  // Note [plan ranks]: with ranks > 1 everything above is one rank's: the executor of that rank
  // (RankShape in exec/executor.h) with its grad_accum / ranks micro-batches, the running sums
  // it receives, and only the segments it owns updated (Note [zero sharding]): their AdamW time,
  // their moments' traffic, RAM and offload files (moments_bytes, disk_bytes), run
  // after the backward (plan_mode: Inline where one process would pipeline them, since the
  // owners send their parameters at the end of the step).
  // Under mpirun, ranks on one machine share its disk: train divides the measured rates by their
  // number (Communicator::node_size). `stratum plan` (request.rank -1) plans one rank of each kind (what it owns, whether it starts
  // or ends the micro-batch chain) and keeps the slowest; its minimum budget is the largest of
  // theirs. With net_gbps, step_ms = max(that step, net_ms) + net_tail_ms: net_ms is the
  // gradient copy the rank sends per micro-batch it runs, plus its owned parameters to the P-1
  // other ranks, which the receivers take in during the next forward (Note [zero sharding]), at
  // net_gbps, overlapping its compute; net_tail_ms is what follows the last backward and nothing
  // overlaps: the running-sum chain's P-1 links and the final hop to the owner with one segment
  // chunk each. net_sent_bytes is both.
  int ranks = 1;
  int rank = 0;                      // the rank planned
  std::size_t owned_params = 0;      // trainable parameters it updates
  std::uint64_t net_sent_bytes = 0;  // per step, by that rank
  double net_ms = 0, net_tail_ms = 0;
};

// read_gbps/write_gbps: the offload dir's measured bandwidth (unused without a budget).
// Throws Error when the budget is below the minimum (naming it).
Plan plan_make(const PlanRequest& request, const ComputeTiming& timing, double read_gbps, double write_gbps);

// --activations auto (Note [activations offload]): the plans of recompute and offload for the
// same measurement; the policy whose predicted step is shorter, among those whose minimum fits
// the budget (recompute unless offload is more than 2% faster: it moves fewer bytes). Without a
// budget: recompute (no plan is made; keeping every layer's internals could exhaust RAM). `why`
// says what was predicted for each. Throws Error when neither fits (with the smaller minimum).
// disk_free_bytes (0 = not checked): what the offload dir's file system has free; offload's larger
// offload files must fit there too.
struct ActivationChoice {
  ActivationPolicy policy = ActivationPolicy::Recompute;
  Plan plan;        // the chosen policy's (empty without a budget)
  std::string why;  // one line
};
ActivationChoice plan_choose_activations(const PlanRequest& request, const ComputeTiming& timing, double read_gbps,
                                         double write_gbps, std::size_t disk_free_bytes = 0);

// The human-readable plan (several lines).
std::string plan_describe(const Plan& plan, const PlanRequest& request);

}  // namespace stratum
