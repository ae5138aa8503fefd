// `stratum generate`: flags -> GenerateOptions -> generate_run, streaming text to stdout.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "infer/generator.h"
#include "stratum/error.h"
#include "train/checkpoint.h"

namespace stratum {

int cmd_generate(const std::vector<std::string>& argv) {
  Args args("generate", argv,
            {{"model", "DIR", "Hugging Face GPT-2 directory (required)"},
             {"prompt", "TEXT", "text to continue (default: start from <|endoftext|>)"},
             {"max-tokens", "N", "tokens to generate (default 64)"},
             {"temperature", "X", "sampling temperature; 0 = greedy (default 1.0)"},
             {"top-k", "K", "sample among the K most likely tokens; 0 = all (default 0)"},
             {"seed", "N", "sampling seed (default 1337)"},
             {"tokenizer", "DIR", "BPE files if the model directory has none"},
             {"threads", "N", "worker threads (default: all CPUs)"},
             {"no-stop", "", "keep going past <|endoftext|>"}});
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum generate --model DIR --prompt TEXT [flags]").c_str(), stdout);
    return 0;
  }
  GenerateOptions o;
  o.model_dir = checkpoint_model_dir(args.str("model"));
  STRATUM_CHECK(!o.model_dir.empty(), "[cli] --model DIR is required for 'stratum generate'");
  o.prompt = args.str("prompt");
  o.max_tokens = static_cast<int>(args.integer("max-tokens", 64, 0, 1000000));
  o.temperature = args.number("temperature", 1.0);
  o.top_k = static_cast<int>(args.integer("top-k", 0, 0, 1 << 24));
  o.seed = static_cast<std::uint64_t>(args.integer("seed", 1337, 0, INT64_MAX));
  o.tokenizer_dir = args.str("tokenizer");
  o.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  o.stop_at_eot = !args.flag("no-stop");
  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  GenerateResult r = generate_run(o, [](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "[stratum] generated %zu tokens at %.1f tokens/s\n", r.tokens.size(), r.tokens_per_s);
  return 0;
}

}  // namespace stratum
