// The training options a checkpoint records, and the one table that describes them (Note
// [option table]). Does not parse flags or files itself: the CLI, the trainer state's JSON, the
// resume check and the fill-in of options a resume leaves out all loop over this table.
// Note [option table]: each TrainSettings field has one row: its flag, its trainer_state.json
// key, its help text, its accepted range, and whether it changes the math (then a resumed run
// must use the checkpoint's value). Its default is the field's initializer. A new option is one
// field and one row; nothing else lists the options. The rows that do not change the math are
// recorded too (the budgets, offload directory, prefetch, I/O, threads, backend, log file), so a
// resume that leaves them out continues the run as it was: under its budget, on its device, with
// its thread count (the CPU's matrix products' bits depend on it), logging to its file. What is
// never recorded (the trace, the save directory) stays in TrainOptions (trainer.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "exec/executor.h"
#include "formats/json_fields.h"
#include "io/io_engine.h"
#include "model/block_policy.h"
#include "ops/ops.h"
#include "train/lr_schedule.h"

namespace stratum {

// What updates the weights: AdamW on backpropagated gradients, or zeroth-order SGD (MeZO: two
// forward passes a step, Note [zeroth-order step] in exec/executor.h).
enum class TrainOptimizer { AdamW, ZoSgd };
// Where AdamW runs when the step computes off the CPU (--adamw-on auto|gpu|cpu; Note [host optimizer]).
enum class AdamWOn { Auto, Device, Host };
// "auto", "gpu", "cpu"; anything else throws Error naming --adamw-on.
AdamWOn adamw_on_parse(const std::string& name);
const char* train_optimizer_name(TrainOptimizer o);  // "adamw", "zo-sgd"
// "adamw" or "zo-sgd"; anything else throws Error naming --optimizer.
TrainOptimizer train_optimizer_parse(const std::string& name);

struct TrainSettings {
  std::string data_path;      // text (needs a tokenizer), raw uint16 .bin, or llm.c shard
  std::string val_data_path;  // optional; else with eval_every > 0 the last 5% of data is held out
  std::string tokenizer_dir;  // encoder.json+vocab.bpe or vocab.json+merges.txt; default: the model's
  int batch = 4;
  int seq = 64;
  int grad_accum = 1;         // micro-batches of `batch` sequences per step (Note [gradient accumulation])
  long steps = 100;
  LrSchedule lr;              // total_steps is set from `steps`
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;     // 0 = off
  std::uint64_t seed = 1337;  // initialisation and shuffling
  bool shuffle = false;
  long eval_every = 0;        // 0 = no validation
  int eval_batches = 4;
  long save_every = 0;        // 0 = only at the end (when saving)
  int keep = 2;               // checkpoints kept under the save root (the newest)
  Precision precision = Precision::Fp32;  // matrix products (Note [bf16 products])
  TrainOptimizer optimizer = TrainOptimizer::AdamW;
  double zo_eps = 1e-3;       // zo-sgd's perturbation scale
  // LoRA (model/lora.h): adapters of rank lora_r on lora_targets over a frozen base; 0 = off.
  int lora_r = 0;
  double lora_alpha = 16;
  std::string lora_targets;   // comma-separated target_modules; empty: PEFT's default for the family
  bool lora_rslora = false;
  double lora_dropout = 0;
  // Rows of the blocks' chunks (Note [row chunks] in model/block_policy.h); 0: the backend's
  // (row_chunk_default, Note [device row chunk]), resolved when the run starts.
  int row_chunk = 0;
  // Where the run keeps its state and what it computes on: never the bits, except `threads` and
  // `backend` (the CPU's matrix products depend on the thread count; the GPU has its own bits).
  int threads = 0;            // compute threads; 0 = default_thread_count() (a checkpoint records the count used)
  // Where the backward finds block internals (Note [activations offload] in exec/executor.h);
  // Auto: the plan chooses under a budget, else recompute. Same bits in all.
  ActivationPolicy activations = ActivationPolicy::Auto;
  // Memory budget for everything the engine allocates (parameters, gradients, moments,
  // activations, workspace); 0 = everything in RAM. With a budget, what does not fit lives in
  // files under offload_dir and is streamed (TieredSegmentStore).
  std::uint64_t mem_budget_bytes = 0;
  std::string offload_dir;
  // One JSON object per step (obs/metrics_log.h); recorded, so a plain --resume continues it.
  std::string log_path;
  int prefetch = -1;            // schedule groups loaded ahead; < 0 = the plan's choice (plan/planner.h)
  IoBackend io_backend = IoBackend::Auto;
  std::uint64_t io_block_bytes = std::uint64_t{1} << 20;  // I/O request block size (bench/io_sweep)
  int io_queue_depth = 16;                                // blocks in flight
  // Where the step computes (backend/backend.h). Cuda: the executor computes on the device tier
  // (DeviceSegmentStore, Note [device tier]) over the RAM store (or, with mem_budget_bytes, the
  // RAM-over-NVMe store); its bits are the GPU's (Note [cuda determinism]) for every budget.
  Backend backend = Backend::Cpu;
  // --gpu-mem-budget: device memory for the executor's buffers and the units it holds; 0 = the
  // whole training state on the device.
  std::uint64_t gpu_mem_budget_bytes = 0;
  // --adamw-on: where AdamW runs off the CPU backend (Note [host optimizer]). Auto: on the CPU,
  // beside the device's compute, when the whole state and the engine's buffers exceed
  // gpu_mem_budget_bytes (the moments then never cross to the device), else on the device.
  AdamWOn adamw_on = AdamWOn::Auto;
};

// "fp32" or "bf16"; anything else throws Error naming --precision.
Precision precision_parse(const std::string& name);

// A pointer to the field a row describes, by type.
using TrainOptionField =
    std::variant<int*, long*, double*, bool*, std::uint64_t*, LrScheduleKind*, Precision*, TrainOptimizer*,
                 ActivationPolicy*, IoBackend*, Backend*, AdamWOn*, std::string*>;

struct TrainOption {
  const char* flag;        // `--flag` of stratum train
  const char* key;         // the trainer_state.json key
  const char* value_name;  // in --help ("B", "X"; "" for a switch)
  const char* help;        // without the default, which is added from the field's initializer
  double min, max;         // numbers: accepted range (flags and checkpoints alike); strings: min 1 = non-empty
  bool math;               // changes the result: a resume must use the checkpoint's value
  TrainOptionField (*field)(TrainSettings&);
  // Added after checkpoints were first written: a trainer state without its key has the default.
  bool later = false;
  // An uint64 that is a size in bytes: SIZE on the command line ("512M"), a number in JSON (other
  // uint64 rows, the seed, are 16 hex digits there).
  bool bytes = false;
};

std::span<const TrainOption> train_option_table();

// An integer row's range as int64 (the double bounds saturate: 2^63 - 1 does not fit a double).
std::int64_t train_option_int_min(const TrainOption& option);
std::int64_t train_option_int_max(const TrainOption& option);

// An enumerated option's name as its flag takes it, and back (throws Error naming the flag).
const char* train_option_enum_name(LrScheduleKind v);
const char* train_option_enum_name(Precision v);
const char* train_option_enum_name(TrainOptimizer v);
const char* train_option_enum_name(ActivationPolicy v);
const char* train_option_enum_name(IoBackend v);
const char* train_option_enum_name(Backend v);
const char* train_option_enum_name(AdamWOn v);
void train_option_enum_parse(const std::string& name, LrScheduleKind& v);
void train_option_enum_parse(const std::string& name, Precision& v);
void train_option_enum_parse(const std::string& name, TrainOptimizer& v);
void train_option_enum_parse(const std::string& name, ActivationPolicy& v);
void train_option_enum_parse(const std::string& name, IoBackend& v);
void train_option_enum_parse(const std::string& name, Backend& v);
void train_option_enum_parse(const std::string& name, AdamWOn& v);

// --row-chunk 0's value on `backend`: kRowChunk on the CPU, kRowChunkDevice on a GPU (Note
// [device row chunk] in model/block_policy.h).
int row_chunk_default(Backend backend);

// "512M", "1G", "4096": a size as --mem-budget takes it; "" for 0 (no size).
std::string train_option_size_text(std::uint64_t bytes);

// The value of row `option` in `s` as text for messages and --help ("0.001", "cosine", "on").
std::string train_option_text(const TrainOption& option, const TrainSettings& s);
bool train_option_equal(const TrainOption& option, const TrainSettings& a, const TrainSettings& b);
void train_option_copy(const TrainOption& option, const TrainSettings& from, TrainSettings& to);
// The value as JSON (the seed as 16 hex digits), and back with the range checked (throws Error).
nlohmann::json train_option_json(const TrainOption& option, const TrainSettings& s);
void train_option_read(const TrainOption& option, const JsonFields& fields, TrainSettings& s);

}  // namespace stratum
