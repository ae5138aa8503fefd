// `stratum info DIR|FILE`: describes a model directory, a safetensors file or a token file.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/hf_config.h"
#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "data/chat_template.h"
#include "data/token_file.h"
#include "formats/safetensors.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "train/checkpoint.h"
#include "stratum/error.h"

namespace stratum {

namespace {
void describe_safetensors(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> by_dtype;  // dtype -> (tensors, elements)
  std::uint64_t total_elements = 0;
  for (const auto& t : file.tensors()) {
    auto& entry = by_dtype[dtype_name(t.dtype)];
    ++entry.first;
    entry.second += static_cast<std::uint64_t>(t.numel());
    total_elements += static_cast<std::uint64_t>(t.numel());
  }
  std::printf("safetensors %s: %zu tensors, %.2fM elements, %.1f MiB\n", path.c_str(), file.tensors().size(),
              total_elements / 1e6, file.file_size_bytes() / (1024.0 * 1024.0));
  for (const auto& [dtype, entry] : by_dtype)
    std::printf("  %-5s %zu tensors, %.2fM elements\n", dtype.c_str(), entry.first, entry.second / 1e6);
  const std::size_t shown = std::min<std::size_t>(file.tensors().size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& t = file.tensors()[i];
    std::string shape;
    for (std::size_t d = 0; d < t.shape.size(); ++d) shape += (d ? "," : "") + std::to_string(t.shape[d]);
    std::printf("  %s %s [%s]\n", t.name.c_str(), dtype_name(t.dtype), shape.c_str());
  }
  if (shown < file.tensors().size()) std::printf("  ... %zu more\n", file.tensors().size() - shown);
  for (const auto& [k, v] : file.metadata()) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
}

// A LoRA adapter: a PEFT directory (adapter_config.json + adapter_model.safetensors) or a LoRA
// run's checkpoint (those beside the base's config.json, the moments and the trainer state).
void describe_adapter_dir(const std::string& dir) {
  const bool has_base_config = file_exists(dir + "/config.json");
  std::optional<GptConfig> base;
  if (has_base_config) base = model_read_config(dir);
  // A PEFT directory does not name its family: the targets tell (GPT-2's c_attn, Llama's q_proj,
  // Phi-3's qkv_proj). Without a base config, the family whose layers more of target_modules name
  // (a list may name several families' layers: PEFT adapts those the model has); the first of
  // GPT-2, Llama and Phi-3 on a tie.
  LoraConfig lora;
  LoraFamily family = base ? lora_family(*base) : LoraFamily::Gpt2;
  if (base) {
    lora = adapter_config_read(dir, family);
  } else {
    std::string first_error;
    bool found = false;
    for (const LoraFamily f : {LoraFamily::Gpt2, LoraFamily::Llama, LoraFamily::Phi3}) {
      try {
        const LoraConfig read = adapter_config_read(dir, f);
        if (!found || read.targets.size() > lora.targets.size()) lora = read, family = f;
        found = true;
      } catch (const Error& e) {  // not this family's adapter
        if (first_error.empty()) first_error = e.what();
      }
    }
    if (!found) throw Error(first_error);
  }
  const std::string base_name = adapter_base_model(dir);
  std::printf("LoRA adapter %s: r=%d, alpha %g%s, dropout %g, on %s (%s)%s%s\n", dir.c_str(), lora.r, lora.alpha,
              lora.rslora ? " (rsLoRA)" : "", lora.dropout, lora_targets_text(lora).c_str(),
              family == LoraFamily::Gpt2 ? "GPT-2"
              : base                     ? base->family_title()
              : family == LoraFamily::Phi3 ? "Phi-3"
                                           : "Llama family", base_name.empty() ? "" : "; base_model_name_or_path ",
              base_name.c_str());
  std::printf("  %s\n", checkpoint_dir_check(dir, "info")
                            ? "files: every one matches manifest.json (a Stratum checkpoint)"
                            : "files: no manifest.json (a PEFT directory): not checksummed");
  if (base) {
    const ParamLayout layout = ParamLayout::of(*base, lora);
    std::printf("  over a %s base %s: %.3fM adapter parameters over %.2fM frozen (generate/merge take the base with "
                "--model)\n",
                base->family_title(), base->describe().c_str(), layout.num_trainable_params() / 1e6,
                (layout.num_params() - layout.num_trainable_params()) / 1e6);
  }
  describe_safetensors(dir + "/" + kAdapterWeightsFile);
}

void describe_model_dir(const std::string& dir) {
  if (file_exists(dir + "/" + kAdapterConfigFile)) return describe_adapter_dir(dir);
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const double params = static_cast<double>(layout.num_params());
  std::printf("%s model %s: %s, %.2fM parameters\n", cfg.family_title(), dir.c_str(),
              cfg.describe().c_str(), params / 1e6);
  std::printf("  %s\n", checkpoint_dir_check(dir, "info")
                            ? "files: every one matches manifest.json (a Stratum checkpoint)"
                            : "files: no manifest.json (a plain Hugging Face directory): not checksummed");
  std::printf("  training state fp32: params %.1f MiB + grads %.1f MiB + AdamW %.1f MiB = %.1f MiB (zo-sgd: the params "
              "alone)\n",
              params * 4 / 1048576.0, params * 4 / 1048576.0, params * 8 / 1048576.0, params * 16 / 1048576.0);
  std::printf("  segments: %d (embed, %d blocks of %.1f MiB, head)\n", layout.segment_count(), cfg.n_layer,
              layout.segments()[layout.layer_segment(0)].size_bytes() / 1048576.0);
  // The tokenizer generate would use, and whether Stratum can load it.
  const std::string tok_files = BpeTokenizer::files_in(dir);
  if (tok_files.empty()) {
    std::printf("  tokenizer: none (generate needs --tokenizer DIR or --prompt-ids)\n");
  } else {
    try {
      const BpeTokenizer tok = BpeTokenizer::load(dir);
      std::printf("  tokenizer: %s, %s, %d tokens\n", tok_files.c_str(), tok.kind(), tok.vocab_size());
    } catch (const Error& e) {
      std::printf("  tokenizer: %s, not usable: %s\n", tok_files.c_str(), e.what());
    }
  }
  // The chat template generate --chat and prepare --jsonl-messages render with (Note [chat template]).
  if (!ChatTemplate::exists(dir)) {
    std::printf("  chat template: none (a base model; generate --chat and prepare --jsonl-messages take "
                "--chat-template FILE)\n");
  } else {
    try {
      std::printf("  chat template: %s (generate --chat, prepare --jsonl-messages)\n", ChatTemplate::load(dir).source().c_str());
    } catch (const Error& e) {
      std::printf("  chat template: not usable: %s\n", e.what());
    }
  }
  // What generate takes from generation_config.json (Note [generation config] in model/hf_config.h).
  try {
    const HfGenerationConfig gen = hf_generation_config_read(dir + "/generation_config.json");
    std::string stops;
    for (std::int32_t id : gen.eos_token_ids) stops += (stops.empty() ? "" : ",") + std::to_string(id);
    char penalty[64] = "";  // Note [repetition penalty]
    if (gen.repetition_penalty != 1.0) std::snprintf(penalty, sizeof penalty, ", repetition penalty %g", gen.repetition_penalty);
    stops = penalty + (stops.empty() ? "" : "; stops at " + stops);
    if (!gen.present)
      std::printf("  generation: no generation_config.json (generate samples at temperature 1 unless told)\n");
    else if (gen.do_sample)
      std::printf("  generation: generation_config.json samples at temperature %g, top-k %d, top-p %g%s\n",
                  gen.temperature, gen.top_k, gen.top_p, stops.c_str());
    else
      std::printf("  generation: generation_config.json decodes greedily%s\n", stops.c_str());
  } catch (const Error& e) {
    std::printf("  generation: generation_config.json not usable: %s\n", e.what());
  }
  for (const std::string& path : model_weight_files(dir, nullptr)) describe_safetensors(path);
  // Last, after the description: what train and generate would refuse, with a non-zero exit.
  model_check_weights(dir, layout);
  std::printf("  weights: every tensor config.json implies is there, shaped as it says\n");
}

void describe_token_file(const std::string& path) {
  const TokenFileData data = token_file_read(path);
  std::int32_t lo = INT32_MAX, hi = 0;
  for (const std::int32_t t : data.tokens) {  // a masked shard's ids under their mark (Note [loss mask])
    lo = std::min(lo, token_id(t));
    hi = std::max(hi, token_id(t));
  }
  const std::size_t targets = token_target_count(data.tokens.data(), data.tokens.size());
  std::printf("token file %s: %s, %zu tokens, ids %d..%d", path.c_str(), token_file_format_name(data.format).c_str(),
              data.tokens.size(), lo, hi);
  if (data.format == TokenFileFormat::MaskedShard)
    std::printf(", %zu of them loss targets (%.1f%%; the rest are prompts)", targets,
                100.0 * static_cast<double>(targets) / static_cast<double>(data.tokens.size()));
  std::printf("\n");
}
}  // namespace

int cmd_info(const std::vector<std::string>& argv) {
  Args args("info", argv, {}, 16);
  if (args.help_requested() || args.positional().empty()) {
    std::fputs("usage: stratum info DIR|FILE...\n  describes a Hugging Face model directory, a .safetensors file "
               "or a token file (raw uint16 / llm.c shard / masked shard)\n", stdout);
    return args.help_requested() ? 0 : 2;
  }
  for (const auto& path : args.positional()) {
    if (dir_exists(path)) describe_model_dir(model_dir_resolve(path));
    else if (const std::string problem = file_read_problem(path); !problem.empty()) STRATUM_FAIL("[info] '", path, "' ", problem);
    else if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) describe_safetensors(path);
    else if (data_file_reading(path).kind != DataFileKind::Text) describe_token_file(path);
    else STRATUM_FAIL("[info] '", path, "' is text, not a model directory, .safetensors file or token file (raw uint16 / llm.c shard / masked shard)");
  }
  return 0;
}

}  // namespace stratum
