// The training loop; see trainer.h.
#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "kernels/cpu/matmul.h"
#include "model/model_io.h"
#include "model/param_layout.h"
#include "obs/metrics_log.h"
#include "obs/progress_bar.h"
#include "obs/trace_recorder.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"
#include "train/executor.h"

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

std::size_t train_min_budget_bytes(const GptConfig& cfg, int batch, int seq, bool keep_activations, double grad_clip) {
  ThreadPool pool(1);
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  const UnitTable units(layout, Executor::activation_unit_floats(cfg, batch, seq));
  const Executor exec(pool, cfg, units, batch, seq, keep_activations, optimizer_mode_for(grad_clip, true));
  return exec.fixed_bytes() + exec.min_store_bytes();
}

TrainResult train_run(const TrainOptions& o) {
  options_check(o);
  const GptConfig cfg = o.model_dir.empty() ? o.config : model_read_config(o.model_dir);
  cfg.validate();
  STRATUM_CHECK(o.seq <= cfg.n_ctx, "[train] --seq ", o.seq, " is longer than the model context n_ctx=", cfg.n_ctx,
                "; use --seq <= ", cfg.n_ctx);
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads);
  blas_set_threads(threads);

  const std::string tokenizer_dir = corpus_find_tokenizer(o.tokenizer_dir, o.model_dir);
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
  DataLoader loader(std::move(train_tokens), o.batch, o.seq, o.shuffle, o.seed);
  std::unique_ptr<DataLoader> val_loader;
  if (!val_tokens.empty()) val_loader = std::make_unique<DataLoader>(std::move(val_tokens), o.batch, o.seq, false, 0);

  const ParamLayout layout = ParamLayout::gpt2(cfg);
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
  if (o.model_dir.empty()) model_init_random(cfg, layout, store, o.seed);
  else model_load_weights(o.model_dir, layout, store);

  MetricsLog log = o.log_path.empty() ? MetricsLog() : MetricsLog(o.log_path);
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
               o.batch, o.seq, threads, blas_describe().c_str(), mib(param_bytes).c_str(), mib(param_bytes).c_str(),
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

  std::fputs(plan_line.c_str(), stderr);
  ProgressBar progress(o.steps, o.quiet);
  std::vector<double> step_ms;
  double total_ms = 0.0;
  double timed_s = 0.0;
  StoreStats before = store.stats();
  for (long step = 0; step < o.steps; ++step) {
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
    if (step > 0 || o.steps == 1) timed_s += ms / 1000.0;
    const long timed_steps = o.steps == 1 ? 1 : step;
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
    if (!o.save_dir.empty() && ((o.save_every > 0 && (step + 1) % o.save_every == 0) || last)) {
      exec.sync();
      model_save(o.save_dir, cfg, layout, store, tokenizer_dir);
      if (!last) progress.message("[stratum] saved " + o.save_dir + " at step " + std::to_string(step + 1));
    }
  }
  progress.finish();
  result.step_ms_median = median(step_ms);
  const long timed_steps = o.steps == 1 ? 1 : o.steps - 1;
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
               o.steps, result.final_loss, result.tokens_per_s, result.step_ms_median,
               mib(static_cast<std::size_t>(usage.ru_maxrss) * 1024).c_str(),
               static_cast<unsigned long long>(result.params_hash), o.save_dir.empty() ? "" : ", saved to ",
               o.save_dir.c_str());
  return result;
}

}  // namespace stratum
