// `stratum train`: flags -> TrainOptions -> train_run.
#include <cstdio>
#include <cstdlib>

#include "cli/args.h"
#include "cli/commands.h"
#include "stratum/error.h"
#include "train/trainer.h"

namespace stratum {

int cmd_train(const std::vector<std::string>& argv) {
  Args args("train", argv,
            concat_specs(model_flag_specs(),
                         {{"data", "FILE", "training data: text (with --tokenizer), .bin uint16 tokens or llm.c shard"},
             {"val-data", "FILE", "validation data (default: hold out the last 5% when --eval-every > 0)"},
             {"tokenizer", "DIR", "GPT-2 BPE files (encoder.json + vocab.bpe or vocab.json + merges.txt)"},
             {"batch", "B", "sequences per step (default 4)"},
             {"seq", "T", "tokens per sequence (default 64)"},
             {"steps", "S", "optimizer steps (default 100)"},
             {"lr", "X", "peak learning rate (default 6e-4)"},
             {"lr-schedule", "NAME", "constant | cosine (default cosine)"},
             {"warmup", "N", "linear warmup steps (default 0)"},
             {"min-lr", "X", "final learning rate of the cosine schedule (default 0)"},
             {"beta1", "X", "AdamW beta1 (default 0.9)"},
             {"beta2", "X", "AdamW beta2 (default 0.95)"},
             {"eps", "X", "AdamW epsilon (default 1e-8)"},
             {"weight-decay", "X", "AdamW decoupled weight decay on weights and embeddings (default 0.1)"},
             {"grad-clip", "X", "clip the global gradient norm to X; 0 = off (default 1.0)"},
             {"seed", "N", "initialisation and shuffling seed (default 1337)"},
             {"shuffle", "", "visit batches in a seeded random order each epoch"},
             {"log", "FILE.jsonl", "write one JSON object per step"},
             {"trace", "FILE.json", "write a Chrome/Perfetto trace (compute, optimizer worker, I/O reads and writes)"},
             {"save", "DIR", "write a Hugging Face GPT-2 directory at the end (and every --save-every)"},
             {"save-every", "N", "also save every N steps (default 0 = end only)"},
             {"eval-every", "N", "validation loss every N steps (default 0 = off)"},
             {"eval-batches", "N", "batches per validation (default 4)"},
             {"activations", "MODE", "recompute (keep block inputs only, default) | keep (every block's "
                                     "internals: faster, more memory, same bits)"},
             {"mem-budget", "SIZE", "bound all engine memory (params, grads, moments, activations) to SIZE, e.g. "
                                    "512M or 4G; what does not fit is streamed from --offload-dir (default: all in RAM)"},
             {"offload-dir", "DIR", "directory on a fast disk (NVMe) for state that does not fit --mem-budget"},
             {"prefetch", "K", "with --mem-budget: schedule groups loaded ahead of the one computing (default: the plan's choice, see stratum plan)"},
             {"io", "BACKEND", "with --mem-budget: auto (io_uring, else threads) | uring | threads (default auto)"},
             {"io-block", "SIZE", "with --mem-budget: I/O block size, a multiple of 4K (default 1M; see bench/io_sweep)"},
             {"io-depth", "N", "with --mem-budget: I/O blocks in flight (default 16)"},
             {"threads", "N", "worker threads (default: STRATUM_THREADS or all CPUs)"},
             {"quiet", "", "no progress bar"}}));
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum train [--model HF_DIR | --layers L --heads H --embd C --ctx N --vocab V] "
                              "--data FILE [flags]").c_str(), stdout);
    return 0;
  }
  TrainOptions o;
  o.model_dir = args.str("model");
  o.config = model_flags_config(args);
  o.data_path = args.str("data");
  o.val_data_path = args.str("val-data");
  o.tokenizer_dir = args.str("tokenizer");
  o.batch = static_cast<int>(args.integer("batch", 4, 1, 65536));
  o.seq = static_cast<int>(args.integer("seq", 64, 1, 1 << 20));
  o.steps = static_cast<long>(args.integer("steps", 100, 1, 1000000000));
  o.lr.max_lr = args.number("lr", 6e-4);
  o.lr.kind = lr_schedule_parse(args.str("lr-schedule", "cosine"));
  o.lr.warmup_steps = static_cast<long>(args.integer("warmup", 0, 0, 1000000000));
  o.lr.min_lr = args.number("min-lr", 0.0);
  o.beta1 = args.number("beta1", 0.9);
  o.beta2 = args.number("beta2", 0.95);
  o.eps = args.number("eps", 1e-8);
  o.weight_decay = args.number("weight-decay", 0.1);
  o.grad_clip = args.number("grad-clip", 1.0);
  o.seed = static_cast<std::uint64_t>(args.integer("seed", 1337, 0, INT64_MAX));
  o.shuffle = args.flag("shuffle");
  o.log_path = args.str("log");
  o.trace_path = args.str("trace");
  o.save_dir = args.str("save");
  o.save_every = static_cast<long>(args.integer("save-every", 0, 0, 1000000000));
  o.eval_every = static_cast<long>(args.integer("eval-every", 0, 0, 1000000000));
  o.eval_batches = static_cast<int>(args.integer("eval-batches", 4, 1, 1000000));
  const std::string activations = args.str("activations", "recompute");
  STRATUM_CHECK(activations == "recompute" || activations == "keep",
                "[cli] --activations must be 'recompute' or 'keep', got '", activations, "'");
  o.keep_activations = activations == "keep";
  o.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  o.mem_budget_bytes = args.has("mem-budget") ? args.size_bytes("mem-budget", 0) : 0;
  STRATUM_CHECK(!args.has("mem-budget") || o.mem_budget_bytes > 0, "[cli] --mem-budget must be > 0, e.g. 512M");
  o.offload_dir = args.str("offload-dir");
  STRATUM_CHECK(o.mem_budget_bytes > 0 || o.offload_dir.empty(),
                "[cli] --offload-dir needs --mem-budget SIZE (e.g. --mem-budget 2G)");
  STRATUM_CHECK(o.mem_budget_bytes == 0 || !o.offload_dir.empty(),
                "[cli] --mem-budget needs --offload-dir DIR (a directory on a fast disk for what does not fit)");
  STRATUM_CHECK(o.mem_budget_bytes > 0 || !(args.has("prefetch") || args.has("io") || args.has("io-block") ||
                                              args.has("io-depth")),
                "[cli] --prefetch, --io, --io-block and --io-depth only apply with --mem-budget SIZE");
  o.io_block_bytes = args.size_bytes("io-block", std::size_t{1} << 20);
  STRATUM_CHECK(o.io_block_bytes >= 4096 && o.io_block_bytes % 4096 == 0 && o.io_block_bytes <= (std::size_t{1} << 30),
                "[cli] --io-block must be a multiple of 4K between 4K and 1G, got ", o.io_block_bytes, " bytes");
  o.io_queue_depth = static_cast<int>(args.integer("io-depth", 16, 1, 1024));
  o.prefetch = static_cast<int>(args.integer("prefetch", -1, 0, 64));
  o.io_backend = io_backend_parse(args.str("io", "auto"));
  if (const char* fault = std::getenv("STRATUM_IO_FAULT")) o.io_fault = IoFaultPlan::parse(fault);
  o.quiet = args.flag("quiet");
  o.measure_exe = "/proc/self/exe";  // the plan's measurement runs in its own process
  train_run(o);
  return 0;
}

}  // namespace stratum
