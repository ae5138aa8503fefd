// `stratum` entry point: dispatches to subcommands, turns errors into one line + exit code.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/commands.h"
#include "core/printable.h"
#include "stratum/error.h"

namespace {
const char* kUsage =
    "usage: stratum <command> [flags]    (stratum <command> --help for its flags)\n"
    "  train     train or fine-tune a GPT-2 or Llama-family model (all weights, LoRA adapters or zeroth-order)\n"
    "  generate  sample text from a model\n"
    "  eval      a model's (or adapter's) loss and perplexity over a data file, in RAM or under a budget\n"
    "  prepare   tokenize a text corpus (or a JSON Lines file's documents) into a token file\n"
    "  info      describe a model directory, safetensors file or token file\n"
    "  plan      show, before running, where a training run's state will live, its I/O and predicted step time\n"
    "  merge     fold a LoRA adapter into its base model (a Hugging Face directory)\n"
    "  verify    check a checkpoint (or every checkpoint under a --save directory) against its checksums\n"
    "  report    render a training log (--log) as an SVG: loss, tier traffic, step time and stall\n"
    "  version   print the version\n";

int run(const std::string& command, const std::vector<std::string>& args) {
  if (command == "train") return stratum::cmd_train(args);
  if (command == "generate") return stratum::cmd_generate(args);
  if (command == "prepare") return stratum::cmd_prepare(args);
  if (command == "info") return stratum::cmd_info(args);
  if (command == "report") return stratum::cmd_report(args);
  if (command == "plan") return stratum::cmd_plan(args);
  if (command == "verify") return stratum::cmd_verify(args);
  if (command == "merge") return stratum::cmd_merge(args);
  if (command == "eval") return stratum::cmd_eval(args);
  if (command == "version" || command == "--version") {
    std::printf("stratum %s\nbackends: %s\n", STRATUM_VERSION, stratum::backend_inventory().c_str());
    return 0;
  }
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "stratum: [cli] unknown command '%s'; run 'stratum --help' for the list\n", command.c_str());
  return 2;
}

// A progress bar may be mid-line on a terminal: start the error on a fresh line.
void end_progress_line() {
  if (::isatty(STDERR_FILENO) == 1) std::fputs("\n", stderr);
}
}  // namespace

int main(int argc, char** argv) {
  stratum::backend_prepare_process(argv);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    const int code = run(command, args);
    // What a command printed must have reached its destination: generate, info or verify into a
    // full disk (or /dev/full) exited 0 with nothing written.
    if (const std::string failed = stratum::stdout_flush(); !failed.empty()) {
      std::fprintf(stderr, "stratum: [cli] writing the output failed: %s; the output is incomplete\n", failed.c_str());
      return code == 0 ? 1 : code;
    }
    return code;
  } catch (const stratum::BugError& e) {
    end_progress_line();
    std::fprintf(stderr, "stratum: %s (please report this)\n", stratum::printable_text(e.what()).c_str());
    return 70;
  } catch (const stratum::Error& e) {
    end_progress_line();
    std::fprintf(stderr, "stratum: %s\n", stratum::printable_text(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "stratum: [core.memory] out of memory; reduce --batch, --seq or the model size\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stratum: [internal] %s\n", e.what());
    return 70;
  }
}
