// The training options a checkpoint records, and the one table that describes them (Note
// [option table]). Does not parse flags or files itself: the CLI, the trainer state's JSON, the
// resume check and the fill-in of options a resume leaves out all loop over this table.
// Note [option table]: each TrainSettings field has one row: its flag, its trainer_state.json
// key, its help text, its accepted range, and whether it changes the math (then a resumed run
// must use the checkpoint's value). Its default is the field's initializer. A new option is one
// field and one row; nothing else lists the options. Options that never change the bits and are
// not recorded (budget, prefetch, I/O, threads, log, trace) stay in TrainOptions (trainer.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "formats/json_fields.h"
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
  int row_chunk = kRowChunk;  // rows of the blocks' chunks (Note [row chunks] in model/block_policy.h)
};

// "fp32" or "bf16"; anything else throws Error naming --precision.
Precision precision_parse(const std::string& name);

// A pointer to the field a row describes, by type.
using TrainOptionField =
    std::variant<int*, long*, double*, bool*, std::uint64_t*, LrScheduleKind*, Precision*, TrainOptimizer*,
                 std::string*>;

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
};

std::span<const TrainOption> train_option_table();

// An integer row's range as int64 (the double bounds saturate: 2^63 - 1 does not fit a double).
std::int64_t train_option_int_min(const TrainOption& option);
std::int64_t train_option_int_max(const TrainOption& option);

// The value of row `option` in `s` as text for messages and --help ("0.001", "cosine", "on").
std::string train_option_text(const TrainOption& option, const TrainSettings& s);
bool train_option_equal(const TrainOption& option, const TrainSettings& a, const TrainSettings& b);
void train_option_copy(const TrainOption& option, const TrainSettings& from, TrainSettings& to);
// The value as JSON (the seed as 16 hex digits), and back with the range checked (throws Error).
nlohmann::json train_option_json(const TrainOption& option, const TrainSettings& s);
void train_option_read(const TrainOption& option, const JsonFields& fields, TrainSettings& s);

}  // namespace stratum
