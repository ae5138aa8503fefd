// The training loop; see trainer.h.
#include "core/hash.h"
#include "train/trainer.h"
#include "train/train_run.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <variant>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"
#include "model/param_layout.h"
#include "obs/metrics_log.h"
#include "obs/progress_bar.h"
#include "obs/trace_recorder.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/device_segment_store.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "core/byte_size.h"
#include "core/process_memory.h"
#include "stratum/error.h"
#include "io/io_engine.h"
#include "train/checkpoint.h"
#include "train/train_run_state.h"
#include "exec/executor.h"

namespace stratum {

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

namespace detail {

void TrainRun::resume_find() {
  if (!o_.save_dir.empty()) {  // an unusable --save fails now, not after hours of training
    try {
      dir_create(o_.save_dir);
    } catch (const Error& e) {
      STRATUM_FAIL("[train] --save: ", e.what(), "; choose another directory");
    }
    STRATUM_CHECK(::access(o_.save_dir.c_str(), W_OK) == 0, "[train] --save '", o_.save_dir,
                  "' is not writable; choose another directory");
  }
  // Resuming (Note [checkpoints]): the checkpoint is verified against its checksums first; from a
  // root, a damaged newest one is skipped (saying so) for the newest that verifies.
  if (o_.resume_path.empty()) return;
  resume_ = o_.resume_point ? *o_.resume_point : checkpoint_find(o_.resume_path);
  // A LoRA checkpoint holds the adapters; the frozen base comes from --model as in the first run
  // (Note [lora segments]; the params hash covers both, so another base is refused).
  STRATUM_CHECK(o_.model_dir.empty() || resume_.state.lora_r > 0,
                "[train] --resume continues from the checkpoint's own weights; drop --model");
  for (const std::string& note : resume_.notes) std::fprintf(stderr, "[stratum] resume: %s\n", note.c_str());
  // A checkpoint at the last step is a finished run: resuming it loads and checks it, trains
  // nothing and succeeds, so "rerun the command until it exits 0" is safe after a crash that
  // hit between the final checkpoint and the exit.
  STRATUM_CHECK(resume_.state.step <= o_.steps, "[train] --resume ", resume_.dir, ": the checkpoint is at step ",
                resume_.state.step, ", past --steps ", o_.steps, "; leave --steps out to use the checkpoint's");
}

// A --save disk too small for the run's checkpoints is refused before training, not found at
// the first save (with --save-every 0, after the whole run).
void TrainRun::save_space_check() {
  if (o_.save_dir.empty()) return;
  const std::size_t trainable = layout_->num_trainable_params() * sizeof(float);
  const std::size_t each = (lora_.on() ? trainable : layout_->num_params() * sizeof(float)) +
                           (o_.optimizer == TrainOptimizer::AdamW ? 2 * trainable : 0);
  const long left = o_.steps - start_step_;
  // Every --save-every steps, and at the end when that is not one of them (at least one).
  const long every = o_.save_every > 0 ? left / o_.save_every : 0;
  const long saves = std::max(1L, every + (o_.save_every > 0 && left % o_.save_every == 0 ? 0 : 1));
  const long more = checkpoint_peak_more(static_cast<long>(checkpoint_list(o_.save_dir).size()), saves, o_.keep);
  const std::size_t need = each * static_cast<std::size_t>(more), free = dir_free_bytes(o_.save_dir, "--save");
  STRATUM_CHECK(need <= free, "[train] --save '", o_.save_dir, "' has ", bytes_text(free), " free and this run's ",
                "checkpoints need about ", bytes_text(need), " more (", more, more == 1 ? " checkpoint of " : " checkpoints of ",
                bytes_text(each),
                " at once with --keep ", o_.keep, "); free space, lower --keep or choose another directory");
}

void TrainRun::save_claim() {
  // Note [run identity]: a resumed run keeps its id; the --save root is locked and must be ours.
  run_id_ = resume_.state.run_id != 0 ? resume_.state.run_id : run_id_new();
  if (!o_.save_dir.empty()) save_lock_ = checkpoint_root_claim(o_.save_dir, run_id_, resume_.dir);
}

void TrainRun::lora_resolve() {
  if (!o_.lora_init_dir.empty()) {
    STRATUM_CHECK(resume_.dir.empty(), "[train] --lora-init starts new adapters, and --resume continues the "
                  "checkpoint's; drop --lora-init");
    const LoraConfig init = adapter_config_read(o_.lora_init_dir, lora_family(cfg_));
    STRATUM_CHECK(o_.lora_r == 0 || o_.lora_r == init.r, "[train] --lora-r ", o_.lora_r, " differs from r=", init.r,
                  " of ", o_.lora_init_dir, "/", kAdapterConfigFile,
                  "; drop --lora-r (--lora-init takes r, alpha and the targets from the adapter)");
    STRATUM_CHECK(o_.lora_targets.empty() ||  // as resolved: a name given twice is one target
                      lora_targets_text(lora_config_make(lora_family(cfg_), init.r, init.alpha, o_.lora_targets, false, 0.0)) ==
                          lora_targets_text(init),
                  "[train] --lora-targets ",
                  o_.lora_targets, " differs from target_modules ", lora_targets_text(init), " of ", o_.lora_init_dir,
                  "/", kAdapterConfigFile, "; drop --lora-targets");
    STRATUM_CHECK(!o_.lora_alpha_given || o_.lora_alpha == init.alpha, "[train] --lora-alpha ", o_.lora_alpha,
                  " differs from lora_alpha ", init.alpha, " of ", o_.lora_init_dir, "/", kAdapterConfigFile,
                  "; drop --lora-alpha (--lora-init takes r, alpha and the targets from the adapter)");
    STRATUM_CHECK(!o_.lora_rslora_given || o_.lora_rslora == init.rslora, "[train] --lora-rslora differs from ",
                  "use_rslora ", init.rslora ? "true" : "false", " of ", o_.lora_init_dir, "/", kAdapterConfigFile,
                  "; drop --lora-rslora (--lora-init takes the adapter's scaling)");
    o_.lora_r = init.r;
    o_.lora_alpha = init.alpha;
    o_.lora_targets = lora_targets_text(init);
    o_.lora_rslora = init.rslora;
    if (!o_.lora_dropout_given) o_.lora_dropout = init.dropout;  // a training setting: the flag wins
  }
  lora_ = lora_config_make(lora_family(cfg_), o_.lora_r, o_.lora_alpha, o_.lora_targets, o_.lora_rslora, o_.lora_dropout);
  if (!lora_.on()) return;
  o_.lora_targets = lora_targets_text(lora_);  // recorded as resolved (PEFT's default spelled out)
  if (lora_.dropout > 0 && o_.optimizer == TrainOptimizer::ZoSgd && !o_.evaluate_only)
    std::fprintf(stderr, "[stratum] lora: zo-sgd runs its forwards without dropout (MeZO's eval mode); "
                 "lora_dropout %g is recorded, not applied\n", lora_.dropout);
}

void TrainRun::data_load() {
  // A resumed run finds its tokenizer where the original run did (the checkpoint's copy may be
  // removed by --keep while the run goes on).
  std::string tokenizer_hint = o_.tokenizer_dir;
  if (tokenizer_hint.empty() && !resume_.dir.empty() && !resume_.state.tokenizer_dir.empty() &&
      dir_exists(resume_.state.tokenizer_dir))
    tokenizer_hint = resume_.state.tokenizer_dir;
  tokenizer_dir_ = corpus_find_tokenizer(tokenizer_hint, resume_.dir.empty() ? o_.model_dir : resume_.dir);
  std::string note;
  std::vector<std::int32_t> train_tokens = corpus_load_tokens(o_.data_path, tokenizer_dir_, cfg_.vocab_size, &note);
  if (!note.empty()) std::fprintf(stderr, "[stratum] --data: %s\n", note.c_str());
  std::vector<std::int32_t> val_tokens;
  if (o_.evaluate_only) {  // Note [evaluate only]: the data is what is evaluated
    val_tokens = std::move(train_tokens);
    train_tokens.clear();
  } else if (!o_.val_data_path.empty()) {
    val_tokens = corpus_load_tokens(o_.val_data_path, tokenizer_dir_, cfg_.vocab_size, &note);
    if (!note.empty()) std::fprintf(stderr, "[stratum] --val-data: %s\n", note.c_str());
  } else if (o_.eval_every > 0) {
    const std::size_t holdout = std::max<std::size_t>(train_tokens.size() / 20,
                                                      static_cast<std::size_t>(o_.batch) * o_.seq + 1);
    STRATUM_CHECK(train_tokens.size() > 2 * holdout, "[train] the data (", train_tokens.size(),
                  " tokens) is too small to hold out a validation split of ", holdout,
                  " tokens; give --val-data or more data");
    val_tokens.assign(train_tokens.end() - static_cast<std::ptrdiff_t>(holdout), train_tokens.end());
    train_tokens.resize(train_tokens.size() - holdout);
  }
  const std::vector<std::int32_t>& data_tokens = o_.evaluate_only ? val_tokens : train_tokens;
  train_token_count_ = data_tokens.size();
  train_target_count_ = token_target_count(data_tokens.data(), data_tokens.size());
  // Note [loss mask]: the CUDA backend's loss has no mask yet (kernels/cuda/softmax_xent.cu).
  STRATUM_CHECK(o_.backend == Backend::Cpu ||
                    (train_target_count_ == data_tokens.size() &&
                     token_target_count(val_tokens.data(), val_tokens.size()) == val_tokens.size()),
                "[train] the data holds a loss mask (prompt tokens that are not trained, from prepare "
                "--jsonl-prompt), which --backend ", backend_name(o_.backend),
                " does not support yet; train it with --backend cpu");
  if (o_.evaluate_only) {
    val_loader_ = std::make_unique<DataLoader>(std::move(val_tokens), o_.batch, o_.seq, false, 0);
    eval_batches_ = static_cast<int>(std::min<std::int64_t>(o_.eval_batches, val_loader_->batches_per_epoch()));
    return;
  }
  run_state_ = train_state_of(o_, cfg_, tokenizer_dir_, train_tokens, val_tokens, threads_, offload_dir_given_);
  run_state_.run_id = run_id_;
  if (!resume_.dir.empty()) {
    train_resume_check(resume_.state, run_state_, resume_.dir);
    std::fprintf(stderr, "[stratum] resuming from %s (step %ld of %ld)\n", resume_.dir.c_str(), resume_.state.step,
                 o_.steps);
  }
  start_step_ = resume_.dir.empty() ? 0 : resume_.state.step;
  loader_ = std::make_unique<DataLoader>(std::move(train_tokens), o_.batch, o_.seq, o_.shuffle, o_.seed);
  if (!val_tokens.empty()) {
    val_loader_ = std::make_unique<DataLoader>(std::move(val_tokens), o_.batch, o_.seq, false, 0);
    // More batches than the held-out set holds would evaluate the same ones again: capped, said.
    const std::int64_t held = std::max<std::int64_t>(1, val_loader_->batches_per_epoch());
    eval_batches_ = static_cast<int>(std::min<std::int64_t>(o_.eval_batches, held));
    if (eval_batches_ < o_.eval_batches && !o_.quiet)
      std::fprintf(stderr, "[stratum] --eval-batches %d: the held-out set holds %d batches of %dx%d; evaluating those\n",
                   static_cast<int>(o_.eval_batches), eval_batches_, o_.batch, o_.seq);
  }
}

void TrainRun::trace_start() {
  if (o_.trace_path.empty()) return;
  trace_ = std::make_unique<TraceRecorder>();
  trace_->stream_to(o_.trace_path, "stratum train");  // Note [streamed trace]; an unwritable path fails now
  exec_->trace_set(trace_.get());
  store_->trace_set(trace_.get());
  if (mirror_) mirror_->trace_set(trace_.get());  // the device tier's copies (and the host's, again)
}

void TrainRun::weights_load() {
  auto base_load = [&] {  // the first run's weights, or (LoRA) the frozen base
    if (o_.model_dir.empty()) {
      model_init_random(cfg_, *layout_, *store_, o_.seed, pool_.get());
    } else {
      checkpoint_dir_check(o_.model_dir, "train");  // Note [checked reads]
      model_load_weights(o_.model_dir, *layout_, *store_);
    }
  };
  if (!resume_.dir.empty()) {
    if (lora_.on()) {
      base_load();
      adapter_load_weights(resume_.dir, *layout_, *store_);
    } else {
      model_load_weights(resume_.dir, *layout_, *store_);
    }
    if (o_.optimizer == TrainOptimizer::AdamW) {  // zo-sgd keeps no optimizer state
      // Each rank its own segments' moments (Note [zero sharding]).
      const std::function<bool(int)> mine = owned_segments();
      optimizer_load(resume_.dir, *layout_, *store_, ranks() > 1 ? &mine : nullptr);
    }
    STRATUM_CHECK(model_params_hash(*layout_, *store_) == resume_.state.params_hash, "[train] --resume ", resume_.dir,
                  ": the weights loaded do not hash to the trainer state's params_hash (",
                  lora_.on() ? "give the --model the adapters were trained on, or the checkpoint was altered"
                             : "the checkpoint was altered after it was written",
                  ")");
    return;
  }
  base_load();
  if (!lora_.on()) return;
  if (o_.lora_init_dir.empty())
    lora_init_random(*layout_, *store_, o_.seed);
  else
    adapter_load_weights(o_.lora_init_dir, *layout_, *store_);
}

TrainResult TrainRun::finished_already() const {
  TrainResult result = result_;
  result.start_step = result.steps_done = start_step_;
  result.final_loss = resume_.state.loss;
  result.params_hash = resume_.state.params_hash;
  result.min_budget_bytes = min_budget_;
  result.checkpoint_dir = resume_.dir;
  std::fprintf(stderr,
               "[stratum] nothing left to train: %s is at step %ld of %ld (final loss %.4f), params hash %s\n",
               resume_.dir.c_str(), start_step_, o_.steps, result.final_loss, hash_text(result.params_hash).c_str());
  return result;
}

// Writes a checkpoint of the state after `done` steps (Note [checkpoints]).
void TrainRun::checkpoint_save(long done, float loss) {
  exec_->sync();
  if (mirror_) mirror_->pull();  // the device's state to RAM, where checkpoints are written from
  TrainerState state = run_state_;
  state.step = done;
  state.loss = loss;
  state.next_lr = done < o_.steps ? sched_.lr_at(done) : 0.0;
  state.params_hash = model_params_hash(*layout_, *store_);
  try {
    result_.checkpoint_dir = checkpoint_write(o_.save_dir, done, o_.keep, [&](const std::string& tmp) {
      // LoRA: the base's config and tokenizer beside a PEFT adapter, no base weights (Note [lora segments]).
      model_write_files(tmp, cfg_, *layout_, *store_, tokenizer_dir_, !lora_.on(), DType::F32, source_model_dir());
      if (lora_.on()) adapter_write_files(tmp, *layout_, *store_, base_model_name());
      if (o_.optimizer == TrainOptimizer::AdamW) checkpoint_optimizer_write(tmp);
      file_write_atomic(tmp + "/trainer_state.json", trainer_state_json(state));
    }, result_.checkpoint_dir.empty() && !resume_.dir.empty() ? start_step_ : -1);  // a resumed run's first save
  } catch (const BugError&) {
    throw;
  } catch (const Error& e) {
    const bool earlier = !checkpoint_list(o_.save_dir).empty();
    STRATUM_FAIL("[checkpoint] saving step ", done, " under '", o_.save_dir, "' failed: ", e.what(),
                 earlier ? "; the checkpoints written before are intact" : "; no checkpoint was written");
  }
}

namespace {
// A checkpoint message (Note [zero sharding]): a path, or an outcome (empty: written; otherwise
// the error), NUL-terminated in a fixed-size buffer.
using CheckpointMessage = std::array<char, 4096>;
CheckpointMessage checkpoint_message(const std::string& text) {
  CheckpointMessage m{};
  std::memcpy(m.data(), text.data(), std::min(text.size(), m.size() - 1));
  return m;
}
}  // namespace

void TrainRun::checkpoint_optimizer_write(const std::string& tmp) {
  if (ranks() == 1) {
    optimizer_write_file(tmp + "/optimizer.safetensors", *layout_, *store_);
    return;
  }
  const std::function<bool(int)> mine = owned_segments();
  optimizer_write_file(tmp + "/" + optimizer_shard_name(0, ranks()), *layout_, *store_, &mine);
  const std::string dir = std::filesystem::absolute(tmp).string();
  STRATUM_CHECK(dir.size() < CheckpointMessage().size(), "[checkpoint] the path '", dir, "' is too long");
  const CheckpointMessage path = checkpoint_message(dir);
  for (int r = 1; r < ranks(); ++r) o_.comm->send(r, kTagCheckpoint, path.data(), path.size());
  for (int r = 1; r < ranks(); ++r) {
    CheckpointMessage outcome;
    o_.comm->recv(r, kTagCheckpoint, outcome.data(), outcome.size());
    STRATUM_CHECK(outcome[0] == '\0', "rank ", r, " could not write its optimizer shard: ", outcome.data(),
                  " (every rank writes into the --save directory: it must be one they all see)");
  }
  o_.comm->sends_wait();
}

void TrainRun::checkpoint_shard_write() {
  if (o_.optimizer != TrainOptimizer::AdamW) return;  // zo-sgd keeps no optimizer state
  exec_->sync();
  CheckpointMessage path;
  o_.comm->recv(0, kTagCheckpoint, path.data(), path.size());
  std::string error;
  try {
    const std::function<bool(int)> mine = owned_segments();
    optimizer_write_file(std::string(path.data()) + "/" + optimizer_shard_name(rank(), ranks()), *layout_, *store_,
                         &mine);
  } catch (const BugError&) {
    throw;
  } catch (const Error& e) {  // rank 0 reports it, and the checkpoint is not made
    error = e.what();
  }
  const CheckpointMessage outcome = checkpoint_message(error);
  o_.comm->send(0, kTagCheckpoint, outcome.data(), outcome.size());
  o_.comm->sends_wait();
}

void TrainRun::step_batches(long step, std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t BT = static_cast<std::size_t>(o_.batch) * o_.seq;
  for (int mb = 0; mb < o_.grad_accum / ranks(); ++mb)  // this rank's micro-batches (Note [data parallel])
    loader_->batch(step * o_.grad_accum + mb * ranks() + rank(), inputs + mb * BT,
                   targets != nullptr ? targets + mb * BT : nullptr);
}

void TrainRun::loop() {
  MetricsLog log = o_.log_path.empty() ? MetricsLog()
                   : start_step_ > 0   ? MetricsLog(o_.log_path, start_step_)
                                       : MetricsLog(o_.log_path);
  std::size_t param_bytes = 0;  // as held: a frozen bf16 base's layers at 2 bytes (Note [frozen bf16 base])
  for (int s = 0; s < layout_->segment_count(); ++s) {
    std::size_t numel = 0;
    for (const TensorSlot& t : layout_->segments()[s].tensors) numel += t.numel;
    if (numel == 0) continue;
    param_bytes += numel * dtype_size_bytes(units_->dtype(units_->index(s, SegmentKind::Params)));
  }
  const std::size_t trained_bytes = layout_->num_trainable_params() * sizeof(float);  // with LoRA: the adapters'
  const bool zo = o_.optimizer == TrainOptimizer::ZoSgd;
  if (lora_.on())
    std::fprintf(stderr, "[stratum] LoRA r=%d alpha=%g%s on %s: %.3fM trainable parameters, base frozen\n", lora_.r,
                 lora_.alpha, lora_.rslora ? " (rsLoRA)" : "", lora_targets_text(lora_).c_str(),
                 static_cast<double>(layout_->num_trainable_params()) / 1e6);
  std::fprintf(stderr,
               "[stratum] model %s, %.2fM parameters | data %zu tokens%s (%lld batches/epoch)%s | B=%d T=%d%s | %d "
               "threads, %s\n"
               "[stratum] state: params %s, grads %s, AdamW moments %s, boundary activations %s; engine buffers %s "
               "(%s)\n[stratum] memory: %s\n",
               cfg_.describe().c_str(), static_cast<double>(layout_->num_params()) / 1e6, train_token_count_,
               train_target_count_ == train_token_count_
                   ? ""
                   : (", " + std::to_string(train_target_count_) + " of them loss targets").c_str(),
               static_cast<long long>(loader_->batches_per_epoch()), !val_loader_ ? "" : o_.val_data_path.empty() ? ", validation held out" : ", validation from --val-data",
               o_.batch, o_.seq,
               ((o_.grad_accum > 1 ? " x " + std::to_string(o_.grad_accum) + " micro-batches" +
                                         (ranks() > 1 ? " on " + std::to_string(ranks()) + " ranks" : std::string())
                                   : std::string()) +
                (o_.row_chunk != kRowChunk ? ", row chunks of " + std::to_string(o_.row_chunk) : std::string()))
                   .c_str(),
               threads_,
               backend_describe(o_.backend).c_str(), bytes_text(param_bytes).c_str(),
               zo                  ? "none (zo-sgd)"
               : o_.grad_accum > 1 ? (bytes_text(trained_bytes) + " + their running sum").c_str()
                                   : bytes_text(trained_bytes).c_str(), zo ? "none" : bytes_text(2 * trained_bytes).c_str(),
               (bytes_text(units_->act_floats() * sizeof(float) * (cfg_.n_layer + 1)) +
                (units_->internals_floats() > 0
                     ? " + block internals " + bytes_text(units_->internals_floats() * sizeof(float) * cfg_.n_layer)
                     : std::string()))
                   .c_str(),
               bytes_text(exec_->fixed_bytes()).c_str(),
               zo                                              ? "forward only: two passes a step"
               : activations_ == ActivationPolicy::Keep    ? "block internals kept"
               : activations_ == ActivationPolicy::Offload ? "block internals offloaded"
                                                           : "block internals recomputed",
               store_text_.c_str());
  if (ranks() > 1)  // Note [zero sharding]
    std::fprintf(stderr, "[stratum] ZeRO sharding: rank 0 updates %.3fM of the %.3fM trainable parameters and holds "
                 "only their AdamW moments; the other %d ranks hold the rest\n",
                 exec_->owned_trainable_params() / 1e6, layout_->num_trainable_params() / 1e6, ranks() - 1);
  std::fputs(activations_line_.c_str(), stderr);
  std::fputs(optimizer_line_.c_str(), stderr);
  std::fputs(mlp_line_.c_str(), stderr);
  std::fputs(plan_line_.c_str(), stderr);
  std::fputs(o_.notices.c_str(), stderr);

  const int BT = o_.batch * o_.seq;
  const long step_tokens = static_cast<long>(BT) * o_.grad_accum;
  ProgressBar progress(o_.steps, o_.quiet);
  std::vector<double> step_ms;
  double total_ms = 0.0, timed_s = 0.0;
  SegmentStore& store = *store_;
  StoreStats before = store.stats(), device_before = mirror_ ? mirror_->stats() : StoreStats{};
  result_.start_step = start_step_;
  result_.steps_done = start_step_;
  for (long step = start_step_; step < o_.steps; ++step) {
    step_batches(step, inputs_.data(), targets_.data());
    store.stats_reset_peak();
    if (mirror_) mirror_->stats_reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = sched_.lr_at(step);
    exec_->lora_dropout_step(o_.seed, step);
    const StepResult r =
        o_.optimizer == TrainOptimizer::ZoSgd
            ? exec_->zo_step(inputs_.data(), targets_.data(), o_.batch, o_.seq,
                             ZoHyper{o_.seed, step, o_.zo_eps, lr, o_.weight_decay})
            : exec_->train_step(inputs_.data(), targets_.data(), o_.batch, o_.seq,
                                AdamWHyper{lr, o_.beta1, o_.beta2, o_.eps, step + 1}, o_.weight_decay, o_.grad_clip,
                                [&](int ahead, std::int32_t* inputs, std::size_t n) {  // Note [embedding rows ahead]
                                  if (step + ahead >= o_.steps || n != inputs_.size()) return false;
                                  step_batches(step + ahead, inputs, nullptr);
                                  return true;
                                });
    const float loss = r.loss;
    STRATUM_CHECK(std::isfinite(loss), "[train] loss became ", std::isnan(loss) ? "NaN" : "infinite", " at step ",
                  step + 1, "; the run diverged: lower --lr",
                  o_.weight_decay > 1 ? " or --weight-decay" : "", o_.grad_clip > 0 ? "" : ", or enable --grad-clip");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const StoreStats now = store.stats();
    const std::uint64_t read = now.read_bytes - before.read_bytes, written = now.write_bytes - before.write_bytes;
    const double stall = now.stall_ms - before.stall_ms + r.optimizer_wait_ms;
    const std::size_t peak = (mirror_ ? 0 : exec_->fixed_bytes()) + now.peak_held_bytes;  // RAM
    before = now;
    result_.read_bytes += read;
    result_.write_bytes += written;
    result_.stall_ms += stall;
    result_.peak_mem_bytes = std::max(result_.peak_mem_bytes, peak);
    step_ms.push_back(ms);
    total_ms += ms;
    // The first step of a process warms up (page faults, the plan's first loads): not timed,
    // unless it is the only one.
    const bool only_step = o_.steps - start_step_ == 1;
    if (step > start_step_ || only_step) timed_s += ms / 1000.0;
    const long timed_steps = only_step ? 1 : step - start_step_;
    const double tokens_per_s = step_tokens / (ms / 1000.0);
    const double avg_s = timed_steps > 0 ? timed_s / timed_steps : ms / 1000.0;
    result_.final_loss = loss;

    nlohmann::json record = {{"step", step + 1},        {"loss", loss},     {"lr", lr},
                             {"grad_norm", r.grad_norm}, {"step_ms", ms},    {"tokens_per_s", tokens_per_s},
                             {"read_bytes", read},       {"write_bytes", written}, {"stall_ms", stall},
                             {"peak_mem_bytes", peak}};
    if (ranks() > 1) {  // this rank's (0's) messages this step (Note [data parallel])
      record["comm_wait_ms"] = o_.comm->wait_ms() - std::exchange(comm_wait_ms_, o_.comm->wait_ms());
      record["sent_bytes"] = o_.comm->sent_bytes() - std::exchange(comm_sent_, o_.comm->sent_bytes());
    }
    if (mirror_) {  // the device tier's copies this step (Note [device tier])
      const StoreStats d = mirror_->stats();
      record["device_read_bytes"] = d.read_bytes - device_before.read_bytes;
      record["device_write_bytes"] = d.write_bytes - device_before.write_bytes;
      record["device_copy_ms"] = d.stall_ms - device_before.stall_ms;
      record["device_peak_bytes"] = exec_->fixed_bytes() + d.peak_held_bytes;
      result_.device_read_bytes += d.read_bytes - device_before.read_bytes;
      result_.device_write_bytes += d.write_bytes - device_before.write_bytes;
      result_.device_peak_bytes = std::max(result_.device_peak_bytes, exec_->fixed_bytes() + d.peak_held_bytes);
      device_before = d;
    }
    if (o_.mem_budget_bytes > 0) {
      record["mem_budget_bytes"] = o_.mem_budget_bytes;
      record["predicted_step_ms"] = result_.predicted_step_ms;
    }
    const bool last = step + 1 == o_.steps;
    // --val-data without --eval-every: only after the last step (it divided by zero: SIGFPE).
    if (val_loader_ && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || last)) {
      const float val_loss = evaluate();
      char line[128];
      if (val_loss >= 0.0f) {
        result_.final_val_loss = val_loss;
        record["val_loss"] = val_loss;
        std::snprintf(line, sizeof line, "[stratum] step %ld: val_loss %.4f", step + 1, val_loss);
      } else {
        std::snprintf(line, sizeof line, "[stratum] step %ld: evaluation abandoned to stop", step + 1);
      }
      progress.message(line);
    }
    log.write(record);
    std::string traffic;
    if (o_.mem_budget_bytes > 0) {
      char text[160];
      std::snprintf(text, sizeof text, "read %s write %s stall %.0f ms | RAM %s/%s", bytes_text(read).c_str(),
                    bytes_text(written).c_str(), stall, bytes_text(peak).c_str(), bytes_text(o_.mem_budget_bytes).c_str());
      traffic = text;
    }
    progress.update(step + 1, loss, tokens_per_s, avg_s * static_cast<double>(o_.steps - step - 1), traffic);
    result_.steps_done = step + 1;
    const bool stop = !last && stop_agreed();
    // Every rank decides alike; only rank 0 keeps its --save (train_options_for_rank).
    if (save_all_ && ((save_every_all_ > 0 && (step + 1) % save_every_all_ == 0) || last || stop)) {
      if (!o_.save_dir.empty()) {
        checkpoint_save(step + 1, loss);
        if (!last) progress.message("[stratum] saved checkpoint " + result_.checkpoint_dir);
      } else {
        checkpoint_shard_write();  // every other rank: its optimizer shard (Note [zero sharding])
      }
    }
    if (stop) {
      result_.interrupted = true;
      break;
    }
  }
  progress.finish();
  result_.step_ms_median = median(step_ms);
  const long ran = result_.steps_done - start_step_;
  const long timed_steps = ran <= 1 ? ran : ran - 1;
  // A run stopped after its untimed first step has only that step to go by.
  result_.tokens_per_s = timed_s > 0    ? static_cast<double>(step_tokens) * timed_steps / timed_s
                         : total_ms > 0 ? static_cast<double>(step_tokens) * ran / (total_ms / 1000.0)
                                        : 0.0;
  report(total_ms);
}

bool TrainRun::stop_agreed() const {
  const char mine = stop_requested() ? 1 : 0;
  if (ranks() == 1) return mine != 0;
  std::vector<char> all(static_cast<std::size_t>(ranks()));
  o_.comm->allgather(&mine, 1, all.data());
  return std::find(all.begin(), all.end(), 1) != all.end();
}

TrainResult TrainRun::run() {
  train_options_check(o_);
  if (o_.row_chunk == 0) o_.row_chunk = row_chunk_default(o_.backend);  // recorded as resolved
  save_all_ = !o_.save_dir.empty();  // rank 0's saves, which every rank joins with its optimizer shard
  save_every_all_ = o_.save_every;
  offload_dir_given_ = o_.offload_dir;  // what a checkpoint records, not this rank's own under it
  train_options_for_rank(o_);
  resume_find();
  save_claim();
  cfg_ = !resume_.dir.empty()    ? model_read_config(resume_.dir)
         : o_.model_dir.empty() ? o_.config
                                : model_read_config(o_.model_dir);
  cfg_.validate();
  cfg_.backend_check(o_.backend, "train");
  STRATUM_CHECK(o_.seq <= cfg_.context(o_.backend), "[train] --seq ", o_.seq, " is longer than the model context ",
                cfg_.context_text(o_.backend), "; use --seq <= ", cfg_.context(o_.backend));
  threads_ = o_.threads > 0 ? o_.threads : default_thread_count();
  if (!resume_.dir.empty() && o_.backend == Backend::Cpu && resume_.state.threads > 0 &&
      resume_.state.threads != threads_)
    std::fprintf(stderr,
                 "[stratum] resume: %d threads where the checkpoint trained on %d: the CPU's matrix products' bits "
                 "depend on the thread count, so from here the run differs from one never interrupted (--threads %d "
                 "keeps them)\n",
                 threads_, resume_.state.threads, resume_.state.threads);
  pool_ = std::make_unique<ThreadPool>(threads_);
  backend_set_threads(threads_);
  lora_resolve();
  data_load();
  if (ranks() > 1)  // Note [same command on every rank]
    train_ranks_agree_check(*o_.comm, run_state_,
                            {{"--save", save_all_ ? "given" : "not given"},
                             {"--save-every", std::to_string(save_every_all_)},
                             {"the step resumed from", std::to_string(start_step_)},
                             {"the base model", o_.model_dir.empty() ? "a new model" : "--model"}});
  store_make();
  save_space_check();
  trace_start();
  // The trace streams to its file and is closed at the end, also when the run fails (it shows
  // what led up to it).
  try {
    weights_load();
    if (mirror_) mirror_->push();  // loaded (or initialised) in RAM, trained on the device
    if (start_step_ == o_.steps && !o_.evaluate_only) {
      const TrainResult done = finished_already();
      if (trace_) trace_->finish();
      return done;
    }
    sched_ = o_.lr;
    sched_.total_steps = o_.steps;
    inputs_.assign(static_cast<std::size_t>(o_.batch) * o_.seq * (o_.grad_accum / ranks()), 0);
    targets_.assign(inputs_.size(), 0);
    if (o_.evaluate_only) result_ = evaluate_only();
    else loop();
  } catch (...) {
    if (trace_) {
      try {
        trace_->finish();
      } catch (...) {  // already failing: the first error is the one to report
      }
    }
    throw;
  }
  if (trace_) {
    if (mirror_) mirror_->trace_set(nullptr);
    store_->trace_set(nullptr);
    exec_->trace_set(nullptr);
    trace_->finish();
  }
  return result_;
}
}  // namespace detail

TrainResult train_run(const TrainOptions& o) { return detail::TrainRun(o).run(); }

}  // namespace stratum
