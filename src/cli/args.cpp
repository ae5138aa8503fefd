// Args; see args.h.
#include "cli/args.h"

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>

#include "stratum/error.h"

namespace stratum {

Args::Args(std::string command, const std::vector<std::string>& argv, std::vector<FlagSpec> specs,
           int max_positional)
    : command_(std::move(command)), specs_(std::move(specs)) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      STRATUM_CHECK(static_cast<int>(positional_.size()) < max_positional, "[cli] unexpected argument '", arg,
                    "' for 'stratum ", command_, "'; flags start with '--' (see 'stratum ", command_, " --help')");
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), val;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      val = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const FlagSpec* s = spec(name);
    STRATUM_CHECK(s != nullptr, "[cli] unknown flag '--", name, "' for 'stratum ", command_, "' (see 'stratum ",
                  command_, " --help')");
    STRATUM_CHECK(value(name) == nullptr, "[cli] flag '--", name, "' given twice");
    if (s->value_name.empty()) {
      STRATUM_CHECK(!inline_value, "[cli] flag '--", name, "' is a switch and takes no value");
      val = "1";
    } else if (!inline_value) {
      STRATUM_CHECK(i + 1 < argv.size(), "[cli] flag '--", name, "' needs a value (", s->value_name, ")");
      val = argv[++i];
    }
    // An empty value is never "absent" (--save "" used to train and save nothing).
    STRATUM_CHECK(!val.empty(), "[cli] flag '--", name, "' is given an empty value; give it a ", s->value_name,
                  " or leave the flag out");
    values_.emplace_back(name, val);
  }
}

const FlagSpec* Args::spec(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

const std::string* Args::value(const std::string& name) const {
  for (const auto& [k, v] : values_)
    if (k == name) return &v;
  return nullptr;
}

std::string Args::help_text(const std::string& synopsis) const {
  std::string out = "usage: " + synopsis + "\n";
  for (const auto& s : specs_) {
    std::string left = "  --" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    if (left.size() < 28) left.resize(28, ' ');
    else left += "  ";
    out += left + s.help + "\n";
  }
  return out;
}

bool Args::has(const std::string& name) const { return value(name) != nullptr; }

std::string Args::str(const std::string& name, const std::string& fallback) const {
  const std::string* v = value(name);
  return v ? *v : fallback;
}

bool Args::flag(const std::string& name) const { return value(name) != nullptr; }

std::int64_t Args::integer(const std::string& name, std::int64_t fallback, std::int64_t min, std::int64_t max) const {
  const std::string* v = value(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(v->c_str(), &end, 10);
  STRATUM_CHECK(!v->empty() && end && *end == '\0' && errno == 0, "[cli] --", name, " expects an integer, got '",
                *v, "'");
  STRATUM_CHECK(parsed >= min && parsed <= max, "[cli] --", name, " must be in ", min, "..", max, ", got ", parsed);
  return parsed;
}

namespace {
// Decimal digits, a point and an exponent only: strtod also reads hex ("0x20M" was 32 MiB), inf
// and nan, which no option means.
bool decimal_text(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789.eE+-") == std::string::npos;
}
}  // namespace

double Args::number(const std::string& name, double fallback) const {
  const std::string* v = value(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(v->c_str(), &end);
  STRATUM_CHECK(decimal_text(*v) && end && *end == '\0' && errno == 0 && std::isfinite(parsed), "[cli] --", name,
                " expects a number, got '", *v, "'");
  return parsed;
}

std::uint64_t Args::size_bytes(const std::string& name, std::uint64_t fallback) const {
  const std::string* v = value(name);
  if (!v) return fallback;
  std::string digits = *v;
  std::uint64_t scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K': case 'k': scale = 1ull << 10; break;
      case 'M': case 'm': scale = 1ull << 20; break;
      case 'G': case 'g': scale = 1ull << 30; break;
      case 'T': case 't': scale = 1ull << 40; break;
      default: break;
    }
    if (scale != 1) digits.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(digits.c_str(), &end);
  const double bytes = parsed * static_cast<double>(scale);
  STRATUM_CHECK(decimal_text(digits) && end && *end == '\0' && errno == 0 && parsed >= 0, "[cli] --", name,
                " expects a size like 512M or 4G, got '", *v, "'");
  STRATUM_CHECK(bytes == 0 || bytes >= 1, "[cli] --", name, " ", *v, " is less than one byte; give a size like 512M or 4G",
                parsed < 1 && scale == 1 ? " (a number alone counts bytes)" : "");
  STRATUM_CHECK(bytes < 1e18, "[cli] --", name, " ", *v, " is beyond any machine (1e18 bytes or more); give a size "
                "like 512M or 4G");
  return static_cast<std::uint64_t>(bytes);
}

namespace {
std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}
}  // namespace

// Note [model flags]: one row per flag of a new model's shape, read in this order (a default may
// depend on a field read before it: --kv-heads on --heads, --inner on --embd).
const std::vector<ModelShapeFlag>& model_shape_flags() {
  static const std::vector<ModelShapeFlag> rows = {
      {"arch", "gpt2|llama|qwen2|qwen3|mistral|phi3|gemma|gemma2|gemma3",
       "new model: family (default gpt2; qwen2: llama with q, k and v biases; qwen3: llama with per-head q and k "
       "RMSNorms; mistral: llama saved as Mistral, no sliding window; phi3: llama saved as Phi-3, its q, k, v and "
       "gate, up fused; gemma: llama with RMSNorms by 1 + w, a GeGLU MLP and a scaled embedding; gemma2: gemma "
       "with norms after the attention and the MLP, attention scores soft-capped at 50 and logits at 30, no window; "
       "gemma3: gemma with q and k norms, norms after the attention and the MLP, each 6th layer full, the others "
       "sliding (rope base 10000), no window)",
       false,
       [](const Args& a, GptConfig& c) {
         const std::string arch = a.str("arch", "gpt2");
         STRATUM_CHECK(arch == "gpt2" || arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "mistral" ||
                           arch == "phi3" || arch == "gemma" || arch == "gemma2" || arch == "gemma3",
                       "[cli] --arch must be gpt2, llama, qwen2, qwen3, mistral, phi3, gemma, gemma2 or gemma3, got '",
                       arch, "'");
         c.arch = arch == "gpt2" ? ModelArch::Gpt2 : ModelArch::Llama;
         c.variant = arch == "qwen2"     ? LlamaVariant::Qwen2
                     : arch == "qwen3"   ? LlamaVariant::Qwen3
                     : arch == "mistral" ? LlamaVariant::Mistral
                     : arch == "phi3"    ? LlamaVariant::Phi3
                     : arch == "gemma"   ? LlamaVariant::Gemma
                     : arch == "gemma2"  ? LlamaVariant::Gemma2
                     : arch == "gemma3"  ? LlamaVariant::Gemma3
                                         : LlamaVariant::Llama;
         if (c.llama()) c.layer_norm_eps = 1e-5f;
         if (c.gemma2()) c.attn_softcap = 50.0f, c.final_softcap = 30.0f;  // Gemma2Config's (Note [gemma2])
       },
       [](const GptConfig& c) { return std::string(c.gemma3() ? "gemma3" : c.family()); }},
      {"layers", "L", "new model: transformer blocks (default 4)", false,
       [](const Args& a, GptConfig& c) { c.n_layer = static_cast<int>(a.integer("layers", 4, 1, 1024)); },
       [](const GptConfig& c) { return number_text(c.n_layer); }},
      {"heads", "H", "new model: attention heads (default 4)", false,
       [](const Args& a, GptConfig& c) { c.n_head = static_cast<int>(a.integer("heads", 4, 1, 4096)); },
       [](const GptConfig& c) { return number_text(c.n_head); }},
      {"embd", "C", "new model: channels (default 256)", false,
       [](const Args& a, GptConfig& c) { c.n_embd = static_cast<int>(a.integer("embd", 256, 1, 65536)); },
       [](const GptConfig& c) { return number_text(c.n_embd); }},
      {"ctx", "N", "new model: context length (default 256)", false,
       [](const Args& a, GptConfig& c) { c.n_ctx = static_cast<int>(a.integer("ctx", 256, 1, 1 << 20)); },
       [](const GptConfig& c) { return number_text(c.n_ctx); }},
      {"vocab", "V", "new model: vocabulary size (default 50257)", false,
       [](const Args& a, GptConfig& c) { c.vocab_size = static_cast<int>(a.integer("vocab", 50257, 1, 1 << 24)); },
       [](const GptConfig& c) { return number_text(c.vocab_size); }},
      {"kv-heads", "K", "new llama model: key/value heads (default --heads)", true,
       [](const Args& a, GptConfig& c) { c.n_kv_head = static_cast<int>(a.integer("kv-heads", c.n_head, 1, 4096)); },
       [](const GptConfig& c) { return number_text(c.kv_heads()); }},
      {"head-dim", "D", "new llama model: width of each attention head (default C/H; Qwen3's are wider)", true,
       [](const Args& a, GptConfig& c) {
         c.n_head_dim = a.has("head-dim") ? static_cast<int>(a.integer("head-dim", 0, 2, 1024)) : 0;
       },
       [](const GptConfig& c) { return number_text(c.head_dim()); }},
      {"inner", "I", "new llama model: MLP width (default 8/3 C rounded up to 64)", true,
       [](const Args& a, GptConfig& c) {
         const int swiglu = (8 * c.n_embd / 3 + 63) / 64 * 64;  // Llama's 2/3 of 4C, rounded up to 64
         c.n_inner = static_cast<int>(a.integer("inner", swiglu, 1, 1 << 20));
       },
       [](const GptConfig& c) { return number_text(c.mlp_width()); }},
      {"rope-theta", "X", "new llama model: rotary base (default 10000)", true,
       [](const Args& a, GptConfig& c) { c.rope_theta = a.number("rope-theta", 10000.0); },
       [](const GptConfig& c) { return number_text(c.rope_theta); }},
      {"untied", "", "new llama model: an LM head of its own (default tied to the embedding)", true,
       [](const Args& a, GptConfig& c) { c.tie_word_embeddings = !a.flag("untied"); },
       [](const GptConfig& c) { return std::string(c.tie_word_embeddings ? "off" : "on"); }},
  };
  return rows;
}

std::vector<FlagSpec> model_flag_specs() {
  std::vector<FlagSpec> specs = {
      {"model", "HF_DIR", "start from a Hugging Face GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3 or Gemma directory (config.json + "
                          "*.safetensors)"}};
  for (const ModelShapeFlag& row : model_shape_flags()) specs.push_back({row.flag, row.value_name, row.help});
  return specs;
}

std::vector<FlagSpec> concat_specs(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void model_flags_alone_check(const Args& args) {
  for (const ModelShapeFlag& row : model_shape_flags())
    STRATUM_CHECK(!args.has("model") || !args.has(row.flag), "[cli] --model takes the shape from config.json; drop --",
                  row.flag);
}

GptConfig model_flags_config(const Args& args) {
  model_flags_alone_check(args);
  GptConfig config;
  for (const ModelShapeFlag& row : model_shape_flags()) {
    STRATUM_CHECK(!row.llama_only || config.llama() || !args.has(row.flag), "[cli] --", row.flag,
                  " is for --arch llama");
    if (!row.llama_only || config.llama()) row.read(args, config);
  }
  config.validate();
  return config;
}

}  // namespace stratum
