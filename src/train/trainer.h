// `stratum train`: builds the model (from a Hugging Face directory or from flags), loads the
// data, and runs the training loop (forward/backward via Executor, global-norm clipping,
// AdamW, LR schedule), logging, evaluating and saving as asked. Does not parse flags.
#pragma once

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>

#include "exec/executor.h"
#include "io/io_engine.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/train_options.h"

namespace stratum {

class Communicator;

// The recorded options (data, batch shape, LR, AdamW, clipping, seed, evaluation, checkpoint
// cadence, budgets, I/O, threads, backend) are TrainSettings' (Note [option table]); these are
// the rest, which a checkpoint does not record.
struct TrainOptions : TrainSettings {
  std::string model_dir;      // start from this HF directory; empty = new model from `config`
  // With lora_r (or alone): start the adapters from this PEFT LoRA directory, whose
  // adapter_config.json gives r, alpha, targets, rsLoRA and dropout; empty = PEFT's init.
  std::string lora_init_dir;
  bool lora_dropout_given = false;  // --lora-dropout was given (else --lora-init's lora_dropout)
  bool lora_alpha_given = false;    // --lora-alpha / --lora-rslora were given: with --lora-init they must
  bool lora_rslora_given = false;   // agree with its adapter_config.json (the adapter's scale is fixed)
  GptConfig config;           // used when model_dir is empty
  std::string trace_path;     // Chrome/Perfetto trace of compute, optimizer and I/O (empty = off)
  // Checkpoints (Note [checkpoints], train/checkpoint.h): save_dir is a checkpoint root that gets
  // step-NNNNNNNN directories (HF model + AdamW state + trainer state) and a `latest` pointer.
  std::string save_dir;
  // Continue from a checkpoint (a step directory, or a root: its newest that verifies). Every
  // option that changes the math (model, data, batch shape, steps, LR, AdamW, clipping, seed,
  // shuffle, evaluation) must equal the checkpoint's; the rest (budget, prefetch, I/O, threads,
  // log, trace) may differ. The parameters after step N are then bit-identical to a run that
  // was never interrupted (on the CPU, with the same thread count: Note [option table]).
  std::string resume_path;
  // The checkpoint_find(resume_path) a caller already made (the CLI, to fill in the options left
  // out from the checkpoint it resumes), so it is verified once; empty: train_run finds it.
  std::optional<ResumePoint> resume_point;
  // When set and it becomes non-zero (a signal handler), the run stops after the current step,
  // writes a checkpoint (with save_dir) and returns with `interrupted` set.
  const volatile std::sig_atomic_t* stop_requested = nullptr;
  IoFaultPlan io_fault;         // tests only (STRATUM_IO_FAULT)
  bool mirror_store = false;  // tests only: compute on a DeviceSegmentStore on the CPU too
  // With a budget: the stratum binary to run the plan's measurement in (a separate process, so
  // it never counts against the budget); empty = measure in this process (tests).
  std::string measure_exe;
  bool quiet = false;         // no progress bar
  // Lines ("[stratum] ...\n") the run prints with its header, once every check has passed (the
  // CLI's: a fork that does not continue the run's log); never for a refused run.
  std::string notices;
  // The ranks of an `mpirun` job (Note [data parallel] in exec/executor.h); null or one rank: this
  // process alone. Rank r runs micro-batches r, r + P, ... of each step's --grad-accum N (a multiple
  // of P); rank 0 prints, logs, traces and saves, the others only report errors.
  Communicator* comm = nullptr;
  // Note [evaluate only]: `stratum eval` runs this setup (the model and --lora-init's adapters,
  // the data, the budget, the plan and the store) as a zo-sgd run, whose engine holds no gradients
  // or moments, then only the validation pass: the mean loss over the first eval_batches batches
  // of data_path (sequential, at most the file's), over the targets that count (Note [masked
  // loss]), returned as final_val_loss. It trains, logs and saves nothing.
  bool evaluate_only = false;
};

struct TrainResult {
  float final_loss = 0.0f;
  float final_val_loss = -1.0f;  // < 0 when never evaluated
  int eval_batches = 0;           // the last evaluation's batches, and its targets that counted
  std::size_t eval_targets = 0;
  std::uint64_t params_hash = 0;
  double tokens_per_s = 0.0;     // over all steps after the first
  double step_ms_median = 0.0;
  std::uint64_t read_bytes = 0, write_bytes = 0;  // offload traffic over the run
  double stall_ms = 0.0;                          // compute waiting on I/O over the run
  double read_gbps = 0.0, write_gbps = 0.0;       // offload bandwidth while the disk was busy
  std::size_t peak_mem_bytes = 0;                 // executor + store, highest over the run
  // The device tier (Note [device tier]): host -> device and device -> host bytes over the run,
  // and the executor's buffers + the units held on the device, highest over the run.
  std::uint64_t device_read_bytes = 0, device_write_bytes = 0;
  std::size_t device_peak_bytes = 0;
  bool adamw_on_host = false;                     // AdamW ran on the CPU beside the device (Note [host optimizer])
  std::size_t min_budget_bytes = 0;               // smallest --mem-budget this run could use
  double predicted_step_ms = 0.0;                 // the plan's prediction (with a budget), else 0
  int prefetch = 0;                               // the prefetch depth used (with a budget)
  long start_step = 0;                            // steps already done by the checkpoint resumed from
  long steps_done = 0;                            // steps done when the run ended
  bool interrupted = false;                       // stopped early by stop_requested
  std::string checkpoint_dir;                     // the last checkpoint written (empty = none)
};

// Throws Error (one line naming the flag) when the options do not hold together: a number outside
// its option-table range, --save-every without --save, --log/--trace over an input, --backend cuda
// with bf16, --gpu-mem-budget without the GPU, --grad-accum not a multiple of the ranks. train_run calls it first.
void train_options_check(const TrainOptions& o);
// A rank's own options in a data-parallel run (o.comm of several ranks): rank r streams through
// OFFLOAD/rank-r (created); ranks but 0 are quiet and do not log, trace or save. No-op otherwise.
void train_options_for_rank(TrainOptions& o);

// The checkpoint root a resume from `path` saves to by default: `path` itself when it is a root,
// else the directory that holds the checkpoint directory `path`.
std::string train_checkpoint_root(const std::string& path);

// Smallest --mem-budget that can train this model at this batch shape on `threads` compute
// threads (the engine's fixed buffers, some of them per thread, plus the largest set of units
// held at once; with activations Auto, the smaller of recompute's and offload's); base_bf16: a
// LoRA run's frozen layers kept in bf16 (Note [frozen bf16 base] in model/block_policy.h);
// row_chunk: --row-chunk (Note [row chunks]).
std::size_t train_min_budget_bytes(const GptConfig& config, int batch, int seq, int threads, ActivationPolicy activations,
                                   double grad_clip, Precision precision = Precision::Fp32,
                                   TrainOptimizer optimizer = TrainOptimizer::AdamW, const LoraConfig& lora = {},
                                   bool base_bf16 = false, int grad_accum = 1, int row_chunk = kRowChunk);

TrainResult train_run(const TrainOptions& options);

}  // namespace stratum
