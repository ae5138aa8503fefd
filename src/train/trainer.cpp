// The training loop; see trainer.h.
#include "train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/file_util.h"
#include "core/hash.h"
#include "core/thread_pool.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "weights/model_io.h"
#include "model/param_layout.h"
#include "obs/metrics_log.h"
#include "obs/progress_bar.h"
#include "obs/trace_recorder.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"
#include "io/io_engine.h"
#include "train/checkpoint.h"
#include "exec/executor.h"

namespace stratum {

namespace {
void options_check(const TrainOptions& o) {
  STRATUM_CHECK(!o.data_path.empty(), "[train] --data FILE is required (a text file, .bin token file or llm.c shard)");
  STRATUM_CHECK(o.batch >= 1 && o.batch <= 65536, "[train] --batch must be in 1..65536, got ", o.batch);
  STRATUM_CHECK(o.seq >= 1, "[train] --seq must be >= 1, got ", o.seq);
  STRATUM_CHECK(o.steps >= 1, "[train] --steps must be >= 1, got ", o.steps);
  STRATUM_CHECK(o.lr.max_lr >= 0 && std::isfinite(o.lr.max_lr), "[train] --lr must be a finite number >= 0");
  STRATUM_CHECK(o.lr.min_lr >= 0 && o.lr.min_lr <= o.lr.max_lr, "[train] --min-lr must be in [0, --lr], got ",
                o.lr.min_lr);
  STRATUM_CHECK(o.lr.warmup_steps >= 0, "[train] --warmup must be >= 0");
  STRATUM_CHECK(o.beta1 >= 0 && o.beta1 < 1, "[train] --beta1 must be in [0, 1), got ", o.beta1);
  STRATUM_CHECK(o.beta2 >= 0 && o.beta2 < 1, "[train] --beta2 must be in [0, 1), got ", o.beta2);
  STRATUM_CHECK(o.eps > 0, "[train] --eps must be > 0, got ", o.eps);
  STRATUM_CHECK(o.weight_decay >= 0, "[train] --weight-decay must be >= 0, got ", o.weight_decay);
  STRATUM_CHECK(o.grad_clip >= 0, "[train] --grad-clip must be >= 0 (0 = off), got ", o.grad_clip);
  STRATUM_CHECK(o.save_every >= 0 && o.eval_every >= 0, "[train] --save-every and --eval-every must be >= 0");
  STRATUM_CHECK(o.save_every == 0 || !o.save_dir.empty(), "[train] --save-every needs --save DIR");
  STRATUM_CHECK(o.keep >= 1, "[train] --keep must be at least 1, got ", o.keep);
  STRATUM_CHECK(o.eval_batches >= 1, "[train] --eval-batches must be >= 1");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}
}  // namespace

namespace {
std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

std::uint64_t tokens_hash(const std::vector<std::int32_t>& tokens) {
  return hash64(tokens.data(), tokens.size() * sizeof(std::int32_t));
}

// The options of this run as a trainer state (Note [checkpoints]); step, loss, next_lr and
// params_hash are filled in when a checkpoint is written.
TrainerState state_of(const TrainOptions& o, const GptConfig& cfg, const std::string& tokenizer_dir,
                      const std::vector<std::int32_t>& train_tokens, const std::vector<std::int32_t>& val_tokens) {
  TrainerState s;
  static_cast<TrainSettings&>(s) = o;  // every recorded option (Note [option table])
  s.lr.total_steps = o.steps;
  s.config = cfg;
  s.model = cfg.describe();
  s.data_path = absolute_path(o.data_path);
  s.val_data_path = absolute_path(o.val_data_path);
  s.tokenizer_dir = absolute_path(tokenizer_dir);
  s.train_tokens = train_tokens.size();
  s.train_hash = tokens_hash(train_tokens);
  s.val_tokens = val_tokens.size();
  s.val_hash = tokens_hash(val_tokens);
  return s;
}

// A resume must do the same math as the run it continues: the model, every option of the table
// that changes the math (Note [option table]) and the data's contents must match.
void resume_check(const TrainerState& want, const TrainerState& have, const std::string& dir) {
  auto same = [&](bool equal, const std::string& what, const std::string& now, const std::string& then) {
    STRATUM_CHECK(equal, "[train] --resume ", dir, ": ", what, " is ", now, " but the checkpoint was trained with ",
                  then, "; a resumed run must use the same value (leave the flag out to take the checkpoint's)");
  };
  same(want.model == have.model && want.config.layer_norm_eps == have.config.layer_norm_eps, "the model", have.model,
       want.model);
  for (const TrainOption& option : train_option_table())
    if (option.math)
      same(train_option_equal(option, want, have), std::string("--") + option.flag, train_option_text(option, have),
           train_option_text(option, want));  // %g text may print alike; the comparison is exact
  same(want.train_tokens == have.train_tokens && want.train_hash == have.train_hash, "the training data",
       "'" + have.data_path + "' (" + std::to_string(have.train_tokens) + " tokens" +
           (have.train_tokens == want.train_tokens ? ", other contents)" : ")"),
       "'" + want.data_path + "' (" + std::to_string(want.train_tokens) + " tokens)");
  same(want.val_tokens == have.val_tokens && want.val_hash == have.val_hash, "the validation data",
       std::to_string(have.val_tokens) + " tokens" + (have.val_tokens == want.val_tokens ? ", other contents" : ""),
       std::to_string(want.val_tokens) + " tokens");
}

std::string peek_dir(const std::string& path) {
  if (file_exists(path + "/trainer_state.json")) return path;
  const std::string latest = checkpoint_model_dir(path);
  if (latest != path && file_exists(latest + "/trainer_state.json")) return latest;
  for (const std::string& name : checkpoint_list(path))
    if (file_exists(path + "/" + name + "/trainer_state.json")) return path + "/" + name;
  STRATUM_FAIL("[train] --resume '", path, "' holds no checkpoint (no trainer_state.json)");
}
}  // namespace

TrainerState train_peek_checkpoint(const std::string& path) {
  STRATUM_CHECK(dir_exists(path), "[train] --resume '", path, "' does not exist or is not a directory");
  const std::string dir = peek_dir(path);
  return trainer_state_parse(file_read_all(dir + "/trainer_state.json"), dir + "/trainer_state.json");
}

std::string train_checkpoint_root(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (!file_exists(p + "/manifest.json")) return p;
  const auto parent = std::filesystem::path(p).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::size_t train_min_budget_bytes(const GptConfig& cfg, int batch, int seq, bool keep_activations, double grad_clip) {
  ThreadPool pool(1);
  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, batch, seq));
  const Executor exec(pool, cfg, units, batch, seq, keep_activations, optimizer_mode_for(grad_clip, true));
  return exec.fixed_bytes() + exec.min_store_bytes();
}

TrainResult train_run(const TrainOptions& o) {
  options_check(o);
  if (!o.save_dir.empty()) {  // an unusable --save fails now, not after hours of training
    try {
      dir_create(o.save_dir);
    } catch (const Error& e) {
      STRATUM_FAIL("[train] --save: ", e.what(), "; choose another directory");
    }
    STRATUM_CHECK(::access(o.save_dir.c_str(), W_OK) == 0, "[train] --save '", o.save_dir,
                  "' is not writable; choose another directory");
  }
  // Resuming (Note [checkpoints]): the checkpoint is verified against its checksums first; from a
  // root, a damaged newest one is skipped (saying so) for the newest that verifies.
  ResumePoint resume;
  if (!o.resume_path.empty()) {
    STRATUM_CHECK(o.model_dir.empty(), "[train] --resume continues from the checkpoint's own weights; drop --model");
    resume = checkpoint_find(o.resume_path);
    for (const std::string& note : resume.notes) std::fprintf(stderr, "[stratum] resume: %s\n", note.c_str());
    // A checkpoint at the last step is a finished run: resuming it loads and checks it, trains
    // nothing and succeeds, so "rerun the command until it exits 0" is safe after a crash that
    // hit between the final checkpoint and the exit.
    STRATUM_CHECK(resume.state.step <= o.steps, "[train] --resume ", resume.dir, ": the checkpoint is at step ",
                  resume.state.step, ", past --steps ", o.steps, "; leave --steps out to use the checkpoint's");
  }
  const GptConfig cfg = !resume.dir.empty()     ? model_read_config(resume.dir)
                        : o.model_dir.empty() ? o.config
                                              : model_read_config(o.model_dir);
  cfg.validate();
  STRATUM_CHECK(o.seq <= cfg.n_ctx, "[train] --seq ", o.seq, " is longer than the model context n_ctx=", cfg.n_ctx,
                "; use --seq <= ", cfg.n_ctx);
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads);
  backend_set_threads(threads);

  // A resumed run finds its tokenizer where the original run did (the checkpoint's copy may be
  // removed by --keep while the run goes on).
  std::string tokenizer_hint = o.tokenizer_dir;
  if (tokenizer_hint.empty() && !resume.dir.empty() && !resume.state.tokenizer_dir.empty() &&
      dir_exists(resume.state.tokenizer_dir))
    tokenizer_hint = resume.state.tokenizer_dir;
  const std::string tokenizer_dir =
      corpus_find_tokenizer(tokenizer_hint, resume.dir.empty() ? o.model_dir : resume.dir);
  std::vector<std::int32_t> train_tokens = corpus_load_tokens(o.data_path, tokenizer_dir, cfg.vocab_size);
  std::vector<std::int32_t> val_tokens;
  if (!o.val_data_path.empty()) {
    val_tokens = corpus_load_tokens(o.val_data_path, tokenizer_dir, cfg.vocab_size);
  } else if (o.eval_every > 0) {
    const std::size_t holdout = std::max<std::size_t>(train_tokens.size() / 20,
                                                      static_cast<std::size_t>(o.batch) * o.seq + 1);
    STRATUM_CHECK(train_tokens.size() > 2 * holdout, "[train] the data (", train_tokens.size(),
                  " tokens) is too small to hold out a validation split of ", holdout,
                  " tokens; give --val-data or more data");
    val_tokens.assign(train_tokens.end() - static_cast<std::ptrdiff_t>(holdout), train_tokens.end());
    train_tokens.resize(train_tokens.size() - holdout);
  }
  const std::size_t train_token_count = train_tokens.size();
  const TrainerState run_state = state_of(o, cfg, tokenizer_dir, train_tokens, val_tokens);
  if (!resume.dir.empty()) {
    resume_check(resume.state, run_state, resume.dir);
    std::fprintf(stderr, "[stratum] resuming from %s (step %ld of %ld)\n", resume.dir.c_str(), resume.state.step,
                 o.steps);
  }
  const long start_step = resume.dir.empty() ? 0 : resume.state.step;
  DataLoader loader(std::move(train_tokens), o.batch, o.seq, o.shuffle, o.seed);
  std::unique_ptr<DataLoader> val_loader;
  if (!val_tokens.empty()) val_loader = std::make_unique<DataLoader>(std::move(val_tokens), o.batch, o.seq, false, 0);

  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, o.batch, o.seq));
  // Declared before the executor so it outlives it (the executor's optimizer worker uses it).
  std::unique_ptr<SegmentStore> store_owner;
  Executor exec(pool, cfg, units, o.batch, o.seq, o.keep_activations,
                optimizer_mode_for(o.grad_clip, o.mem_budget_bytes > 0));
  const std::size_t min_budget = exec.fixed_bytes() + exec.min_store_bytes();
  std::string store_text = "everything in RAM";
  std::string plan_line;
  TrainResult result;
  if (o.mem_budget_bytes > 0) {
    STRATUM_CHECK(o.mem_budget_bytes >= min_budget, "[train] --mem-budget ", mib(o.mem_budget_bytes),
                  " is below the minimum of ", mib(min_budget), " for this model at B=", o.batch, " T=", o.seq,
                  " (engine buffers ", mib(exec.fixed_bytes()), " + largest working set ", mib(exec.min_store_bytes()),
                  "); use --mem-budget ", (min_budget + (1 << 20) - 1) >> 20, "M or more, or lower --batch/--seq");
    // The plan (Note [plan model]): the predicted step time for the log, and the prefetch depth
    // unless --prefetch chose one.
    PlanRequest request{cfg, o.batch, o.seq, o.keep_activations, o.grad_clip, o.mem_budget_bytes, o.prefetch};
    CalibrationOptions co;
    co.offload_dir = o.offload_dir;
    co.threads = threads;
    const PlanMeasurement measured = plan_measure(request, co, threads, o.measure_exe);
    const Plan plan = plan_make(request, measured.timing, measured.read_gbps, measured.write_gbps);
    result.predicted_step_ms = plan.step_ms;
    result.prefetch = plan.prefetch;
    char plan_text[256];
    std::snprintf(plan_text, sizeof plan_text,
                  "[stratum] plan: %s per step read, %s written, predicted step %.0f ms (bottleneck: %s), prefetch %d "
                  "(%s)\n",
                  mib(plan.read_bytes).c_str(), mib(plan.write_bytes).c_str(), plan.step_ms, plan.bottleneck.c_str(),
                  plan.prefetch, o.prefetch >= 0 ? "--prefetch" : "chosen by the plan");
    plan_line = plan_text;
    TieredStoreOptions so;
    so.budget_bytes = o.mem_budget_bytes - exec.fixed_bytes();
    so.offload_dir = o.offload_dir;
    so.prefetch_depth = plan.prefetch;
    so.io.backend = o.io_backend;
    so.io.block_bytes = o.io_block_bytes;
    so.io.queue_depth = o.io_queue_depth;
    so.io.fault = o.io_fault;
    auto tiered = std::make_unique<TieredSegmentStore>(units, so);
    store_text = "budget " + mib(o.mem_budget_bytes) + " (minimum " + mib(min_budget) + "), offload to " +
                 o.offload_dir + ": " + tiered->describe();
    store_owner = std::move(tiered);
  } else {
    STRATUM_CHECK(o.offload_dir.empty(), "[train] --offload-dir needs --mem-budget SIZE (e.g. --mem-budget 2G)");
    store_owner = std::make_unique<RamSegmentStore>(units);
  }
  SegmentStore& store = *store_owner;
  exec.attach(store);
  std::unique_ptr<TraceRecorder> trace;
  if (!o.trace_path.empty()) {
    trace = std::make_unique<TraceRecorder>();
    trace->write(o.trace_path);  // an unwritable path fails now, not after the run
    exec.trace_set(trace.get());
    store.trace_set(trace.get());
  }
  // The trace is written at the end, and also when the run fails (it shows what led up to it).
  struct TraceFlush {
    TraceRecorder* trace;
    const std::string& path;
    bool done = false;
    ~TraceFlush() {
      if (trace == nullptr || done) return;
      try {
        trace->write(path);
      } catch (...) {  // already failing: the first error is the one to report
      }
    }
  } trace_flush{trace.get(), o.trace_path};
  if (!resume.dir.empty()) {
    model_load_weights(resume.dir, layout, store);
    optimizer_load_file(resume.dir + "/optimizer.safetensors", layout, store);
    STRATUM_CHECK(model_params_hash(layout, store) == resume.state.params_hash, "[train] --resume ", resume.dir,
                  ": the weights loaded do not hash to the trainer state's params_hash (the checkpoint was altered "
                  "after it was written)");
  } else if (o.model_dir.empty()) {
    model_init_random(cfg, layout, store, o.seed);
  } else {
    model_load_weights(o.model_dir, layout, store);
  }

  if (start_step == o.steps) {
    result.start_step = result.steps_done = start_step;
    result.final_loss = resume.state.loss;
    result.params_hash = resume.state.params_hash;
    result.min_budget_bytes = min_budget;
    result.checkpoint_dir = resume.dir;
    std::fprintf(stderr,
                 "[stratum] nothing left to train: %s is at step %ld of %ld (final loss %.4f), params hash %016llx\n",
                 resume.dir.c_str(), start_step, o.steps, result.final_loss,
                 static_cast<unsigned long long>(result.params_hash));
    return result;
  }
  MetricsLog log = o.log_path.empty() ? MetricsLog()
                   : start_step > 0   ? MetricsLog(o.log_path, start_step)
                                      : MetricsLog(o.log_path);
  LrSchedule sched = o.lr;
  sched.total_steps = o.steps;
  const std::size_t param_bytes = layout.num_params() * sizeof(float);
  std::fprintf(stderr,
               "[stratum] model %s, %.2fM parameters | data %zu tokens (%lld batches/epoch)%s | B=%d T=%d | %d "
               "threads, %s\n"
               "[stratum] state: params %s, grads %s, AdamW moments %s, boundary activations %s; engine buffers %s "
               "(%s)\n[stratum] memory: %s\n",
               cfg.describe().c_str(), static_cast<double>(layout.num_params()) / 1e6, train_token_count,
               static_cast<long long>(loader.batches_per_epoch()), val_loader ? ", validation held out" : "",
               o.batch, o.seq, threads, backend_describe().c_str(), mib(param_bytes).c_str(), mib(param_bytes).c_str(),
               mib(2 * param_bytes).c_str(), mib(units.act_floats() * sizeof(float) * (cfg.n_layer + 1)).c_str(),
               mib(exec.fixed_bytes()).c_str(),
               o.keep_activations ? "block internals kept" : "block internals recomputed", store_text.c_str());

  const int BT = o.batch * o.seq;
  std::vector<std::int32_t> inputs(BT), targets(BT);
  auto evaluate = [&]() {
    double total = 0.0;
    for (int k = 0; k < o.eval_batches; ++k) {
      val_loader->batch(k, inputs.data(), targets.data());
      total += exec.loss(inputs.data(), targets.data(), o.batch, o.seq);
    }
    return static_cast<float>(total / o.eval_batches);
  };

  // Writes a checkpoint of the state after `done` steps (Note [checkpoints]).
  auto save_checkpoint = [&](long done, float loss) {
    exec.sync();
    TrainerState state = run_state;
    state.step = done;
    state.loss = loss;
    state.next_lr = done < o.steps ? sched.lr_at(done) : 0.0;
    state.params_hash = model_params_hash(layout, store);
    try {
      result.checkpoint_dir = checkpoint_write(o.save_dir, done, o.keep, [&](const std::string& tmp) {
        model_write_files(tmp, cfg, layout, store, tokenizer_dir);
        optimizer_write_file(tmp + "/optimizer.safetensors", layout, store);
        file_write_atomic(tmp + "/trainer_state.json", trainer_state_json(state));
      });
    } catch (const BugError&) {
      throw;
    } catch (const Error& e) {
      STRATUM_FAIL("[checkpoint] saving step ", done, " under '", o.save_dir, "' failed: ", e.what(),
                   "; the checkpoints written before are intact");
    }
  };

  std::fputs(plan_line.c_str(), stderr);
  ProgressBar progress(o.steps, o.quiet);
  std::vector<double> step_ms;
  double total_ms = 0.0;
  double timed_s = 0.0;
  StoreStats before = store.stats();
  result.start_step = start_step;
  result.steps_done = start_step;
  for (long step = start_step; step < o.steps; ++step) {
    loader.batch(step, inputs.data(), targets.data());
    store.stats_reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = sched.lr_at(step);
    const StepResult r = exec.train_step(inputs.data(), targets.data(), o.batch, o.seq,
                                         AdamWHyper{lr, o.beta1, o.beta2, o.eps, step + 1}, o.weight_decay, o.grad_clip);
    const float loss = r.loss;
    const float grad_norm = r.grad_norm;
    STRATUM_CHECK(std::isfinite(loss), "[train] loss became ", loss, " at step ", step + 1,
                  "; lower --lr or enable --grad-clip");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const StoreStats now = store.stats();
    const std::uint64_t read = now.read_bytes - before.read_bytes, written = now.write_bytes - before.write_bytes;
    const double stall = now.stall_ms - before.stall_ms + r.optimizer_wait_ms;
    const std::size_t peak = exec.fixed_bytes() + now.peak_held_bytes;
    before = now;
    result.read_bytes += read;
    result.write_bytes += written;
    result.stall_ms += stall;
    result.peak_mem_bytes = std::max(result.peak_mem_bytes, peak);
    step_ms.push_back(ms);
    total_ms += ms;
    // The first step of a process warms up (page faults, the plan's first loads): not timed,
    // unless it is the only one.
    const bool only_step = o.steps - start_step == 1;
    if (step > start_step || only_step) timed_s += ms / 1000.0;
    const long timed_steps = only_step ? 1 : step - start_step;
    const double tokens_per_s = BT / (ms / 1000.0);
    const double avg_s = timed_steps > 0 ? timed_s / timed_steps : ms / 1000.0;
    result.final_loss = loss;

    nlohmann::json record = {{"step", step + 1}, {"loss", loss},     {"lr", lr},
                             {"grad_norm", grad_norm}, {"step_ms", ms}, {"tokens_per_s", tokens_per_s},
                             {"read_bytes", read}, {"write_bytes", written}, {"stall_ms", stall},
                             {"peak_mem_bytes", peak}};
    if (o.mem_budget_bytes > 0) {
      record["mem_budget_bytes"] = o.mem_budget_bytes;
      record["predicted_step_ms"] = result.predicted_step_ms;
    }
    const bool last = step + 1 == o.steps;
    if (val_loader && ((step + 1) % o.eval_every == 0 || last)) {
      result.final_val_loss = evaluate();
      record["val_loss"] = result.final_val_loss;
      char line[128];
      std::snprintf(line, sizeof line, "[stratum] step %ld: val_loss %.4f", step + 1, result.final_val_loss);
      progress.message(line);
    }
    log.write(record);
    std::string traffic;
    if (o.mem_budget_bytes > 0) {
      char text[160];
      std::snprintf(text, sizeof text, "read %s write %s stall %.0f ms | RAM %s/%s", mib(read).c_str(),
                    mib(written).c_str(), stall, mib(peak).c_str(), mib(o.mem_budget_bytes).c_str());
      traffic = text;
    }
    progress.update(step + 1, loss, tokens_per_s, avg_s * static_cast<double>(o.steps - step - 1), traffic);
    result.steps_done = step + 1;
    const bool stop = !last && o.stop_requested != nullptr && *o.stop_requested != 0;
    if (!o.save_dir.empty() && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || last || stop)) {
      save_checkpoint(step + 1, loss);
      if (!last) progress.message("[stratum] saved checkpoint " + result.checkpoint_dir);
    }
    if (stop) {
      result.interrupted = true;
      break;
    }
  }
  progress.finish();
  result.step_ms_median = median(step_ms);
  const long ran = result.steps_done - start_step;
  const long timed_steps = ran <= 1 ? ran : ran - 1;
  result.tokens_per_s = timed_s > 0 ? static_cast<double>(BT) * timed_steps / timed_s : 0.0;
  exec.sync();
  result.params_hash = model_params_hash(layout, store);
  result.min_budget_bytes = min_budget;
  if (trace) {
    store.trace_set(nullptr);
    exec.trace_set(nullptr);
    trace->write(o.trace_path);
    trace_flush.done = true;
  }
  {
    const StoreStats s = store.stats();
    if (s.read_busy_ms > 0) result.read_gbps = s.read_bytes / (s.read_busy_ms * 1e6);
    if (s.write_busy_ms > 0) result.write_gbps = s.write_bytes / (s.write_busy_ms * 1e6);
  }
  if (o.mem_budget_bytes > 0)
    std::fprintf(stderr,
                 "[stratum] tier traffic: read %s (%.2f GB/s while reading), written %s (%.2f GB/s), compute stalled "
                 "%.0f ms (%.1f%% of step time), peak RAM %s of the %s budget\n",
                 mib(result.read_bytes).c_str(), result.read_gbps, mib(result.write_bytes).c_str(), result.write_gbps,
                 result.stall_ms,
                 100.0 * result.stall_ms / std::max(1.0, total_ms),
                 mib(result.peak_mem_bytes).c_str(), mib(o.mem_budget_bytes).c_str());
  if (o.mem_budget_bytes > 0)
    std::fprintf(stderr, "[stratum] plan check: median step %.0f ms, predicted %.0f ms (%+.0f%%)\n",
                 result.step_ms_median, result.predicted_step_ms,
                 100.0 * (result.predicted_step_ms - result.step_ms_median) / std::max(1e-9, result.step_ms_median));
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  std::fprintf(stderr,
               "[stratum] trained %ld steps: final loss %.4f, %.0f tokens/s, median step %.1f ms, peak RSS %s, params "
               "hash %016llx%s%s\n",
               result.steps_done, result.final_loss, result.tokens_per_s, result.step_ms_median,
               mib(static_cast<std::size_t>(usage.ru_maxrss) * 1024).c_str(),
               static_cast<unsigned long long>(result.params_hash), result.checkpoint_dir.empty() ? "" : ", saved to ",
               result.checkpoint_dir.c_str());
  return result;
}

}  // namespace stratum
