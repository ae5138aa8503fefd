// Helpers shared by the integration tests: temp directories, running the stratum binary,
// reading golden safetensors into vectors.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/file_util.h"
#include "data/token_file.h"
#include "formats/safetensors.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "train/checkpoint.h"
#include "weights/model_io.h"

namespace stratum::testing {

// GPT-2 small's shape (L12 H12 C768 ctx1024 V50257), the benchmarks' model.
inline GptConfig gpt2_small_config() {
  GptConfig cfg;
  cfg.n_layer = 12;
  cfg.n_head = 12;
  cfg.n_embd = 768;
  cfg.n_ctx = 1024;
  cfg.vocab_size = 50257;
  return cfg;
}

inline std::string source_path(const std::string& rel) { return std::string(STRATUM_SOURCE_DIR) + "/" + rel; }

inline std::string shared_data(const std::string& name) {
  const char* env = std::getenv("STRATUM_SHARED_DATA");
  return (env ? std::string(env) : source_path("../shared/data")) + "/" + name;
}

// A fresh directory under /tmp, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/stratum_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string output;  // stdout
  std::string errors;  // stderr
};

// Runs the stratum binary with `args` (shell-quoted by the caller where needed); with
// kill_after_s > 0 it is killed (exit 137) if it runs longer, for tests of runs that must not wait.
inline CommandResult run_stratum(const std::string& args, int kill_after_s = 0) {
  TempDir dir;
  const std::string cmd = (kill_after_s > 0 ? "timeout -s KILL " + std::to_string(kill_after_s) + " " : std::string()) +
                          std::string(STRATUM_BINARY) + " " + args + " >" + dir.file("out") + " 2>" + dir.file("err");
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.output = file_read_all(dir.file("out"));
  r.errors = file_read_all(dir.file("err"));
  return r;
}

// Sets an environment variable for the scope (child processes started meanwhile inherit it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// The stratum binary started in the background (for signals): stdout and stderr go to files in
// its own temporary directory. wait() reaps it; the destructor kills and reaps one still running.
// launcher: a command line before the binary ("mpirun -np 2 "), exec'd in its place.
// A tmpfs of `size` ("4m") mounted at `dir` (created) for a full-disk test, unmounted when this
// goes; mounted() is false where this process may not mount (not root, or a container without
// the capability): the test skips.
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, const std::string& size) : dir_(dir) {
    std::filesystem::create_directories(dir);
    mounted_ = ::geteuid() == 0 &&
               std::system(("mount -t tmpfs -o size=" + size + " tmpfs '" + dir + "' 2>/dev/null").c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) {
      [[maybe_unused]] const int rc = std::system(("umount '" + dir_ + "'").c_str());
    }
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

class StratumProcess {
 public:
  explicit StratumProcess(const std::string& args, const std::string& launcher = "") {
    const std::string cmd = "exec " + launcher + std::string(STRATUM_BINARY) + " " + args + " >" + dir_.file("out") +
                            " 2>" + dir_.file("err");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~StratumProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  StratumProcess(const StratumProcess&) = delete;
  StratumProcess& operator=(const StratumProcess&) = delete;

  void signal(int sig) const { ::kill(pid_, sig); }
  std::string output_so_far() const {
    return file_exists(dir_.file("out")) ? file_read_all(dir_.file("out")) : std::string();
  }
  pid_t pid() const { return pid_; }
  bool running() {
    if (reaped_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
    finish(status);
    return false;
  }
  CommandResult wait() {
    if (!reaped_) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      finish(status);
    }
    return result_;
  }

 private:
  void finish(int status) {
    reaped_ = true;
    result_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result_.output = file_read_all(dir_.file("out"));
    result_.errors = file_read_all(dir_.file("err"));
  }

  TempDir dir_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  CommandResult result_;
};

// Writes `count` seeded random token ids < vocab as a raw little-endian uint16 file (nanoGPT .bin)
// at `path` and returns the path.
inline std::string write_random_tokens(const std::string& path, int count, int vocab, unsigned seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  std::string bytes;
  for (int i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto t = static_cast<std::uint16_t>((state >> 33) % static_cast<std::uint64_t>(vocab));
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  file_write_atomic(path, bytes);
  return path;
}

// A masked shard (Note [loss mask]) of `count` random ids below `vocab`: documents of a prompt
// (1..40 tokens, no loss targets) and an answer (1..12 tokens); returns path.
inline std::string write_masked_tokens(const std::string& path, int count, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> tokens;
  while (static_cast<int>(tokens.size()) < count) {
    const int prompt = 1 + static_cast<int>(rng() % 40), answer = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < prompt + answer && static_cast<int>(tokens.size()) < count; ++i) {
      const auto id = static_cast<std::int32_t>(rng() % static_cast<unsigned>(vocab));
      tokens.push_back(i < prompt ? token_no_loss(id) : id);
    }
  }
  token_file_write_masked(path, tokens);
  return path;
}

inline std::vector<float> golden_f32(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsTensorInfo* t = file.find(name);
  if (t == nullptr) throw std::runtime_error("golden tensor missing: " + name);
  std::vector<float> out(static_cast<std::size_t>(t->numel()));
  file.read_f32(*t, out.data());
  return out;
}

// Per tensor of the model saved in `saved_dir`, the largest |saved - reference| against the
// reference's "final.<HF name>" tensor (in tensor order); also the model's params hash.
struct SavedVsReference {
  std::vector<std::pair<std::string, double>> max_error;  // (slot name, largest error)
  std::uint64_t params_hash = 0;
};
inline SavedVsReference saved_vs_reference(const std::string& saved_dir, const SafetensorsFile& ref) {
  const GptConfig cfg = model_read_config(saved_dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  RamSegmentStore store(layout);
  model_load_weights(saved_dir, layout, store);
  SavedVsReference out;
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentChunksHold params(store, s, SegmentKind::Params, Access::Read);
    for (const auto& t : layout.segments()[s].tensors) {
      const std::vector<float> expected = golden_f32(ref, "final." + layout.hf_name(t));
      double max_err = 0.0;
      for (std::size_t i = 0; i < t.numel; ++i)
        max_err = std::max(max_err, std::abs(static_cast<double>(params.tensor(t)[i]) - expected[t.hf_first() + i]));
      out.max_error.emplace_back(t.name, max_err);
    }
  }
  out.params_hash = model_params_hash(layout, store);
  return out;
}

// The "params hash" a finished run prints on stderr (the last one; empty when it printed none).
inline std::string params_hash_of(const std::string& errors) {
  const std::string key = "params hash ";
  const std::size_t at = errors.rfind(key);
  return at == std::string::npos ? std::string() : errors.substr(at + key.size(), 16);
}

// What in a zo-sgd run's --log disagrees with a reference_zo-style file (empty: nothing): per step
// the loss against (L+ + L-) / 2 (1e-5) and the logged grad_norm against |g| (2e-3; the
// tolerances are explained in tests/zo_train_test.cpp); largest_dg gets the largest |g| error.
inline std::string zo_log_mismatch(const SafetensorsFile& ref, const std::vector<nlohmann::json>& log,
                                   double* largest_dg) {
  const auto plus = golden_f32(ref, "zo_loss_plus");
  const auto minus = golden_f32(ref, "zo_loss_minus");
  const auto grads = golden_f32(ref, "zo_grads");
  if (log.size() != plus.size()) return "the log has " + std::to_string(log.size()) + " steps, the reference " +
                                        std::to_string(plus.size());
  *largest_dg = 0.0;
  std::string out;
  for (std::size_t i = 0; i < log.size(); ++i) {
    const double loss = log[i]["loss"].get<double>(), g = log[i]["grad_norm"].get<double>();
    const double dg = std::abs(g - std::abs(static_cast<double>(grads[i])));
    *largest_dg = std::max(*largest_dg, dg);
    if (std::abs(loss - 0.5 * (plus[i] + minus[i])) > 1e-5 || dg > 2e-3)
      out += "step " + std::to_string(i + 1) + ": loss " + std::to_string(loss) + ", |g| " + std::to_string(g) + "; ";
  }
  return out;
}

// What goes wrong when `train_command` (a stratum train command line) runs streamed under
// `budget_bytes` through offload_dir at each prefetch depth (empty: every run succeeded,
// streamed and printed want_hash, the in-RAM run's params hash).
inline std::string streamed_runs_mismatch(const std::string& train_command, std::size_t budget_bytes,
                                          const std::string& offload_dir, const std::string& want_hash,
                                          std::initializer_list<int> prefetch_depths) {
  std::string out;
  for (int prefetch : prefetch_depths) {
    const auto r = run_stratum(train_command + " --mem-budget " + std::to_string(budget_bytes) + " --offload-dir " +
                               offload_dir + " --prefetch " + std::to_string(prefetch));
    const std::string at = "prefetch " + std::to_string(prefetch) + ": ";
    if (r.exit_code != 0) out += at + "exit " + std::to_string(r.exit_code) + ": " + r.errors + "; ";
    else if (params_hash_of(r.errors) != want_hash) out += at + "hash " + params_hash_of(r.errors) + "; ";
    else if (r.errors.find("read 0 bytes") != std::string::npos) out += at + "did not stream; ";
  }
  return out;
}

// A store for `units`: in RAM (depth < 0), or tiered under budget_bytes in dir with prefetch
// depth `depth`.
inline std::unique_ptr<SegmentStore> store_in_ram_or_under(const UnitTable& units, int depth, std::size_t budget_bytes,
                                                          const std::string& dir) {
  if (depth < 0) return std::make_unique<RamSegmentStore>(units);
  TieredStoreOptions so;
  so.budget_bytes = budget_bytes;
  so.offload_dir = dir;
  so.prefetch_depth = depth;
  return std::make_unique<TieredSegmentStore>(units, so);
}

// The first batch (B, T) of a golden directory's tokens.bin: inputs and the targets one token on.
struct GoldenBatch {
  std::vector<std::int32_t> inputs, targets;
};
inline GoldenBatch golden_batch(const std::string& dir, int B, int T) {
  const auto tokens = token_file_read(dir + "/tokens.bin").tokens;
  const std::size_t n = static_cast<std::size_t>(B) * T;
  return {std::vector<std::int32_t>(tokens.begin(), tokens.begin() + n),
          std::vector<std::int32_t>(tokens.begin() + 1, tokens.begin() + n + 1)};
}

// Leftovers of unfinished writes (".tmp." names) under a checkpoint root.
inline int checkpoint_temporaries(const std::string& root) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

// Crash rounds (Note [checkpoints]): each round runs command(root, run) (a fresh run saving a
// checkpoint every step into `root`, or, once root holds a checkpoint (with or without `latest`:
// a kill can land between the two), its resume; run counts every
// start) and SIGKILLs it at a random moment (uniform in [0.05, 0.7] x run_ms) until one run
// finishes; that run's params hash must be want_hash, `stratum verify root` must pass and no
// temporaries may be left. Rounds go on until `kills` kills have landed. problem: the failures
// (empty when every round was exact); roots are work/ck0, ck1, ...
struct CrashRounds {
  int kills = 0, runs = 0, rounds = 0;
  std::string last_root, problem;
};
inline CrashRounds crash_rounds(const std::string& work, double run_ms, const std::string& want_hash, int kills,
                                const std::function<std::string(const std::string& root, int run)>& command) {
  CrashRounds c;
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> delay(0.05 * run_ms, 0.7 * run_ms);
  while ((c.kills < kills || c.rounds == 0) && c.problem.empty()) {
    c.last_root = work + "/ck" + std::to_string(c.rounds);
    CommandResult last;
    for (;;) {
      if (++c.runs >= 300) return c.problem = "no progress after 300 runs", c;
      StratumProcess p(command(c.last_root, c.runs));
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(delay(rng));
      while (c.kills < kills && std::chrono::steady_clock::now() < until && p.running())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (c.kills < kills && p.running()) {
        p.signal(SIGKILL);
        if (p.wait().exit_code == 128 + SIGKILL) {
          ++c.kills;
          continue;
        }
      }
      last = p.wait();
      break;
    }
    ++c.rounds;
    const std::string round = "round " + std::to_string(c.rounds) + ": ";
    if (last.exit_code != 0) c.problem += round + "a resumed run failed: " + last.errors;
    else if (params_hash_of(last.errors) != want_hash) c.problem += round + "hash " + params_hash_of(last.errors);
    const CommandResult verified = run_stratum("verify '" + c.last_root + "'");
    if (verified.exit_code != 0) c.problem += round + "verify: " + verified.output + verified.errors;
    if (checkpoint_temporaries(c.last_root) != 0) c.problem += round + "temporaries left";
  }
  return c;
}

// DIR's model as a bf16 checkpoint in OUT: config.json copied, every weight (shards too) rounded
// into one model.safetensors as bf16 (nearest even, as PyTorch's .to(torch.bfloat16)).
inline void bf16_model_copy(const std::string& dir, const std::string& out) {
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(dir + "/config.json", out + "/config.json");
  std::vector<std::vector<std::uint16_t>> data;
  std::vector<SafetensorsWriteEntry> entries;
  for (const std::string& path : model_weight_files(dir, nullptr)) {  // shards into one file
    const SafetensorsFile in = SafetensorsFile::open(path);
    for (const auto& info : in.tensors()) {
      std::vector<float> f(static_cast<std::size_t>(info.numel()));
      in.read_f32(info, f.data());
      std::vector<std::uint16_t> b(f.size());
      for (std::size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
      data.push_back(std::move(b));
      entries.push_back({info.name, DType::BF16, info.shape, nullptr});
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].data = data[i].data();
  safetensors_write(out + "/model.safetensors", entries, {{"format", "pt"}});
}

// The stratum train flags of a golden AdamW run (a train_args.json / lora_args.json).
inline std::string train_flags(const nlohmann::json& a) {
  std::string f;
  for (const char* k : {"batch", "seq", "steps", "warmup"}) f += std::string(" --") + k + " " + std::to_string(a[k].get<long>());
  for (const char* k : {"lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"}) {
    std::string name = k;
    for (auto& c : name) c = c == '_' ? '-' : c;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", a[k].get<double>());
    f += " --" + name + " " + buf;
  }
  return f + " --lr-schedule " + a["lr_schedule"].get<std::string>();
}

// The stratum train flags of a golden zeroth-order run (a reference's zo_args metadata).
inline std::string zo_flags(const nlohmann::json& a) {
  char flags[512];
  std::snprintf(flags, sizeof flags,
                " --batch %d --seq %d --steps %d --lr %.17g --lr-schedule %s --warmup %d --min-lr %.17g "
                "--zo-eps %.17g --weight-decay %.17g --seed %llu --optimizer zo-sgd --threads 2 --quiet",
                a["batch"].get<int>(), a["seq"].get<int>(), a["steps"].get<int>(), a["lr"].get<double>(),
                a["lr_schedule"].get<std::string>().c_str(), a["warmup"].get<int>(), a["min_lr"].get<double>(),
                a["zo_eps"].get<double>(), a["weight_decay"].get<double>(),
                static_cast<unsigned long long>(a["seed"].get<std::uint64_t>()));
  return flags;
}

// One JSON object per line (a --log file).
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A trainer state with the given options and the smallest valid model and data fields (format
// tests: the JSON round trip, version checks).
inline TrainerState trainer_state_minimal(const TrainSettings& settings = {}) {
  TrainerState state;
  static_cast<TrainSettings&>(state) = settings;
  if (state.data_path.empty()) state.data_path = "/data/tokens.bin";
  state.step = 1;
  state.config.n_layer = 1;
  state.config.n_head = 1;
  state.config.n_embd = 8;
  state.config.n_ctx = 8;
  state.config.vocab_size = 16;
  state.train_tokens = 100;
  return state;
}

}  // namespace stratum::testing
