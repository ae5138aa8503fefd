// `stratum generate`: flags -> GenerateOptions -> generate_run. One prompt streams its text (or,
// with --output-ids, prints the generated ids); --prompts FILE prints one JSON line per prompt.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "data/chat_template.h"
#include "model/hf_config.h"
#include "train/train_options.h"
#include "core/file_util.h"
#include "infer/generator.h"
#include "stratum/error.h"
#include "train/checkpoint.h"

namespace stratum {

namespace {
// flag: where the ids came from, for the error ("--prompt-ids", "--prompt-ids-file FILE line 3").
std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);  // spaces around an id are not part of it ("1, 2")
    item.erase(0, std::min(item.find_first_not_of(" \t"), item.size()));
    item.erase(item.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    STRATUM_CHECK(!item.empty() && end && *end == '\0' && errno == 0 && v >= 0 && v < (1LL << 31),
                  "[cli] ", flag, " expects comma-separated token ids like 1,2,3, got '", item, "'");
    ids.push_back(static_cast<std::int32_t>(v));
    at = comma + 1;
  }
  return ids;
}

std::string ids_text(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}
}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  Args args("generate", argv,
            {{"model", "DIR", "Hugging Face model directory (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma), or a checkpoint root (required)"},
             {"adapter", "DIR", "a PEFT LoRA adapter directory (e.g. a stratum train --lora-r checkpoint) applied "
                                "to --model unmerged"},
             {"prompt", "TEXT", "text to continue (default: start from BOS / <|endoftext|>)"},
             {"prompt-ids", "1,2,3", "token ids to continue instead of text"},
             {"chat", "TEXT", "a user message: rendered with the model's chat template (its tokenizer_config.json or "
                              "chat_template.jinja) and answered; prints the answer alone"},
             {"interactive", "", "a conversation: each line of stdin is a user message, answered in turn with the "
                                 "model's chat template (--chat TEXT, if given, is the first); ends at the end of "
                                 "stdin (Ctrl-D)"},
             {"context", "N", "with --interactive: the tokens the conversation may reach (default: the model's "
                              "context); the KV cache is this long"},
             {"system", "TEXT", "with --chat or --interactive: a system message first"},
             {"chat-template", "FILE", "with --chat or --interactive: the Jinja chat template to use instead of the model's"},
             {"chat-vars", "JSON", "with --chat or --interactive: the template's other variables, a JSON object, e.g. "
                                   "'{\"enable_thinking\": false}' (apply_chat_template's keyword arguments)"},
             {"prompts", "FILE", "many prompts, one per line: prints one JSON line per prompt"},
             {"prompt-ids-file", "FILE", "like --prompts, each line token ids like 1,2,3"},
             {"batch", "N", "sequences decoded together with --prompts/--prompt-ids-file (default 1)"},
             {"max-tokens", "N", "tokens to generate per prompt (default 64; 512 per answer with --chat or --interactive)"},
             {"temperature", "X", "sampling temperature; 0 = greedy (default: the model's generation_config.json, "
                                  "else 1.0)"},
             {"top-k", "K", "sample among the K most likely tokens; 0 = all (default: generation_config.json's, "
                            "else 0)"},
             {"top-p", "P", "sample among the most likely tokens holding probability P (default: "
                            "generation_config.json's, else 1 = all)"},
             {"repetition-penalty", "X", "divide (multiply, when negative) the logits of the tokens already in the "
                                         "sequence by X before sampling or greedy choice, as transformers does; 1 = "
                                         "none (default: generation_config.json's, else 1)"},
             {"seed", "N", "sampling seed (default 1337)"},
             {"tokenizer", "DIR", "tokenizer files if the model directory has none"},
             {"threads", "N", "worker threads (default: all CPUs)"},
             {"backend", "NAME", "cpu (default) | cuda: weights and KV caches in GPU memory (all of them unless "
                                 "--gpu-mem-budget)"},
             {"gpu-mem-budget", "SIZE", "with --backend cuda: bound the GPU memory the decoder uses to SIZE; the "
                                        "weights that do not fit are copied in from RAM (or --offload-dir) as each "
                                        "step needs them"},
             {"no-stop", "", "keep going past the end-of-sequence token"},
             {"output-ids", "", "print the generated token ids (comma-separated) instead of text"},
             {"mem-budget", "SIZE", "RAM for weights + KV cache, e.g. 512M; the rest streams from --offload-dir"},
             {"offload-dir", "DIR", "where weights that do not fit the budget live"},
             {"prefetch", "K", "layers read ahead under a budget (default 2)"},
             {"fp32-weights", "", "widen a bf16 model's weights to fp32 (default: kept bf16, half the RAM and reads)"},
             {"precision", "P", "fp32 (default) | bf16: round the model's weights to bf16 on load (half the RAM and "
                                "reads; products summed in fp32)"},
             {"trace", "FILE.json", "write a Chrome/Perfetto trace: each layer's compute, waits, reads and writes"},
             {"quiet", "", "no [stratum] lines on stderr"}});
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum generate --model DIR (--prompt TEXT | --prompt-ids IDS | --prompts FILE | --prompt-ids-file FILE) [flags]")
                   .c_str(),
               stdout);
    return 0;
  }
  GenerateOptions o;
  o.model_dir = args.has("model") ? model_dir_resolve(args.str("model")) : "";
  STRATUM_CHECK(!o.model_dir.empty(), "[cli] --model DIR is required for 'stratum generate'");
  checkpoint_dir_check(o.model_dir, "generate");  // Note [checked reads]
  if (args.has("adapter")) {  // a PEFT directory, or a LoRA run's checkpoint (root: its newest)
    o.adapter_dir = model_dir_resolve(args.str("adapter"));
    checkpoint_dir_check(o.adapter_dir, "generate");
  }
  const int sources = args.has("prompt") + args.has("prompt-ids") + args.has("prompts") + args.has("prompt-ids-file") +
                      args.has("chat");
  STRATUM_CHECK(sources <= 1, "[cli] give one of --prompt, --prompt-ids, --prompts, --prompt-ids-file and --chat");
  if (args.has("prompt")) o.prompts.push_back(args.str("prompt"));
  // A chat (Note [chat template] in data/chat_template.h): the conversation so far, rendered as
  // transformers' apply_chat_template(add_generation_prompt=True) renders it; no BOS added.
  // --interactive (Note [next turn] in infer/generator.h): the conversation so far re-rendered each
  // turn, the decoder reading its new tokens only.
  const bool interactive = args.flag("interactive");
  const bool chat = args.has("chat") || interactive;
  STRATUM_CHECK(chat || (!args.has("system") && !args.has("chat-template") && !args.has("chat-vars")),
                "[cli] --system, --chat-template and --chat-vars are for --chat TEXT or --interactive");
  STRATUM_CHECK(!interactive || sources == args.has("chat"), "[cli] --interactive reads the user's messages from "
                "stdin (--chat TEXT may give the first): drop --prompt, --prompt-ids, --prompts and --prompt-ids-file");
  STRATUM_CHECK(interactive || !args.has("context"), "[cli] --context is for --interactive");
  o.context = static_cast<int>(args.integer("context", 0, 1, 1 << 24));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::optional<ChatTemplate> chat_template;
  const bool output_ids = args.flag("output-ids");
  std::string answer;                  // the turn's streamed text (--interactive)
  std::vector<std::int32_t> turn_ids;  // and its ids
  bool stdin_ended = false;            // the last turn ended when stdin did
  // An --interactive turn's end: its ids on a line with --output-ids, else the newline after its streamed text.
  const auto end_turn = [&] {
    std::printf("%s\n", output_ids ? ids_text(turn_ids).c_str() : "");
    turn_ids.clear();
    STRATUM_CHECK(stdout_flush().empty(), "[generate] writing the answer failed; stopped");
  };
  // The next user message: stdin's next non-empty line ("> " on stderr when stdin is a terminal).
  const auto read_message = [&](std::string& line) {
    for (;;) {
      if (::isatty(STDIN_FILENO) && !args.flag("quiet")) std::fputs("> ", stderr);
      if (!std::getline(std::cin, line)) return false;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) return true;
    }
  };
  if (chat) {
    if (args.has("system")) messages.push_back({{"role", "system"}, {"content", args.str("system")}});
    std::string first = args.str("chat", "");
    STRATUM_CHECK(args.has("chat") || read_message(first), "[cli] --interactive: stdin ended before a first message");
    messages.push_back({{"role", "user"}, {"content", first}});
    // The model's template; a model directory without one takes --tokenizer DIR's (where its tokenizer comes from).
    const bool own = !args.has("tokenizer") || ChatTemplate::exists(o.model_dir);
    chat_template = ChatTemplate::load(own ? o.model_dir : args.str("tokenizer"), args.str("chat-template", ""));
    if (args.has("chat-vars")) chat_template->set_variables(args.str("chat-vars"), "--chat-vars");
    o.prompts.push_back(chat_template->render(messages, true));
    o.add_bos = false;
  }
  if (interactive) {
    o.next_turn = [&](std::string& next) {
      messages.push_back({{"role", "assistant"}, {"content", answer}});
      answer.clear();
      end_turn();
      std::string line;
      stdin_ended = !read_message(line);
      if (stdin_ended) return false;
      messages.push_back({{"role", "user"}, {"content", line}});
      next = chat_template->render(messages, true);
      return true;
    };
  }
  if (args.has("prompt-ids")) o.prompt_ids.push_back(parse_ids(args.str("prompt-ids"), "--prompt-ids"));
  const bool many = args.has("prompts") || args.has("prompt-ids-file");
  std::vector<int> prompt_lines;  // of --prompts/--prompt-ids-file: each prompt's line in the file
  if (many) {
    const bool ids = args.has("prompt-ids-file");
    const std::string flag = ids ? "--prompt-ids-file" : "--prompts";
    const std::string path = args.str(ids ? "prompt-ids-file" : "prompts");
    const std::string problem = file_read_problem(path);
    STRATUM_CHECK(problem.empty(), "[cli] ", flag, " file '", path, "' ", problem);
    const std::string text = file_read_all(path);
    int skipped = 0;
    std::size_t at = 0;
    for (int line_no = 1; at < text.size(); ++line_no) {
      const std::size_t nl = std::min(text.find('\n', at), text.size());
      std::string line = text.substr(at, nl - at);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (ids && line.find_first_not_of(" \t") == std::string::npos) line.clear();  // blank: an empty line
      if (!line.empty() && ids)
        o.prompt_ids.push_back(parse_ids(line, flag + " " + path + " line " + std::to_string(line_no)));
      if (!line.empty() && !ids) o.prompts.push_back(line);
      if (!line.empty()) prompt_lines.push_back(line_no);
      else if (nl < text.size()) ++skipped;  // (not the end's newline)
      at = nl + 1;
    }
    if (skipped > 0)
      std::fprintf(stderr, "[stratum] %s: %d empty line(s) skipped; each record's \"line\" is its prompt's line in "
                   "the file\n", flag.c_str(), skipped);
    STRATUM_CHECK(!o.prompts.empty() || !o.prompt_ids.empty(), "[cli] ", flag, " file '", path,
                  "' has no prompts (one per line)");
  }
  STRATUM_CHECK(many || !args.has("batch"), "[cli] --batch is for --prompts FILE or --prompt-ids-file FILE");
  o.batch = static_cast<int>(args.integer("batch", 1, 1, 4096));
  o.max_tokens = static_cast<int>(args.integer("max-tokens", chat ? 512 : 64, 0, 1000000));  // a chat's answer ends at its end token
  // Note [generation config] (model/hf_config.h): the model's own sampling settings where no flag gives one.
  const HfGenerationConfig gen = hf_generation_config_read(o.model_dir + "/generation_config.json");
  const double file_temperature = gen.present && !gen.do_sample ? 0.0 : gen.temperature;
  o.temperature = args.number("temperature", gen.present ? file_temperature : 1.0);
  o.top_k = static_cast<int>(args.integer("top-k", gen.present ? gen.top_k : 0, 0, 1 << 24));
  o.top_p = args.number("top-p", gen.present ? gen.top_p : 1.0);
  o.repetition_penalty = args.number("repetition-penalty", gen.repetition_penalty);
  const bool from_file = gen.present && !(args.has("temperature") && args.has("top-k") && args.has("top-p") &&
                                          args.has("repetition-penalty"));
  o.seed = static_cast<std::uint64_t>(args.integer("seed", 1337, 0, INT64_MAX));
  o.tokenizer_dir = args.str("tokenizer");
  o.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  o.backend = backend_parse(args.str("backend", "cpu"));
  o.stop_at_eos = !args.flag("no-stop");
  o.mem_budget_bytes = args.size_bytes("mem-budget", 0);
  o.gpu_mem_budget_bytes = args.size_bytes("gpu-mem-budget", 0);
  STRATUM_CHECK(!args.has("gpu-mem-budget") || o.gpu_mem_budget_bytes > 0, "[cli] --gpu-mem-budget must be > 0, e.g. 4G");
  o.offload_dir = args.str("offload-dir");
  STRATUM_CHECK(o.mem_budget_bytes == 0 || !o.offload_dir.empty(),
                "[cli] --mem-budget needs --offload-dir DIR for the weights that do not fit");
  o.prefetch = static_cast<int>(args.integer("prefetch", 2, 0, 64));
  STRATUM_CHECK(!args.has("prefetch") || o.mem_budget_bytes > 0 || o.gpu_mem_budget_bytes > 0,
                "[cli] --prefetch only applies with --mem-budget SIZE or --gpu-mem-budget SIZE");
  o.quiet = args.flag("quiet");
  if (from_file && !o.quiet) {
    char penalty[64] = "";
    if (o.repetition_penalty != 1.0)
      std::snprintf(penalty, sizeof penalty, ", repetition penalty %g", o.repetition_penalty);
    if (o.temperature == 0.0)
      std::fprintf(stderr, "[stratum] greedy decoding%s (%s; --temperature X samples)\n", penalty,
                   args.has("temperature") ? "--temperature 0" : "generation_config.json: do_sample false");
    else
      std::fprintf(stderr, "[stratum] sampling at temperature %g, top-k %d, top-p %g%s (the flags given, the rest from "
                   "generation_config.json)\n", o.temperature, o.top_k, o.top_p, penalty);
  }
  o.keep_bf16 = !args.flag("fp32-weights");
  o.precision = precision_parse(args.str("precision", "fp32"));
  STRATUM_CHECK(o.precision == Precision::Fp32 || o.keep_bf16, "[cli] give --precision bf16 or --fp32-weights, not both");
  o.trace_path = args.str("trace");

  // The streamed text starts with the prompt, echoed with the first generated token: after
  // generate_run has checked the options, the prompt and the model (a refused run prints nothing).
  const bool stream_text = !many && !output_ids;
  bool echoed = false;
  const auto echo_prompt = [&] {
    if (!echoed && !o.prompts.empty() && !chat) std::fputs(o.prompts[0].c_str(), stdout);  // a chat prints the answer
    echoed = true;
  };
  o.stop_requested = stop_signals_install("\n[stratum] stopping after this token; interrupt again to quit at once\n");
  const GenerateResult r = generate_run(o, [&](int, std::int32_t id, const std::string& text) {
    if (interactive) {  // the turn's answer, for the history and --output-ids
      answer += text;
      turn_ids.push_back(id);
    }
    if (!stream_text) return;
    echo_prompt();
    std::fwrite(text.data(), 1, text.size(), stdout);  // a short write sets the stream's error flag
    const std::string failed = stdout_flush();
    STRATUM_CHECK(failed.empty(), "[generate] writing the text failed: ", failed, "; stopped generating");
  });
  if (interactive) {
    if (!stdin_ended) end_turn();  // an interrupted answer's end
  } else if (stream_text && !r.has_tokenizer) {  // ids in, and no tokenizer to make text of them: the ids out
    std::printf("%s\n", ids_text(r.sequences[0].tokens).c_str());
    if (!o.quiet)
      std::fprintf(stderr, "[stratum] '%s' has no tokenizer to print text with: printed the token ids (--tokenizer DIR "
                   "gives text)\n", o.model_dir.c_str());
  } else if (stream_text) {
    echo_prompt();  // --max-tokens 0 or an end-of-text first token
    std::fputs("\n", stdout);
  } else if (!many) {
    std::printf("%s\n", ids_text(r.sequences[0].tokens).c_str());
  } else {
    for (std::size_t i = 0; i < r.sequences.size(); ++i) {
      const GenerateSequence& s = r.sequences[i];
      nlohmann::ordered_json j = {
          {"prompt", i + 1}, {"line", prompt_lines[i]}, {"ids", s.tokens}, {"stopped_at_eos", s.stopped_at_eos}};
      if (!output_ids) j["text"] = s.text;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
  }
  const std::string failed = stdout_flush();
  STRATUM_CHECK(failed.empty(), "[generate] writing the output failed: ", failed);
  if (r.interrupted) {  // what was generated is out; the offload files went with the store
    std::fprintf(stderr, "[stratum] interrupted after %ld generated tokens\n", r.generated_tokens);
    return 130;
  }
  for (std::size_t i = 0; i < r.sequences.size(); ++i)  // --max-tokens beyond the context: said, not silent
    if (r.sequences[i].stopped_at_context && !o.quiet)
      std::fprintf(stderr, "[stratum] prompt %zu stopped after %zu tokens: the context is full (--max-tokens %d asked for more)\n",
                   i + 1, r.sequences[i].tokens.size(), o.max_tokens);
  if (!o.quiet) {
    std::fprintf(stderr,
                 "[stratum] prompt: %ld tokens at %.*f tokens/s; generated: %ld tokens at %.*f tokens/s "
                 "(%zu sequences, batch %d; %.3f s prompt steps, %.3f s decode steps)\n",
                 r.prompt_tokens, r.prompt_tokens_per_s < 10 ? 3 : 1, r.prompt_tokens_per_s, r.generated_tokens,
                 r.generate_tokens_per_s < 10 ? 3 : 1, r.generate_tokens_per_s, r.sequences.size(), o.batch,
                 r.prompt_seconds, r.generate_seconds);
    std::fprintf(stderr, "[stratum] weights: %.1f MiB %s\n", r.weight_bytes / 1048576.0,
                 !r.weights_bf16                   ? "fp32"
                 : o.precision == Precision::Bf16 ? "bf16 (--precision bf16)"
                                                  : "bf16 (kept as stored)");
    std::fprintf(stderr, "[stratum] KV cache: %.1f MiB for %d positions a sequence", r.kv_cache_bytes / 1048576.0,
                 r.max_ctx);
    if (r.kv_cache_bytes < r.kv_cache_whole_bytes)  // Note [sliding KV cache]
      std::fprintf(stderr, " (its sliding layers keep their window's rows: %.1f MiB if they kept every one)",
                   r.kv_cache_whole_bytes / 1048576.0);
    std::fprintf(stderr, "\n");
    if (o.gpu_mem_budget_bytes > 0)
      std::fprintf(stderr, "[stratum] %s tier: copied in %.1f MiB, out %.1f MiB, peak %.1f MiB of the %.1f MiB budget\n",
                   backend_name(o.backend), r.device_read_bytes / 1048576.0, r.device_write_bytes / 1048576.0,
                   r.device_peak_bytes / 1048576.0, o.gpu_mem_budget_bytes / 1048576.0);
    if (o.mem_budget_bytes > 0)
      std::fprintf(stderr,
                   "[stratum] weights streamed from %s: %.1f MiB read, peak RAM %.1f MiB of the %.1f MiB budget; "
                   "KV cache spilled: %.1f MiB written\n"
                   "[stratum] reads: %.2f GB/s while reading, in flight %.0f%% of the %.2f s run; compute waited "
                   "%.2f s\n",
                   o.offload_dir.c_str(), r.read_bytes / 1048576.0, r.peak_ram_bytes / 1048576.0,
                   o.mem_budget_bytes / 1048576.0, r.write_bytes / 1048576.0,
                   r.read_busy_seconds > 0 ? r.read_bytes / r.read_busy_seconds / 1e9 : 0.0,
                   100.0 * r.read_busy_seconds / std::max(1e-9, r.prompt_seconds + r.generate_seconds),
                   r.prompt_seconds + r.generate_seconds, r.stall_seconds);
  }
  return 0;
}

}  // namespace stratum
