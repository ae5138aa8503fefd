// The phases of one training run (train_run in trainer.h), shared by the files that implement
// them: trainer.cpp (the run, the loop, checkpoints) and train_run_store.cpp (the executor and
// the stores, the end-of-run report). Not part of the trainer's interface.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dir_lock.h"
#include "core/thread_pool.h"
#include "data/data_loader.h"
#include "dist/communicator.h"
#include "exec/executor.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "store/device_segment_store.h"
#include "store/segment_store.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace stratum::detail {

// One training run, phase by phase: train_run calls them in order (each a member function, so
// the phases share the run's objects without a 300-line body).
class TrainRun {
 public:
  explicit TrainRun(const TrainOptions& o) : o_(o) {}  // a copy: lora_resolve() fills in --lora-init's settings
  TrainResult run();

 private:
  void resume_find();    // --save usable; the checkpoint to continue from (verified)
  void save_claim();     // the run's identity; the --save root locked and checked to be this run's
  void lora_resolve();   // the adapters' settings (from --lora-init's adapter_config.json, or the options)
  void data_load();      // tokenizer, training and validation tokens, loaders, the run's trainer state
  void store_make();     // the executor, then RAM or the tiered store under the budget (with the plan)
  void save_space_check();  // the --save disk holds the run's checkpoints (refused before training)
  void trace_start();
  void weights_load();   // checkpoint, HF directory or random init
  TrainResult finished_already() const;
  void loop();           // the steps, logging, evaluation, checkpoints, stop on a signal
  // This rank's micro-batches of training step `step`, back to back (targets null: inputs only).
  void step_batches(long step, std::int32_t* inputs, std::int32_t* targets) const;
  float evaluate();  // the mean loss over the first eval_batches_ batches of val_loader_ (train_eval.cpp)
  TrainResult evaluate_only();  // Note [evaluate only], after weights_load
  bool stop_requested() const { return o_.stop_requested != nullptr && *o_.stop_requested != 0; }
  bool stop_agreed() const;  // stop_requested() on any rank (every rank stops after the same step)
  bool save_all_ = false;  // --save as given on the command line (ranks but 0 clear theirs)
  long save_every_all_ = 0;
  int ranks() const { return o_.comm != nullptr ? o_.comm->size() : 1; }
  int rank() const { return o_.comm != nullptr ? o_.comm->rank() : 0; }
  // The segments whose optimizer state this rank owns (Note [zero sharding]).
  std::function<bool(int)> owned_segments() const {
    return [this](int s) { return exec_->updates_segment(s); };
  }
  void checkpoint_save(long done, float loss);
  // The AdamW state into checkpoint directory tmp (rank 0, inside checkpoint_save): the whole
  // optimizer.safetensors in one process; with ranks, rank 0's shard, then tmp to every other
  // rank and their outcomes back (Note [zero sharding]).
  void checkpoint_optimizer_write(const std::string& tmp);
  // Every rank but 0, when rank 0 saves: its optimizer shard into the directory rank 0 names.
  void checkpoint_shard_write();
  void report(double total_ms);
  // adapter_config.json's base_model_name_or_path: --model as an absolute path ("" for a random base).
  std::string base_model_name() const {
    return o_.model_dir.empty() ? std::string() : std::filesystem::absolute(o_.model_dir).lexically_normal().string();
  }

  // Where the model came from (the resumed checkpoint, or --model; "" for a random one): its
  // generation_config.json travels into every checkpoint (Note [generation config] in model/hf_config.h).
  const std::string& source_model_dir() const { return resume_.dir.empty() ? o_.model_dir : resume_.dir; }

  TrainOptions o_;
  LoraConfig lora_;  // the run's adapters (r 0: full training)
  ResumePoint resume_;
  std::uint64_t run_id_ = 0;
  int eval_batches_ = 0;  // --eval-batches, at most the held-out set's batches
  std::size_t eval_targets_ = 0;  // of the last evaluate(): the targets that counted
  DirLock save_lock_;  // held while the run may save
  GptConfig cfg_;
  int threads_ = 0;
  std::string offload_dir_given_;  // --offload-dir as given, before the rank's own (train_options_for_rank)
  std::unique_ptr<ThreadPool> pool_;
  std::string tokenizer_dir_;
  std::size_t train_token_count_ = 0;
  std::size_t train_target_count_ = 0;  // of them loss targets (Note [loss mask] in data/token_file.h)
  TrainerState run_state_;
  std::unique_ptr<DataLoader> loader_, val_loader_;
  long start_step_ = 0;
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<UnitTable> units_;
  std::unique_ptr<TraceRecorder> trace_;  // outlives the store and the executor, which record into it
  // Declared before the executor so it outlives it (the executor's optimizer worker uses it).
  std::unique_ptr<SegmentStore> store_;
  std::unique_ptr<DeviceSegmentStore> mirror_;  // --backend cuda: the device copy the executor computes on
  std::unique_ptr<Executor> exec_;
  std::size_t min_budget_ = 0;
  ActivationPolicy activations_ = ActivationPolicy::Recompute;  // resolved (Note [activations offload])
  std::string activations_line_;  // what the plan chose for --activations auto, and why
  std::string optimizer_line_;    // on the device tier: where AdamW runs, and why (Note [host optimizer])
  std::string mlp_line_;          // the MLP's sub-chunks under the budget (Note [frozen MLP rows])
  std::string store_text_ = "everything in RAM", plan_line_;
  LrSchedule sched_;
  std::vector<std::int32_t> inputs_, targets_;
  double comm_wait_ms_ = 0.0;   // the communicator's totals at the last step's end
  std::uint64_t comm_sent_ = 0;
  TrainResult result_;
};

}  // namespace stratum::detail
