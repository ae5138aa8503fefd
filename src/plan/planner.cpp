// The planner; see planner.h, Note [plan model] and Note [plan calibration].
#include "plan/planner.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string_view>

#include "backend/backend.h"
#include "core/rng.h"
#include "model/hf_config.h"
#include "weights/model_io.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "plan/calibration.h"
#include "plan/traffic_model.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "core/file_util.h"
#include "store/step_schedule.h"
#include "store/unit_table.h"
#include "core/byte_size.h"
#include "core/process_memory.h"
#include "stratum/error.h"

namespace stratum {

namespace {

// Floats AdamW updates per step: the trainable segments' (with LoRA, the adapters').
std::size_t segment_floats(const ParamLayout& layout) {
  std::size_t total = 0;
  for (int s = 0; s < layout.segment_count(); ++s)
    if (layout.trainable(s)) total += layout.segments()[s].size_floats;
  return total;
}
}  // namespace

namespace {
// A directory of the planner's own (a scratch offload directory, a temporary config directory),
// removed with everything in it when this goes out of scope.
struct OwnedDir {
  explicit OwnedDir(std::string dir) : path(std::move(dir)) {}
  ~OwnedDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  OwnedDir(const OwnedDir&) = delete;
  OwnedDir& operator=(const OwnedDir&) = delete;
  std::string path;
};

// Note [stale plan directories]: the planner's directories are named stratum-plan-<pid> (the
// measurement's offload files) and stratum-plan-<pid>-XXXXXX (the measured config), <pid> the
// process that made them, which removes them when it is done. A process killed outright (SIGKILL,
// a crash test) cannot; so before making one, the planner removes those in the same parent whose
// process no longer exists. A live process's, or one this user may not signal, are left alone.
void stale_plan_dirs_remove(const std::string& parent) {
  constexpr std::string_view kPrefix = "stratum-plan-";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    const char* digits = name.c_str() + kPrefix.size();
    char* rest = nullptr;
    const long pid = std::strtol(digits, &rest, 10);
    if (rest == digits || (*rest != '\0' && *rest != '-') || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    std::filesystem::remove_all(it->path(), ignored);
  }
}

// The measurement's own offload files (Note [bounded measurement]) go to DIR/stratum-plan-<pid>,
// so a run or another plan using DIR is not disturbed.
std::unique_ptr<OwnedDir> scratch_dir_make(const std::string& parent) {
  stale_plan_dirs_remove(parent);  // Note [stale plan directories]
  auto dir = std::make_unique<OwnedDir>(parent + "/stratum-plan-" + std::to_string(::getpid()));
  dir_create(dir->path);
  return dir;
}

// Per category, the compute spans of kTimedSteps forward-backward passes of the one-layer model
// (after a warm-up pass) through `store`, tagged by the executor with their GroupWork.
std::vector<ComputeTiming> time_passes(Executor& exec, const GptConfig& mini, const PlanRequest& r) {
  const int BT = r.batch * r.seq;
  std::vector<std::int32_t> inputs(BT), targets(BT);
  Rng rng(7);
  for (int i = 0; i < BT; ++i) {
    inputs[i] = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(mini.vocab_size));
    targets[i] = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(mini.vocab_size));
  }
  constexpr int kTimedSteps = 3;
  std::vector<ComputeTiming> steps(kTimedSteps);
  for (int step = 0; step <= kTimedSteps; ++step) {
    TraceRecorder trace;
    exec.trace_set(step > 0 ? &trace : nullptr);
    if (r.zeroth_order)
      exec.zo_step(inputs.data(), targets.data(), r.batch, r.seq, ZoHyper{7, step, 1e-3, 0.0, 0.0});
    else
      exec.forward_backward(inputs.data(), targets.data(), r.batch, r.seq);
    exec.trace_set(nullptr);
    if (step == 0) continue;
    ComputeTiming& t = steps[step - 1];
    for (const TraceRecorder::Event& e : trace.events()) {
      if (e.track != TraceRecorder::kCompute || std::string(e.category) == "stall") continue;
      const double ms = e.dur_us / 1000.0;
      // By the schedule group's work the executor tagged the span with (names are for people).
      switch (e.tag < 0 ? GroupWork::HeadBegin : static_cast<GroupWork>(e.tag)) {
        case GroupWork::Optimizer: case GroupWork::GradAccum: case GroupWork::GradShare: break;  // not timed here
        case GroupWork::LayerForward: t.layer_forward_ms += ms; break;
        case GroupWork::LayerBackward: t.layer_backward_ms += ms; break;
        case GroupWork::VocabForward: t.vocab_forward_ms += ms; break;
        case GroupWork::VocabBackward: t.vocab_backward_ms += ms; break;
        case GroupWork::HeadLse: t.head_lse_ms += ms; break;
        case GroupWork::HeadBackward: t.head_backward_ms += ms; break;
        case GroupWork::EmbedForward: case GroupWork::HeadBegin: case GroupWork::HeadEnd:
        case GroupWork::EmbedBackward: t.other_ms += ms; break;
      }
    }
    if (r.zeroth_order) {  // two forward passes a step: the times of one (each with its zo update)
      t.layer_forward_ms /= 2;
      t.vocab_forward_ms /= 2;
      t.head_lse_ms /= 2;
      t.other_ms /= 2;
    }
  }
  return steps;
}
}  // namespace

double plan_recompute_share(const GptConfig& cfg, int T) {
  const double C = cfg.n_embd, I = cfg.mlp_width(), Q = cfg.q_dim(), KV = cfg.kv_dim();
  const double qkv = C * (Q + 2 * KV), out = Q * C, up = (cfg.llama() ? 2 : 1) * C * I, down = I * C;
  const double attention = Q * static_cast<double>(T);  // scores and weighted values, T/2 keys a row
  return (qkv + out + up + attention) / (qkv + out + up + down + attention);
}

ComputeTiming plan_measure_compute(ThreadPool& pool, const PlanRequest& r, const std::string& offload_dir) {
  GptConfig mini = r.config;
  mini.n_layer = 1;
  const int rows = vocab_block_rows(r.config);
  mini.vocab_size = std::min(r.config.vocab_size, kMinVocabBlocks * rows);  // same block size
  const ParamLayout layout = ParamLayout::of(mini, r.lora);
  // Forward and backward only: the moments are never allocated. Under a budget the one-layer
  // model streams through the budget like the run (Note [bounded measurement]); the store and
  // the executor are gone before AdamW's buffers are made.
  std::vector<ComputeTiming> steps;
  {
    // Its one layer keeps its internals for a run that keeps them; otherwise it recomputes them
    // (the engine buffers of every other run are at least that one layer's), and the recompute's
    // share of a forward is taken off the backward below (ComputeTiming); zo-sgd has no backward.
    PlanRequest kept = r;
    kept.activations = r.activations == ActivationPolicy::Keep ? ActivationPolicy::Keep : ActivationPolicy::Recompute;
    kept.grad_accum = 1;  // one micro-batch's pieces; the plan runs them N times
    const UnitTable units = plan_units(layout, Executor::activation_unit_floats(mini, r.batch, r.seq), kept);
    std::unique_ptr<OwnedDir> scratch;  // destroyed after the store, which after the executor
    std::unique_ptr<SegmentStore> store;
    Executor exec(pool, mini, units, r.batch, r.seq, kept.activations,
                  r.zeroth_order ? OptimizerMode::ZerothOrder : OptimizerMode::Inline, r.precision);
    if (r.mem_budget_bytes > 0 && !offload_dir.empty()) {
      const std::size_t need = exec.fixed_bytes() + exec.min_store_bytes();
      STRATUM_CHECK(r.mem_budget_bytes >= need, "[plan] --mem-budget ", bytes_text(r.mem_budget_bytes),
                    " is below the ", bytes_text(need), " the measurement of one layer needs; raise --mem-budget");
      scratch = scratch_dir_make(offload_dir);
      TieredStoreOptions so;
      so.budget_bytes = r.mem_budget_bytes - exec.fixed_bytes();
      so.offload_dir = scratch->path;
      so.prefetch_depth = r.prefetch >= 0 ? r.prefetch : 2;
      store = std::make_unique<TieredSegmentStore>(units, so);
    } else {
      store = std::make_unique<RamSegmentStore>(units);
    }
    exec.attach(*store);
    model_init_random(mini, layout, *store, 1);
    steps = time_passes(exec, mini, r);
  }
  auto med = [&](double ComputeTiming::*field) {
    std::vector<double> v;
    for (const ComputeTiming& t : steps) v.push_back(t.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  ComputeTiming t;
  const double blocks = layout.vocab_block_count();
  t.layer_forward_ms = med(&ComputeTiming::layer_forward_ms);
  t.layer_backward_ms = med(&ComputeTiming::layer_backward_ms);
  // The backward alone; never below a forward (it multiplies twice as much), which only the noise
  // of a tiny model's timings could suggest.
  if (r.activations != ActivationPolicy::Keep && !r.zeroth_order)
    t.layer_backward_ms = std::max(t.layer_forward_ms,
                                   t.layer_backward_ms - t.layer_forward_ms * plan_recompute_share(r.config, r.seq));
  t.other_ms = med(&ComputeTiming::other_ms);
  t.vocab_forward_ms = med(&ComputeTiming::vocab_forward_ms) / blocks;
  t.vocab_backward_ms = med(&ComputeTiming::vocab_backward_ms) / blocks;
  t.head_lse_ms = med(&ComputeTiming::head_lse_ms) / blocks;
  t.head_backward_ms = med(&ComputeTiming::head_backward_ms) / blocks;
  // AdamW per float on the run's pool (inline) and on one thread (the worker), over buffers sized
  // to the budget: at most 128 MiB in all, a quarter of the budget under one, at least 4 MiB.
  constexpr std::size_t kBytesPerFloat = 4 * sizeof(float);  // params, grads, both moments
  std::size_t n = 8 * kChunkFloats;
  if (r.mem_budget_bytes > 0) n = std::min(n, r.mem_budget_bytes / 4 / kBytesPerFloat);
  n = std::max(n, (std::size_t{4} << 20) / kBytesPerFloat) / 16 * 16;
  AlignedBuffer p(n * sizeof(float)), m(n * sizeof(float)), v(n * sizeof(float)), g(n * sizeof(float));
  for (AlignedBuffer* b : {&p, &m, &v, &g}) std::fill(b->as_f32(), b->as_f32() + n, 0.5f);  // touch every page
  auto adamw_ns = [&](const Ops& ops) {
    double best = std::numeric_limits<double>::infinity();
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t at = 0; at < n; at += kChunkFloats)  // chunk by chunk, as the optimizer runs
        ops.adamw_update(p.as_f32() + at, m.as_f32() + at, v.as_f32() + at, g.as_f32() + at,
                         std::min(kChunkFloats, n - at), AdamWHyper{1e-4, 0.9, 0.95, 1e-8, rep + 1}, 0.1, 1.0f);
      best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    return best / static_cast<double>(n);
  };
  t.adamw_inline_ns_per_float = adamw_ns(*ops_make(pool));
  ThreadPool one(1);
  t.adamw_worker_ns_per_float = adamw_ns(*ops_make(one));
  return t;
}

nlohmann::json plan_measurement_json(const PlanMeasurement& m) {
  const ComputeTiming& t = m.timing;
  return {{"layer_forward_ms", t.layer_forward_ms},     {"layer_backward_ms", t.layer_backward_ms},
          {"vocab_forward_ms", t.vocab_forward_ms},     {"vocab_backward_ms", t.vocab_backward_ms},
          {"head_lse_ms", t.head_lse_ms},               {"head_backward_ms", t.head_backward_ms},
          {"other_ms", t.other_ms},                     {"adamw_inline_ns_per_float", t.adamw_inline_ns_per_float},
          {"adamw_worker_ns_per_float", t.adamw_worker_ns_per_float},
          {"read_gbps", m.read_gbps},                   {"write_gbps", m.write_gbps},
          {"disk_from_cache", m.disk_from_cache},       {"peak_rss_bytes", m.peak_rss_bytes}};
}

namespace {
PlanMeasurement plan_measurement_parse(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    PlanMeasurement m;
    ComputeTiming& t = m.timing;
    t.layer_forward_ms = j.at("layer_forward_ms").get<double>();
    t.layer_backward_ms = j.at("layer_backward_ms").get<double>();
    t.vocab_forward_ms = j.at("vocab_forward_ms").get<double>();
    t.vocab_backward_ms = j.at("vocab_backward_ms").get<double>();
    t.head_lse_ms = j.at("head_lse_ms").get<double>();
    t.head_backward_ms = j.at("head_backward_ms").get<double>();
    t.other_ms = j.at("other_ms").get<double>();
    t.adamw_inline_ns_per_float = j.at("adamw_inline_ns_per_float").get<double>();
    t.adamw_worker_ns_per_float = j.at("adamw_worker_ns_per_float").get<double>();
    m.read_gbps = j.at("read_gbps").get<double>();
    m.write_gbps = j.at("write_gbps").get<double>();
    m.disk_from_cache = j.at("disk_from_cache").get<bool>();
    m.peak_rss_bytes = j.at("peak_rss_bytes").get<std::size_t>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[plan] the measurement process printed something unexpected (", e.what(), ")");
  }
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}
}  // namespace

namespace {
// A temporary directory holding config.json of `config` (what `stratum plan --model` reads).
std::string config_dir_make(const GptConfig& config) {
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  stale_plan_dirs_remove(tmp.string());  // Note [stale plan directories]
  std::string templ = (tmp / ("stratum-plan-" + std::to_string(::getpid()) + "-XXXXXX")).string();
  STRATUM_CHECK(::mkdtemp(templ.data()) != nullptr, "[plan] cannot create a temporary directory in ",
                tmp.string(), ": ", std::strerror(errno),
                " (set TMPDIR to a writable directory)");
  OwnedDir dir(templ);  // removed if writing fails
  hf_config_write(templ + "/config.json", config);
  dir.path.clear();     // written: the caller's OwnedDir owns it
  return templ;
}
}  // namespace

PlanMeasurement plan_measure(const PlanRequest& r, const CalibrationOptions& co, int threads,
                             const std::string& helper_exe) {
  if (helper_exe.empty()) {
    PlanMeasurement m;
    if (!co.offload_dir.empty()) {
      const Calibration cal = calibrate(co);
      m.read_gbps = cal.disk_read_gbps;
      m.write_gbps = cal.disk_write_gbps;
      m.disk_from_cache = cal.from_cache;
    }
    ThreadPool pool(threads);
    m.timing = plan_measure_compute(pool, r, co.offload_dir);
    m.peak_rss_bytes = process_peak_rss_bytes();
    return m;
  }
  // `stratum plan --model DIR ... --measure-json` in a new process (exec, so nothing of ours is
  // shared), DIR a temporary directory holding the run's config.json, so the child measures the
  // run's own architecture (family, head_dim, KV heads, MLP width, rope; no position table for a
  // Llama), not a GPT-2 of the same width.
  const OwnedDir config_dir(config_dir_make(r.config));
  std::vector<std::string> args = {"stratum", "plan",
                                   "--model", config_dir.path,
                                   "--batch", std::to_string(r.batch),
                                   "--seq", std::to_string(r.seq),
                                   "--threads", std::to_string(threads),
                                   "--precision", precision_name(r.precision),
                                   "--optimizer", r.zeroth_order ? "zo-sgd" : "adamw",
                                   "--measure-json"};
  if (r.lora.on()) {
    auto exact = [](double v) {  // round-trips a double
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", v);
      return std::string(text);
    };
    args.insert(args.end(), {"--lora-r", std::to_string(r.lora.r), "--lora-alpha", exact(r.lora.alpha),
                             "--lora-targets", lora_targets_text(r.lora)});
    if (r.lora.rslora) args.push_back("--lora-rslora");
    if (r.base_bf16) args.push_back("--lora-base-bf16");
    if (r.lora.dropout > 0) args.insert(args.end(), {"--lora-dropout", exact(r.lora.dropout)});
  }
  if (!co.offload_dir.empty()) {
    args.insert(args.end(), {"--mem-budget", std::to_string(std::max<std::size_t>(r.mem_budget_bytes, 1)),
                             "--offload-dir", co.offload_dir});
    if (co.refresh) args.push_back("--recalibrate");
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2], err[2];
  STRATUM_CHECK(::pipe(out) == 0 && ::pipe(err) == 0, "[plan] cannot create pipes: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, err[0]);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, helper_exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    STRATUM_FAIL("[plan] cannot start the measurement process ", helper_exe, ": ", std::strerror(rc));
  }
  const std::string text = read_all(out[0]);  // small outputs: one pipe drained after the other
  std::string errors = read_all(err[0]);
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!errors.empty() && errors.back() == '\n') errors.pop_back();
    constexpr std::string_view kPrefix = "stratum: ";
    if (errors.rfind(kPrefix, 0) == 0) errors.erase(0, kPrefix.size());
    if (errors.empty()) errors = "[plan] the measurement process failed";
    throw Error(errors);  // its one-line error (a bad offload dir ...) is the run's
  }
  return plan_measurement_parse(text);
}

namespace {

// Compute time of group g on the training thread (0 for updates on the worker).
double group_compute_ms(GroupWork work, const ComputeTiming& t) {
  switch (work) {
    case GroupWork::LayerForward: return t.layer_forward_ms;
    case GroupWork::LayerBackward: return t.layer_backward_ms;
    case GroupWork::VocabForward: return t.vocab_forward_ms;
    case GroupWork::VocabBackward: return t.vocab_backward_ms;
    case GroupWork::HeadLse: return t.head_lse_ms;
    case GroupWork::HeadBackward: return t.head_backward_ms;
    case GroupWork::EmbedForward: case GroupWork::HeadBegin: case GroupWork::HeadEnd: case GroupWork::EmbedBackward:
      return t.other_ms / 4;
    case GroupWork::GradAccum: case GroupWork::Optimizer: return 0.0;  // per float: group_update_ms
    case GroupWork::GradShare: return 0.0;  // a receive (the plan has one rank)
  }
  return 0.0;
}

// Compute time of an elementwise group over a segment's chunks: an update (AdamW at ns_per_float
// a parameter) or a GradAccum group (Note [gradient accumulation]), which moves 12 bytes a float
// (two read, one written) against AdamW's 28 (four read, three written) and is memory-bound like
// it: timed at 12/28 of AdamW's rate on the same threads.
double group_update_ms(const StepSchedule& schedule, const UnitTable& units, int g, double adamw_ns_per_float) {
  std::size_t floats = 0;  // the params (update) or grads (accumulation) chunks of the segment
  const SegmentKind counted = schedule.group_work(g) == GroupWork::Optimizer ? SegmentKind::Params : SegmentKind::Grads;
  for (const UnitUse& use : schedule.group(g))
    if (units.kind(use.unit) == counted) floats += units.bytes(use.unit) / sizeof(float);
  const double ns = schedule.group_work(g) == GroupWork::Optimizer ? adamw_ns_per_float : adamw_ns_per_float * 12 / 28;
  return floats * ns / 1e6;
}

struct PipelineResult {
  double step_ms = 0, optimizer_ms = 0;
};

// Note [plan model]: the pipeline over two steps' groups; the second step's duration.
PipelineResult pipeline(const StepSchedule& schedule, const UnitTable& units, const std::vector<std::uint64_t>& reads,
                        const std::vector<std::uint64_t>& writes, const ComputeTiming& t, OptimizerMode mode,
                        int prefetch, double read_gbps, double write_gbps) {
  const int G = schedule.group_count();
  std::vector<double> compute_end(static_cast<std::size_t>(2 * G), 0.0);
  double disk_free = 0, worker_free = 0, previous = 0, step_start = 0, optimizer_ms = 0;
  for (int i = 0; i < 2 * G; ++i) {
    const int g = i % G;
    if (g == 0) step_start = previous;
    const double read_ms = read_gbps > 0 ? static_cast<double>(reads[g]) / (read_gbps * 1e6) : 0.0;
    const double window_open = i - prefetch - 1 >= 0 ? compute_end[i - prefetch - 1] : 0.0;
    const double read_start = std::max(disk_free, window_open);
    const double read_end = read_start + read_ms;
    if (read_ms > 0) disk_free = read_end;
    // The group's write-backs share the device with the reads that follow (one disk).
    if (write_gbps > 0 && writes[g] > 0)
      disk_free = std::max(disk_free, previous) + static_cast<double>(writes[g]) / (write_gbps * 1e6);
    double start = std::max(previous, read_end);
    double ms = group_compute_ms(schedule.group_work(g), t);
    if (schedule.group_work(g) == GroupWork::GradAccum) ms = group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
    if (schedule.group_work(g) == GroupWork::Optimizer) {
      if (mode == OptimizerMode::Inline) {
        ms = group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
      } else {
        // The worker: starts when queued (after the group's reads) and when free; the training
        // thread waits for it only before the segment's next forward (Pipelined) or at the end of
        // the step (Overlapped).
        const double worker_ms = group_update_ms(schedule, units, g, t.adamw_worker_ns_per_float);
        worker_free = std::max(worker_free, std::max(previous, read_end)) + worker_ms;
        if (i >= G) optimizer_ms += worker_ms;
        if (mode == OptimizerMode::Pipelined) start = std::max(start, worker_free);
      }
    }
    compute_end[i] = start + ms;
    previous = compute_end[i];
    if (mode == OptimizerMode::Overlapped && g == G - 1) previous = std::max(previous, worker_free);
  }
  return {previous - step_start, optimizer_ms};
}

}  // namespace

OptimizerMode plan_mode(const PlanRequest& r, bool budget) {
  return r.zeroth_order ? OptimizerMode::ZerothOrder : optimizer_mode_for(r.grad_clip, budget);
}

ActivationPolicy plan_activations_resolve(ActivationPolicy activations, bool zeroth_order) {
  if (!zeroth_order) return activations;
  STRATUM_CHECK(activations == ActivationPolicy::Auto || activations == ActivationPolicy::Recompute,
                "[train] --activations ", activation_policy_name(activations),
                " keeps block internals for the backward, and --optimizer zo-sgd has none; drop one of them");
  return ActivationPolicy::Recompute;
}

UnitSet plan_unit_set(const PlanRequest& r) { return r.zeroth_order ? UnitSet::ForwardOnly : UnitSet::Training; }

UnitTable plan_units(const ParamLayout& layout, std::size_t act_floats, const PlanRequest& r) {
  STRATUM_ASSERT(r.activations != ActivationPolicy::Auto);
  const std::size_t internals = r.activations == ActivationPolicy::Offload
                                    ? Executor::internals_unit_floats(r.config, r.batch, r.seq, layout)
                                    : 0;
  return UnitTable(layout, act_floats, plan_unit_set(r), r.base_bf16 && r.lora.on(), internals,
                   r.grad_accum > 1 && !r.zeroth_order);
}

std::size_t plan_min_budget_bytes(const PlanRequest& request) {
  PlanRequest r = request;
  r.activations = plan_activations_resolve(request.activations, request.zeroth_order);
  if (r.activations == ActivationPolicy::Auto) {  // the smaller of the two it chooses from
    r.activations = ActivationPolicy::Recompute;
    const std::size_t recompute = plan_min_budget_bytes(r);
    r.activations = ActivationPolicy::Offload;
    return std::min(recompute, plan_min_budget_bytes(r));
  }
  const ParamLayout layout = ParamLayout::of(r.config, r.lora);
  const UnitTable units = plan_units(layout, Executor::activation_unit_floats(r.config, r.batch, r.seq), r);
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  const Executor streaming(pool, r.config, units, r.batch, r.seq, r.activations, plan_mode(r, true),
                           r.precision, Backend::Cpu, r.grad_accum);
  return streaming.fixed_bytes() + streaming.min_store_bytes();
}

void plan_budget_check(const PlanRequest& r, std::size_t min_budget_bytes) {
  STRATUM_CHECK(r.mem_budget_bytes == 0 || r.mem_budget_bytes >= min_budget_bytes, "[plan] --mem-budget ",
                bytes_text(static_cast<double>(r.mem_budget_bytes)), " is below the minimum of ",
                bytes_text(static_cast<double>(min_budget_bytes)), " for this model at B=", r.batch, " T=", r.seq,
                "; use --mem-budget ", (min_budget_bytes + (1 << 20) - 1) >> 20, "M or more");
}

Plan plan_make(const PlanRequest& r, const ComputeTiming& measured, double read_gbps, double write_gbps) {
  if (r.ranks > 1) {  // Note [plan ranks]: one rank's plan, then the network
    STRATUM_CHECK(r.grad_accum % r.ranks == 0, "[plan] --grad-accum ", r.grad_accum, " must be a multiple of --ranks ",
                  r.ranks, "; use --grad-accum ", (r.grad_accum + r.ranks - 1) / r.ranks * r.ranks);
    STRATUM_CHECK(r.net_gbps > 0, "[plan] --ranks ", r.ranks, " needs --net-gbps X, the network's rate in Gb/s");
    PlanRequest one = r;
    one.ranks = 1;
    one.grad_accum = r.grad_accum / r.ranks;
    Plan p = plan_make(one, measured, read_gbps, write_gbps);
    if (one.grad_accum == 1) p.grads_bytes *= 2;  // the running sum a rank receives
    const ParamLayout layout = ParamLayout::of(r.config, r.lora);
    std::uint64_t grads = 0, chunk = 0;  // the gradient copy a message chain moves, its largest message
    for (int s = 0; s < layout.segment_count(); ++s) {
      if (!layout.trainable(s)) continue;
      for (int c = 0; c < layout.segments()[s].chunk_count(); ++c) {
        const std::uint64_t bytes = layout.segments()[s].chunk_floats(c) * sizeof(float);
        grads += bytes;
        chunk = std::max(chunk, bytes);
      }
    }
    const double bytes_per_ms = r.net_gbps * 1e9 / 8 / 1e3;
    p.ranks = r.ranks;
    // Note [zero sharding]: a copy of the gradients per micro-batch (the running sums; rank P-1's
    // last one goes to the owners instead) and the owners' parameters to every other rank (a 1/P
    // share to P-1 ranks, taken in during the next forward), overlapped with the compute; then,
    // after the last backward, the running-sum chain's tail and the final hop to the owner, which
    // nothing overlaps.
    const std::uint64_t share = grads * static_cast<std::uint64_t>(r.ranks - 1) / static_cast<std::uint64_t>(r.ranks);
    p.net_sent_bytes = grads * static_cast<std::uint64_t>(one.grad_accum) + share;
    p.net_ms = static_cast<double>(p.net_sent_bytes) / bytes_per_ms;
    p.net_tail_ms = r.ranks * static_cast<double>(chunk) / bytes_per_ms;
    if (p.net_ms > p.step_ms) p.bottleneck = "network";
    p.step_ms = std::max(p.step_ms, p.net_ms) + p.net_tail_ms;
    return p;
  }
  ComputeTiming t = measured;  // a recompute runs most of the block forward again in the backward
  if (r.activations == ActivationPolicy::Recompute)
    t.layer_backward_ms += t.layer_forward_ms * plan_recompute_share(r.config, r.seq);
  const GptConfig& cfg = r.config;
  cfg.validate();
  const ParamLayout layout = ParamLayout::of(cfg, r.lora);
  const UnitTable units = plan_units(layout, Executor::activation_unit_floats(cfg, r.batch, r.seq), r);
  ThreadPool pool(r.threads);  // sizes the per-thread buffers; runs nothing
  Plan p;
  p.mode = plan_mode(r, r.mem_budget_bytes > 0);
  const Executor exec(pool, cfg, units, r.batch, r.seq, r.activations, p.mode, r.precision, Backend::Cpu,
                      r.grad_accum);
  const StepSchedule& schedule = exec.schedule();
  p.engine_bytes = exec.fixed_bytes();
  // The minimum is a streaming run's (its optimizer mode may differ from an in-RAM run's).
  const OptimizerMode streaming_mode = plan_mode(r, true);
  p.min_budget_bytes = streaming_mode == p.mode ? exec.fixed_bytes() + exec.min_store_bytes() : plan_min_budget_bytes(r);
  p.read_gbps = read_gbps;
  p.write_gbps = write_gbps;
  p.timing = measured;
  for (int u = 0; u < units.count(); ++u) {
    switch (units.kind(u)) {
      case SegmentKind::Params: p.params_bytes += units.bytes(u); break;
      case SegmentKind::Grads: case SegmentKind::GradSum: p.grads_bytes += units.bytes(u); break;
      case SegmentKind::AdamM: case SegmentKind::AdamV: p.moments_bytes += units.bytes(u); break;
      case SegmentKind::Activations: p.activation_bytes += units.bytes(u); break;
      case SegmentKind::Internals: p.internals_bytes += units.bytes(u); break;
    }
  }
  plan_budget_check(r, p.min_budget_bytes);
  const std::size_t total = units.total_bytes();
  p.streaming = r.mem_budget_bytes > 0 && total > r.mem_budget_bytes - p.engine_bytes;
  const std::size_t capacity = p.streaming ? r.mem_budget_bytes - p.engine_bytes : total;
  p.disk_bytes = r.mem_budget_bytes > 0 ? total : 0;

  // Traffic and time: the store model per prefetch depth (its write-behind depends on the depth),
  // the pipeline over each; the smallest depth within 2% of the best (deeper windows hold more).
  const int G = schedule.group_count();
  Traffic traffic;
  if (!p.streaming) {
    traffic = traffic_replay(units, schedule, capacity, -1);
    p.prefetch = 0;
    std::fill(traffic.group_read.begin(), traffic.group_read.end(), 0);
    std::fill(traffic.group_written.begin(), traffic.group_written.end(), 0);
    p.step_ms = pipeline(schedule, units, traffic.group_read, traffic.group_written, t, p.mode, 0, 0.0, 0.0).step_ms;
  } else {
    // One replay and pipeline per depth; without --prefetch, depths 0..6 for the choice.
    auto step_ms_at = [&](int depth, const Traffic& tk) {
      return pipeline(schedule, units, tk.group_read, tk.group_written, t, p.mode, depth, read_gbps, write_gbps).step_ms;
    };
    if (r.prefetch >= 0) {
      p.prefetch = r.prefetch;
      traffic = traffic_replay(units, schedule, capacity, p.prefetch);
      p.step_ms = step_ms_at(p.prefetch, traffic);
    } else {
      std::vector<Traffic> by_depth_traffic;
      std::vector<double> by_depth;
      for (int k = 0; k <= 6; ++k) {
        by_depth_traffic.push_back(traffic_replay(units, schedule, capacity, k));
        by_depth.push_back(step_ms_at(k, by_depth_traffic.back()));
      }
      const double best = *std::min_element(by_depth.begin(), by_depth.end());
      p.prefetch = 6;
      for (int k = 1; k <= 6; ++k)
        if (by_depth[k] <= best * 1.02) {
          p.prefetch = k;
          break;
        }
      traffic = std::move(by_depth_traffic[p.prefetch]);
      p.step_ms = by_depth[p.prefetch];
    }
  }
  p.read_bytes = p.streaming ? traffic.read : 0;
  p.write_bytes = p.streaming ? traffic.written : 0;
  p.peak_ram_bytes = p.engine_bytes + (p.streaming ? traffic.peak_bytes : total);

  // Where each segment lives.
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentPlace place{layout.segments()[s].name};
    for (int k = 0; k < kSegmentKindCount; ++k)
      for (int c = 0; c < units.chunk_count(s, static_cast<SegmentKind>(k)); ++c) {
        const int u = units.index(s, static_cast<SegmentKind>(k), c);
        place.bytes += units.bytes(u);
        if (!p.streaming || !traffic.evicted[u]) place.resident_bytes += units.bytes(u);
        place.read_bytes += p.streaming ? traffic.unit_read[u] : 0;
        place.write_bytes += p.streaming ? traffic.unit_written[u] : 0;
      }
    p.segments.push_back(place);
  }

  // Time.
  const std::size_t floats = segment_floats(layout);
  const double adamw_ns = p.mode == OptimizerMode::Inline ? t.adamw_inline_ns_per_float : t.adamw_worker_ns_per_float;
  p.optimizer_ms = p.mode == OptimizerMode::ZerothOrder ? 0.0 : floats * adamw_ns / 1e6;  // zo: inside the forward
  double accum_ms = 0;  // the GradAccum groups (Note [gradient accumulation])
  for (int g = 0; g < G; ++g) {
    p.compute_ms += group_compute_ms(schedule.group_work(g), t);
    if (schedule.group_work(g) == GroupWork::GradAccum)
      accum_ms += group_update_ms(schedule, units, g, t.adamw_inline_ns_per_float);
  }
  p.compute_ms += accum_ms;
  p.read_ms = read_gbps > 0 ? p.read_bytes / (read_gbps * 1e6) : 0.0;
  p.write_ms = write_gbps > 0 ? p.write_bytes / (write_gbps * 1e6) : 0.0;
  const int nv = layout.vocab_block_count();
  p.ram_step_ms = r.grad_accum * (t.other_ms + cfg.n_layer * (t.layer_forward_ms + t.layer_backward_ms) +
                                  nv * (t.vocab_forward_ms + t.vocab_backward_ms + t.head_lse_ms + t.head_backward_ms)) +
                  accum_ms + floats * t.adamw_inline_ns_per_float / 1e6;
  if (p.mode == OptimizerMode::ZerothOrder) p.ram_step_ms = p.compute_ms;  // two forward passes
  const double cpu_ms = p.mode == OptimizerMode::Inline ? p.compute_ms + p.optimizer_ms : p.compute_ms;
  struct Candidate {
    const char* name;
    double ms;
  };
  const Candidate candidates[] = {{"compute", cpu_ms}, {"read", p.read_ms}, {"write", p.write_ms},
                                  {"optimizer", p.mode == OptimizerMode::Inline ? 0.0 : p.optimizer_ms}};
  p.bottleneck = std::max_element(std::begin(candidates), std::end(candidates),
                                  [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; })->name;
  // Compute is the busiest resource but the pipeline waits on the disk for part of the step:
  // say so (the reads cannot all be hidden behind the compute next to them).
  if (p.bottleneck == std::string("compute") && p.step_ms > 1.05 * cpu_ms) p.bottleneck = "read (stalls)";
  return p;
}

ActivationChoice plan_choose_activations(const PlanRequest& request, const ComputeTiming& timing, double read_gbps,
                                         double write_gbps, std::size_t disk_free_bytes) {
  ActivationChoice choice;
  if (request.zeroth_order) {
    choice.why = "zo-sgd: no backward, so no block internals to keep";
    return choice;
  }
  if (request.mem_budget_bytes == 0) {
    choice.why = "no budget: block internals recomputed (--activations keep keeps them, if RAM allows)";
    return choice;
  }
  PlanRequest r = request;
  struct Option {
    ActivationPolicy policy;
    std::size_t min_bytes;
    Plan plan;
  };
  std::vector<Option> options;
  for (ActivationPolicy policy : {ActivationPolicy::Recompute, ActivationPolicy::Offload}) {
    r.activations = policy;
    const std::size_t min_bytes = plan_min_budget_bytes(r);
    options.push_back({policy, min_bytes, Plan{}});
    if (request.mem_budget_bytes >= min_bytes) options.back().plan = plan_make(r, timing, read_gbps, write_gbps);
  }
  const Option& recompute = options[0];
  const Option& offload = options[1];
  const bool recompute_fits = request.mem_budget_bytes >= recompute.min_bytes;
  const bool offload_fits = request.mem_budget_bytes >= offload.min_bytes;
  if (!recompute_fits && !offload_fits) plan_budget_check(request, std::min(recompute.min_bytes, offload.min_bytes));
  // Offload's files hold every layer's internals too: where they do not fit on the disk, recompute.
  const bool offload_disk = disk_free_bytes == 0 || !offload_fits || offload.plan.disk_bytes <= disk_free_bytes;
  const bool pick_offload = offload_fits && offload_disk &&
                            (!recompute_fits || offload.plan.step_ms < 0.98 * recompute.plan.step_ms);
  const Option& chosen = pick_offload ? offload : recompute;
  choice.policy = chosen.policy;
  choice.plan = chosen.plan;
  auto predicted = [&](const Option& o) {
    if (request.mem_budget_bytes < o.min_bytes) return "does not fit (minimum " + bytes_text(o.min_bytes) + ")";
    if (&o == &offload && !offload_disk)
      return "does not fit on the disk (" + bytes_text(o.plan.disk_bytes) + " of files, " +
             bytes_text(disk_free_bytes) + " free)";
    char text[96];
    std::snprintf(text, sizeof text, "%.0f ms a step", o.plan.step_ms);
    return std::string(text);
  };
  choice.why = std::string("activations ") + activation_policy_name(choice.policy) + " (auto: recompute " +
               predicted(recompute) + ", offload " + predicted(offload) + ")";
  return choice;
}

}  // namespace stratum
