// `stratum eval`: the mean loss and perplexity of a model (and a LoRA adapter) over a data file,
// forward passes only, in RAM or streamed under a budget (Note [evaluate only] in train/trainer.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/train_flags.h"
#include "stratum/error.h"
#include "train/trainer.h"
#include "weights/model_io.h"

namespace stratum {

int cmd_eval(const std::vector<std::string>& argv) {
  // The option table's rows that say what is evaluated and where it runs (Note [option table]).
  const std::vector<std::string> shared = {"data", "tokenizer", "batch", "seq", "precision", "row-chunk",
                                           "threads", "mem-budget", "offload-dir", "prefetch", "io", "io-block",
                                           "io-depth", "backend", "gpu-mem-budget"};
  Args args("eval", argv,
            concat_specs({{"model", "DIR", "Hugging Face model directory, or a checkpoint root (required)"},
                          {"adapter", "DIR", "a PEFT LoRA adapter directory (e.g. a stratum train --lora-r "
                                             "checkpoint) applied to --model"},
                          {"batches", "N", "evaluate the first N batches of --data (default: all of them)"}},
                         train_option_specs(shared)));
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum eval --model DIR [--adapter DIR] --data FILE [--batch B --seq T] [flags]\n"
                              "  --batch defaults to 1 and --seq to the model's context (at most 1024) here")
                   .c_str(),
               stdout);
    return 0;
  }
  TrainOptions o;
  STRATUM_CHECK(args.has("model"), "[cli] --model DIR is required for 'stratum eval'");
  o.model_dir = model_dir_resolve(args.str("model"));
  checkpoint_dir_check(o.model_dir, "eval");  // Note [checked reads]
  train_options_parse(args, o);
  if (args.has("adapter")) {  // a PEFT directory, or a LoRA run's checkpoint (root: its newest)
    o.lora_init_dir = model_dir_resolve(args.str("adapter"));
    checkpoint_dir_check(o.lora_init_dir, "eval");
  }
  o.config = model_read_config(o.model_dir);
  if (!args.has("batch")) o.batch = 1;
  if (!args.has("seq")) o.seq = std::min(o.config.context(o.backend), 1024);
  o.eval_batches = static_cast<int>(args.integer("batches", 1000000, 1, 1000000));
  o.evaluate_only = true;
  o.optimizer = TrainOptimizer::ZoSgd;  // the engine of forward passes: no gradients, no moments
  o.steps = 1;
  o.quiet = true;
  run_options_settle(args, o);
  o.measure_exe = "/proc/self/exe";  // the plan's measurement runs in its own process
  o.stop_requested = stop_signals_install("\n[stratum] stopping the evaluation; interrupt again to quit at once\n");
  const TrainResult r = train_run(o);
  if (r.interrupted) {
    std::fprintf(stderr, "[stratum] evaluation interrupted; no result\n");
    return 130;
  }
  std::printf("eval %s%s%s on %s: loss %.6f, perplexity %.4f over %d batches of %dx%d (%zu targets)\n",
              o.model_dir.c_str(), o.lora_init_dir.empty() ? "" : " + ", o.lora_init_dir.c_str(), o.data_path.c_str(),
              r.final_val_loss, std::exp(static_cast<double>(r.final_val_loss)), r.eval_batches, o.batch, o.seq,
              r.eval_targets);
  const std::string problem = stdout_flush();
  STRATUM_CHECK(problem.empty(), "[eval] could not write the result to stdout: ", problem);
  return 0;
}

}  // namespace stratum
