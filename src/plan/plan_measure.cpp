// The planner's measurements (Note [plan calibration], Note [bounded measurement]): the
// one-layer model's compute timed on this machine, in this process or in a measuring child
// process, and the scratch directories they use; see planner.h.
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
#include <string_view>
#include <tuple>

#include "backend/backend.h"
#include "core/rng.h"
#include "model/hf_config.h"
#include "weights/model_io.h"
#include "model/param_layout.h"
#include "obs/trace_recorder.h"
#include "plan/calibration.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "core/file_util.h"
#include "store/unit_table.h"
#include "core/byte_size.h"
#include "core/process_memory.h"
#include "stratum/error.h"

namespace stratum {

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

// The measurement's own offload files (Note [bounded measurement]) go to DIR/stratum-plan-<pid>,
// so a run or another plan using DIR is not disturbed.
std::unique_ptr<OwnedDir> scratch_dir_make(const std::string& parent) {
  stale_planner_files_remove(parent);  // Note [stale plan directories]
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
        case GroupWork::Optimizer: case GroupWork::GradAccum: case GroupWork::GradShare:
        case GroupWork::VocabRows: break;  // not timed here
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

namespace {
// The one-layer model plan_measure_compute times (Note [bounded measurement]): the run's widths,
// one layer, the vocabulary cut to kMinVocabBlocks of the run's blocks. Its one layer keeps its
// internals for a run that keeps them; otherwise it recomputes them (the engine buffers of every
// other run are at least that one layer's), and the recompute's share of a forward is taken off
// the backward (ComputeTiming); zo-sgd has no backward. One micro-batch's pieces: the plan runs
// them N times.
struct MeasureModel {
  GptConfig mini;
  PlanRequest kept;
  ParamLayout layout;
  UnitTable units;

  // other: its layer of the other kind than the run's layer 0 (Note [mixed layers]).
  explicit MeasureModel(const PlanRequest& r, bool other = false)
      : mini(mini_config(r.config, other)), kept(kept_request(r)), layout(ParamLayout::of(mini, r.lora)),
        units(plan_units(layout, Executor::activation_unit_floats(mini, r.batch, r.seq, r.zeroth_order), kept)) {}
  std::unique_ptr<Executor> executor(ThreadPool& pool, const PlanRequest& r) const {
    return std::make_unique<Executor>(pool, mini, units, r.batch, r.seq, kept.activations,
                                      r.zeroth_order ? OptimizerMode::ZerothOrder : OptimizerMode::Inline,
                                      r.precision, Backend::Cpu, 1, nullptr, BlockRows{r.row_chunk, plan_mlp_rows(r)});
  }

  static GptConfig mini_config(const GptConfig& config, bool other) {
    GptConfig mini = config;
    mini.n_layer = 1;
    if (config.gemma2() || config.gemma3())  // layer 0's kind, or the other (Note [mixed layers])
      mini.layer_sliding = {static_cast<std::uint8_t>(config.layer_sliding_attention(0) != other)};
    mini.vocab_size = std::min(config.vocab_size, kMinVocabBlocks * vocab_block_rows(config));  // same block size
    return mini;
  }
  static PlanRequest kept_request(const PlanRequest& r) {
    PlanRequest kept = r;
    kept.activations = r.activations == ActivationPolicy::Keep ? ActivationPolicy::Keep : ActivationPolicy::Recompute;
    kept.grad_accum = 1;
    return kept;
  }
};
}  // namespace

std::size_t plan_measure_min_bytes(ThreadPool& pool, const PlanRequest& request) {
  const MeasureModel model(request);
  const std::unique_ptr<Executor> exec = model.executor(pool, request);
  return exec->fixed_bytes() + exec->min_store_bytes();
}

bool plan_mixed_layers(const GptConfig& config) {
  for (int l = 1; l < config.n_layer; ++l)
    if (config.layer_sliding_attention(l) != config.layer_sliding_attention(0)) return true;
  return false;
}

namespace {
// The timed passes of the one-layer model of layer 0's kind, or of the other kind (Note [mixed
// layers]), and its vocabulary blocks. Forward and backward only: the moments are never
// allocated. Under a budget the one-layer model streams through the budget like the run (Note
// [bounded measurement]); the store and the executor are gone when it returns.
struct MeasuredPasses {
  std::vector<ComputeTiming> steps;
  int vocab_blocks = 0;
};
MeasuredPasses measure_passes(ThreadPool& pool, const PlanRequest& r, const std::string& offload_dir, bool other) {
  const MeasureModel model(r, other);
  const GptConfig& mini = model.mini;
  const ParamLayout& layout = model.layout;
  std::vector<ComputeTiming> steps;
  {
    const UnitTable& units = model.units;
    std::unique_ptr<OwnedDir> scratch;  // destroyed after the store, which after the executor
    std::unique_ptr<SegmentStore> store;
    const std::unique_ptr<Executor> made = model.executor(pool, r);
    Executor& exec = *made;
    if (r.mem_budget_bytes > 0 && !offload_dir.empty()) {
      const std::size_t need = exec.fixed_bytes() + exec.min_store_bytes();
      STRATUM_CHECK(r.mem_budget_bytes >= need, "[plan] --mem-budget ", bytes_text(r.mem_budget_bytes),
                    " is below the ", bytes_text(need), " the measurement of one layer needs; raise --mem-budget");
      // Said for the directory given (the store would name its scratch subdirectory, and the
      // one-layer model's need as "this run's").
      const std::size_t free_bytes = dir_free_bytes(offload_dir, "--offload-dir");
      STRATUM_CHECK(free_bytes >= units.total_bytes(), "[plan] --offload-dir ", offload_dir, " has ",
                    bytes_text(static_cast<double>(free_bytes)), " free, and measuring one layer of the run there "
                    "already needs ", bytes_text(static_cast<double>(units.total_bytes())),
                    ": free space or choose another directory");
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
  return {std::move(steps), layout.vocab_block_count()};
}

// The median of a field over the timed passes.
double median_of(const std::vector<ComputeTiming>& steps, double ComputeTiming::*field) {
  std::vector<double> v;
  for (const ComputeTiming& t : steps) v.push_back(t.*field);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A layer's forward and backward from the timed passes: the backward alone, never below a
// forward (it multiplies twice as much), which only the noise of a tiny model's timings could
// suggest.
std::pair<double, double> layer_times(const std::vector<ComputeTiming>& steps, const PlanRequest& r) {
  const double forward = median_of(steps, &ComputeTiming::layer_forward_ms);
  double backward = median_of(steps, &ComputeTiming::layer_backward_ms);
  if (r.activations != ActivationPolicy::Keep && !r.zeroth_order)
    backward = std::max(forward, backward - forward * plan_recompute_share(r.config, r.seq));
  return {forward, backward};
}
}  // namespace

ComputeTiming plan_measure_compute(ThreadPool& pool, const PlanRequest& r, const std::string& offload_dir) {
  const MeasuredPasses passes = measure_passes(pool, r, offload_dir, false);
  const std::vector<ComputeTiming>& steps = passes.steps;
  auto med = [&](double ComputeTiming::*field) { return median_of(steps, field); };
  ComputeTiming t;
  const double blocks = passes.vocab_blocks;
  std::tie(t.layer_forward_ms, t.layer_backward_ms) = layer_times(steps, r);
  if (plan_mixed_layers(r.config))  // Note [mixed layers]
    std::tie(t.other_layer_forward_ms, t.other_layer_backward_ms) =
        layer_times(measure_passes(pool, r, offload_dir, true).steps, r);
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

namespace {
// ComputeTiming's numbers by their JSON names: plan_measurement_json writes them and
// plan_measurement_parse reads them, from this one list.
struct TimingField {
  const char* name;
  double ComputeTiming::*field;
};
constexpr TimingField kTimingFields[] = {
    {"layer_forward_ms", &ComputeTiming::layer_forward_ms},
    {"layer_backward_ms", &ComputeTiming::layer_backward_ms},
    {"other_layer_forward_ms", &ComputeTiming::other_layer_forward_ms},
    {"other_layer_backward_ms", &ComputeTiming::other_layer_backward_ms},
    {"vocab_forward_ms", &ComputeTiming::vocab_forward_ms},
    {"vocab_backward_ms", &ComputeTiming::vocab_backward_ms},
    {"head_lse_ms", &ComputeTiming::head_lse_ms},
    {"head_backward_ms", &ComputeTiming::head_backward_ms},
    {"other_ms", &ComputeTiming::other_ms},
    {"adamw_inline_ns_per_float", &ComputeTiming::adamw_inline_ns_per_float},
    {"adamw_worker_ns_per_float", &ComputeTiming::adamw_worker_ns_per_float},
};
}  // namespace

nlohmann::json plan_measurement_json(const PlanMeasurement& m) {
  nlohmann::json j = {{"read_gbps", m.read_gbps},
                      {"write_gbps", m.write_gbps},
                      {"disk_from_cache", m.disk_from_cache},
                      {"peak_rss_bytes", m.peak_rss_bytes}};
  for (const TimingField& f : kTimingFields) j[f.name] = m.timing.*f.field;
  return j;
}

namespace {
PlanMeasurement plan_measurement_parse(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    PlanMeasurement m;
    for (const TimingField& f : kTimingFields) m.timing.*f.field = j.at(f.name).get<double>();
    m.read_gbps = j.at("read_gbps").get<double>();
    m.write_gbps = j.at("write_gbps").get<double>();
    m.disk_from_cache = j.at("disk_from_cache").get<bool>();
    m.peak_rss_bytes = j.at("peak_rss_bytes").get<std::size_t>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[plan] the measurement process printed something unexpected (", e.what(), ")");
  }
}

// child: the measuring process, stopped (SIGINT) when a signal interrupts the read: a stop
// request (stop_signals_install, the one handler a plan or train process has) that Ctrl-C at a
// terminal would have sent it too, but kill(pid) does not.
// *forwarded is set when it was.
std::string read_all(int fd, pid_t child, bool* forwarded) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) {
      ::kill(child, SIGINT);
      *forwarded = true;
      continue;
    }
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
  stale_planner_files_remove(tmp.string());  // Note [stale plan directories]
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
                                   "--mlp-rows", std::to_string(plan_mlp_rows(r)),
                                   "--row-chunk", std::to_string(r.row_chunk),
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
  bool forwarded = false;  // a stop signal came to this process and went on to the child
  const std::string text = read_all(out[0], pid, &forwarded);  // small outputs: one pipe drained after the other
  std::string errors = read_all(err[0], pid, &forwarded);
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {  // stopped (Ctrl-C) or killed: what it wrote goes (Note [stale plan directories])
    if (!co.offload_dir.empty()) stale_planner_files_remove(co.offload_dir);
    // The signal the child died of is the forwarded SIGINT, whatever this process got.
    STRATUM_CHECK(!forwarded, "[plan] stopped by a signal before the measurement finished; its files are removed");
    STRATUM_FAIL("[plan] the measurement process was killed by signal ", WTERMSIG(status), " (",
                 strsignal(WTERMSIG(status)), ") before it finished; its files are removed");
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

}  // namespace stratum
