// `stratum train`: flags -> TrainOptions -> train_run.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>
#include <type_traits>
#include <variant>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/train_flags.h"
#include "core/file_util.h"
#include "dist/communicator.h"
#include "stratum/error.h"
#include "train/trainer.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"

namespace stratum {

std::vector<FlagSpec> train_option_specs(const std::vector<std::string>& only) {
  const TrainSettings defaults;
  std::vector<FlagSpec> specs;
  for (const TrainOption& option : train_option_table()) {
    if (!only.empty() && std::find(only.begin(), only.end(), option.flag) == only.end()) continue;
    std::string help = option.help;
    const std::string value = train_option_text(option, defaults);
    if (*option.value_name != '\0' && !value.empty()) help += " (default " + value + ")";
    specs.push_back({option.flag, option.value_name, help});
  }
  return specs;
}

void train_options_parse(const Args& args, TrainSettings& s) {
  for (const TrainOption& option : train_option_table()) {
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) {
            *p = args.str(option.flag, *p);
          } else if constexpr (std::is_same_v<T, bool>) {
            *p = args.flag(option.flag);
          } else if constexpr (std::is_enum_v<T>) {
            if (args.has(option.flag)) train_option_enum_parse(args.str(option.flag), *p);
          } else if constexpr (std::is_same_v<T, std::uint64_t>) {
            *p = option.bytes ? args.size_bytes(option.flag, *p)
                              : static_cast<T>(args.integer(option.flag, static_cast<std::int64_t>(*p),
                                                            train_option_int_min(option), train_option_int_max(option)));
          } else if constexpr (std::is_same_v<T, double>) {
            *p = args.number(option.flag, *p);  // its range: train_run's options_check, for every caller
          } else {
            *p = static_cast<T>(args.integer(option.flag, static_cast<std::int64_t>(*p), train_option_int_min(option),
                                             train_option_int_max(option)));
          }
        },
        option.field(s));
  }
}

namespace {
// Rerunning the same command with --resume added (what a crash loop or a job scheduler's restart
// does) gives --model or the shape flags again: accepted when they describe the checkpoint's
// model, refused naming the flag, the given value and the checkpoint's otherwise.
void resume_model_check(const Args& args, const std::string& model_dir, const std::string& resume_path, bool lora) {
  bool shape_given = false;
  for (const ModelShapeFlag& row : model_shape_flags()) shape_given = shape_given || args.has(row.flag);
  if (!args.has("model") && !shape_given) return;
  model_flags_alone_check(args);
  const GptConfig have = model_read_config(checkpoint_model_dir(resume_path));
  const char* const fix = lora ? "; a resumed LoRA run continues over the base its adapters were trained on (give "
                                 "that --model, or leave it out: adapter_config.json names it)"
                               : "; a resumed run continues the checkpoint's model (leave the flag out)";
  if (args.has("model")) {
    const GptConfig given = model_read_config(model_dir);
    auto named = [](const GptConfig& c) { return c.llama() ? c.describe() : "gpt2 " + c.describe(); };  // "llama L..."
    STRATUM_CHECK(given.describe() == have.describe(), "[cli] --resume: --model ", args.str("model"), " is ",
                  named(given), " but the checkpoint was trained with ", named(have), fix);
    return;
  }
  // Each given flag read over the checkpoint's model (a Llama checkpoint's --kv-heads needs no --arch).
  for (const ModelShapeFlag& row : model_shape_flags()) {
    if (!args.has(row.flag)) continue;
    STRATUM_CHECK(!row.llama_only || have.llama(), "[cli] --resume: --", row.flag,
                  " is for --arch llama but the checkpoint's model is ", model_arch_name(have.arch), fix);
    GptConfig given = have;
    row.read(args, given);
    STRATUM_CHECK(row.text(given) == row.text(have), "[cli] --resume: --", row.flag, " is ", row.text(given),
                  " but the checkpoint was trained with ", row.text(have), fix);
  }
}

// Whether two paths name one directory, existing or not: symlinks resolved, "a/" == "a".
bool same_dir_path(const std::string& a, const std::string& b) {
  auto canonical = [](const std::string& dir, std::error_code& ec) {
    std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
    p = p.lexically_normal();
    return p.has_filename() ? p : p.parent_path();
  };
  std::error_code ec1, ec2;
  const auto pa = canonical(a, ec1), pb = canonical(b, ec2);
  return !ec1 && !ec2 && pa == pb;
}

// A job scheduler's restart of a run stopped before its first checkpoint: the command that
// started it with --resume naming its own --save directory, which holds no checkpoint yet (or does
// not exist yet). That starts the run, as the command without --resume would; a --resume naming
// anything else with no checkpoint in it is still refused (checkpoint_find).
bool resume_has_nothing_yet(const std::string& resume, const std::string& save) {
  if (save.empty() || file_exists(resume + "/manifest.json") || !same_dir_path(resume, save)) return false;
  return !dir_exists(resume) || checkpoint_list(resume).empty();
}

// With --resume, the options left out are the checkpoint's (Note [checkpoints]); those given must
// match it where they change the math (train_run checks, and resume_model_check for the model).
// The checkpoint is found and verified first (checkpoint_find: from a root, the newest that
// verifies), so a damaged newest one gives neither its options nor its model; train_run resumes
// the one found here.
void fill_from_checkpoint(const Args& args, TrainOptions& o) {
  o.resume_point = checkpoint_find(o.resume_path);
  const TrainerState& st = o.resume_point->state;
  resume_model_check(args, o.model_dir, o.resume_point->dir, st.lora_r > 0);
  // The weights are the checkpoint's; a LoRA checkpoint's adapters train over the --model base,
  // which its adapter_config.json names (the first run's --model, absolute) when it is left out.
  if (st.lora_r == 0) o.model_dir.clear();
  if (st.lora_r > 0 && o.model_dir.empty()) {
    const std::string base = adapter_base_model(o.resume_point->dir);
    STRATUM_CHECK(!base.empty() && dir_exists(base), "[train] --resume of a LoRA checkpoint continues over the "
                  "frozen base its adapters were trained on: give it with --model BASE",
                  base.empty() ? "" : " (adapter_config.json names '" + base + "', which is not a directory here)");
    o.model_dir = model_dir_resolve(base);
  }
  o.config = st.config;
  for (const TrainOption& option : train_option_table())
    if (!args.has(option.flag)) train_option_copy(option, st, o);
  const std::string root = train_checkpoint_root(o.resume_point->dir);
  if (!args.has("save")) o.save_dir = root;
  // A fork (a resume saving under another --save) is another run: it does not continue the
  // recorded log, whose records after the checkpoint it would drop (they are the original run's).
  if (!args.has("log") && !o.log_path.empty() && !o.save_dir.empty() && !same_dir_path(o.save_dir, root)) {
    o.notices += "[stratum] --save " + o.save_dir + " forks the run saved in " + root + ": not logging to its --log " +
                 o.log_path + " (give --log FILE to log this run)\n";
    o.log_path.clear();
  }
}

}  // namespace

void run_options_settle(const Args& args, TrainOptions& o) {
  const TrainSettings d;
  auto unless_given = [&](const char* flag, auto& field, const auto& value) {
    if (!args.has(flag)) field = value;
  };
  if (o.mem_budget_bytes == 0) {
    unless_given("offload-dir", o.offload_dir, d.offload_dir);
    unless_given("io", o.io_backend, d.io_backend);
    unless_given("io-block", o.io_block_bytes, d.io_block_bytes);
    unless_given("io-depth", o.io_queue_depth, d.io_queue_depth);
  }
  if (o.backend == Backend::Cpu) {
    unless_given("gpu-mem-budget", o.gpu_mem_budget_bytes, d.gpu_mem_budget_bytes);
    unless_given("adamw-on", o.adamw_on, d.adamw_on);
  }
  if (o.mem_budget_bytes == 0 && o.gpu_mem_budget_bytes == 0) unless_given("prefetch", o.prefetch, d.prefetch);
  // Options of a kind of training the run is not doing: said, not ignored (LoRA's without --lora-r
  // trained every weight instead of adapters). Given at all, their default value included.
  STRATUM_CHECK(o.lora_r > 0 || !o.lora_init_dir.empty() ||
                    !(args.has("lora-alpha") || args.has("lora-targets") || args.has("lora-rslora") ||
                      args.has("lora-dropout")),
                "[train] --lora-alpha, --lora-targets, --lora-rslora and --lora-dropout shape LoRA adapters: add "
                "--lora-r R to train adapters (or drop them to train every weight)");
  STRATUM_CHECK(!o.save_dir.empty() || !args.has("keep"),
                "[train] --keep K prunes the checkpoints under --save DIR: add --save DIR (or drop --keep)");
  for (const char* adamw_only : {"beta1", "beta2", "eps", "grad-clip"})
    STRATUM_CHECK(o.optimizer == TrainOptimizer::AdamW || !args.has(adamw_only), "[train] --", adamw_only,
                  " is AdamW's, and --optimizer zo-sgd has no moments or gradient to clip: drop it");
  STRATUM_CHECK(o.eval_every > 0 || !args.has("eval-batches"),
                "[train] --eval-batches sizes the validation of --eval-every N: add --eval-every N (or drop it)");
  STRATUM_CHECK(o.optimizer == TrainOptimizer::ZoSgd || !args.has("zo-eps"),
                "[train] --zo-eps is zo-sgd's perturbation scale: add --optimizer zo-sgd (or drop it)");
  // The run's recorded log goes on only where its directory still is (a checkpoint copied to
  // another machine): said before anything is loaded.
  if (!args.has("log") && !o.log_path.empty()) {
    const std::string parent = std::filesystem::path(o.log_path).parent_path().string();
    STRATUM_CHECK(parent.empty() || dir_exists(parent), "[cli] --resume: the run's --log file ", o.log_path,
                  " is in a directory that does not exist here: give --log FILE to log elsewhere");
  }
  STRATUM_CHECK(args.has("offload-dir") || o.offload_dir.empty() || dir_exists(o.offload_dir),
                "[cli] --resume: the checkpoint's --offload-dir ", o.offload_dir,
                " does not exist: create it, give another --offload-dir, or --mem-budget 0 to train in RAM");
  STRATUM_CHECK(o.mem_budget_bytes > 0 || o.offload_dir.empty(),
                "[cli] --offload-dir needs --mem-budget SIZE (e.g. --mem-budget 2G)");
  STRATUM_CHECK(o.mem_budget_bytes == 0 || !o.offload_dir.empty(),
                "[cli] --mem-budget needs --offload-dir DIR (a directory on a fast disk for what does not fit)");
  STRATUM_CHECK(o.mem_budget_bytes > 0 || (o.io_backend == d.io_backend && o.io_block_bytes == d.io_block_bytes &&
                                           o.io_queue_depth == d.io_queue_depth),
                "[cli] --io, --io-block and --io-depth only apply with --mem-budget SIZE");
  STRATUM_CHECK(o.mem_budget_bytes > 0 || o.gpu_mem_budget_bytes > 0 || o.prefetch == d.prefetch,
                "[cli] --prefetch only applies with --mem-budget SIZE or --gpu-mem-budget SIZE");
}

namespace {
int train_command(const std::vector<std::string>& argv, Communicator* comm);
}  // namespace

// Under mpirun (Note [mpi lifetime]) every rank runs this command; rank 0 prints, the others only
// their errors, and a rank that fails ends the whole job (no peer waits for it).
//
// Note [one refusal per job]: most refusals (a flag, a budget too small, a bad checkpoint) are
// the same on every rank, and each rank used to print its copy; the ranks mpirun then ended also
// printed the stop-signal notice. So a failing rank restores the default action of the stop
// signals (ended by mpirun, it ends quietly), and a rank other than 0 waits 2 s before it prints
// and ends the job: when rank 0 fails the same way, its line is the only one. An error of one
// rank alone reaches the terminal 2 s later.
int cmd_train(const std::vector<std::string>& argv) {
  if (!Communicator::launched_by_mpirun()) return train_command(argv, nullptr);
  const std::unique_ptr<Communicator> comm = Communicator::world();
  if (comm->size() == 1) return train_command(argv, comm.get());
  const int err = ::dup(STDERR_FILENO);  // errors still reach the terminal on every rank
  if (comm->rank() > 0 && err >= 0) {  // the others' output is rank 0's again: silenced
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDERR_FILENO);
      ::close(null);
    }
  }
  try {
    return train_command(argv, comm.get());
  } catch (const std::exception& e) {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, SIG_DFL);  // Note [one refusal per job]
    if (comm->rank() > 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    dprintf(err >= 0 ? err : STDERR_FILENO, "stratum: rank %d of %d: %s\n", comm->rank(), comm->size(), e.what());
    comm->abort(1);
  }
}

namespace {
int train_command(const std::vector<std::string>& argv, Communicator* comm) {
  Args args("train", argv,
            concat_specs(model_flag_specs(),
                         concat_specs(train_option_specs(), {
             {"trace", "FILE.json", "write a Chrome/Perfetto trace (compute, optimizer worker, I/O reads and writes)"},
             {"save", "DIR", "write checkpoints under DIR at the end (and every --save-every): DIR/step-N holds a "
                             "Hugging Face GPT-2 directory, the AdamW state and the trainer state; DIR/latest names "
                             "the newest"},
             {"resume", "DIR", "continue from a checkpoint (DIR/step-N, or DIR: its newest that verifies); options "
                               "left out are the checkpoint's"},
             {"lora-init", "DIR", "start the LoRA adapters from this PEFT adapter directory (its adapter_config.json "
                                  "gives r, alpha and the targets); default: PEFT's init from --seed"},
             {"quiet", "", "no progress bar"}})));
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum train [--model HF_DIR | --layers L --heads H --embd C --ctx N --vocab V] "
                              "--data FILE [flags]").c_str(), stdout);
    return 0;
  }
  TrainOptions o;
  o.comm = comm;
  o.model_dir = args.has("model") ? model_dir_resolve(args.str("model")) : "";
  train_options_parse(args, o);
  o.trace_path = args.str("trace");
  o.save_dir = args.str("save");
  if (const char* fault = std::getenv("STRATUM_IO_FAULT")) o.io_fault = IoFaultPlan::parse(fault);
  o.quiet = args.flag("quiet");
  if (args.has("lora-init")) {  // a PEFT directory, or a LoRA run's checkpoint (root: its newest)
    o.lora_init_dir = model_dir_resolve(args.str("lora-init"));
    o.lora_dropout_given = args.has("lora-dropout");
    o.lora_alpha_given = args.has("lora-alpha");
    o.lora_rslora_given = args.has("lora-rslora");
    checkpoint_dir_check(o.lora_init_dir, "train");
  }
  o.resume_path = args.str("resume");
  if (!o.resume_path.empty() && resume_has_nothing_yet(o.resume_path, o.save_dir)) {
    if (o.comm == nullptr || o.comm->rank() == 0)
      std::fprintf(stderr, "[stratum] --resume '%s' holds no checkpoint yet (the run was stopped before its first): "
                   "starting it there\n", o.resume_path.c_str());
    o.resume_path.clear();
  }
  // A resume's model is the checkpoint's (its shape flags are checked against it there); a new
  // run's comes from the flags (model_flags_config refuses, e.g., --kv-heads without --arch llama).
  if (!o.resume_path.empty()) fill_from_checkpoint(args, o);
  else o.config = model_flags_config(args);
  // A new model's random base is not saved, so adapters trained over it could be neither used nor
  // resumed (the checkpoint names no base).
  STRATUM_CHECK((o.lora_r == 0 && o.lora_init_dir.empty()) || !o.model_dir.empty(),
                "[train] LoRA trains adapters over a pretrained base: give it with --model HF_DIR (a new model's "
                "random weights are not saved, so its adapters could not be used or resumed)");
  run_options_settle(args, o);
  o.measure_exe = "/proc/self/exe";  // the plan's measurement runs in its own process
  o.stop_requested = stop_signals_install(
      "\n[stratum] stopping after this step (and saving a checkpoint with --save); interrupt again to quit at once\n");
  const TrainResult result = train_run(o);
  if (!result.interrupted) return 0;
  if (result.checkpoint_dir.empty()) {
    std::fprintf(stderr, "[stratum] interrupted after step %ld; nothing saved (no --save DIR)\n", result.steps_done);
    return 130;
  }
  std::fprintf(stderr, "[stratum] interrupted after step %ld: checkpoint %s; continue with: stratum train --resume %s\n",
               result.steps_done, result.checkpoint_dir.c_str(), o.save_dir.c_str());
  return 0;
}
}  // namespace

}  // namespace stratum
