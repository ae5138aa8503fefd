// Hugging Face config.json reader and writer (GPT-2 and Llama); see hf_config.h.
#include "model/hf_config.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "formats/json_brief.h"
#include "formats/json_fields.h"
#include "stratum/error.h"

#ifndef STRATUM_VERSION
#define STRATUM_VERSION "unknown"
#endif

namespace stratum {

namespace {

std::string where(const std::string& path) { return "[hf_config] '" + path + "'"; }

// Whether `obj` has `key` with a value: an absent key and JSON null both mean "not given".
bool given(const nlohmann::json& obj, const char* key) { return obj.contains(key) && !obj.at(key).is_null(); }

int int_field(const std::string& path, const nlohmann::json& root, const char* key) {
  return static_cast<int>(JsonFields(root, "'" + path + "'", "hf_config").integer(key, INT_MIN, INT_MAX));
}

// Reads an optional boolean option and refuses the value Stratum does not implement.
void option_refuse(const std::string& path, const nlohmann::json& root, const char* key,
                   bool unsupported, const char* why) {
  if (!given(root, key)) return;
  const auto& v = root.at(key);
  STRATUM_CHECK(v.is_boolean(), where(path), ": field '", key, "' must be true or false, got ", json_brief(v));
  STRATUM_CHECK(v.get<bool>() != unsupported, where(path), ": ", key, " = ", json_brief(v),
                " is not supported (", why, ")");
}

// The shortest decimal that reads back as the same float, as a double (1e-5f -> 1e-05, not
// 9.99999974737875e-06), so config.json shows the value the user set.
double float_for_json(float value) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), value);
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}


double number_field(const std::string& path, const nlohmann::json& root, const char* key, double fallback) {
  return JsonFields(root, "'" + path + "'", "hf_config").number_or(key, fallback);
}

// bos/eos ids: an integer, a list of integers (eos of Llama 3 instruct models) or null.
std::vector<std::int32_t> token_ids_field(const std::string& path, const nlohmann::json& root, const char* key) {
  std::vector<std::int32_t> ids;
  if (!given(root, key)) return ids;
  const auto& v = root.at(key);
  auto one = [&](const nlohmann::json& id) {
    STRATUM_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 && id.get<std::int64_t>() < (1 << 24),
                  where(path), ": field '", key, "' must hold token ids (integers >= 0), got ", json_brief(v));
    ids.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
  };
  if (v.is_array()) {
    for (const auto& id : v) one(id);
  } else {
    one(v);
  }
  return ids;
}

RopeScaling rope_scaling_read(const std::string& path, const nlohmann::json& root) {
  RopeScaling s;
  if (!given(root, "rope_scaling")) return s;
  const auto& r = root.at("rope_scaling");
  STRATUM_CHECK(r.is_object(), where(path), ": rope_scaling must be an object or null, got ", json_brief(r));
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  STRATUM_CHECK(r.contains(type_key) && r.at(type_key).is_string(), where(path),
                ": rope_scaling needs a string 'rope_type', got ", json_brief(r));
  const std::string type = r.at(type_key).get<std::string>();
  if (type == "default") return s;
  if (type == "longrope" || type == "su") {  // Note [longrope]: Phi-3's (original context read by read_llama)
    s.type = RopeScaling::Type::LongRope;
    auto factors = [&](const char* key) {
      STRATUM_CHECK(r.contains(key) && r.at(key).is_array(), where(path), ": rope_scaling (longrope) needs '", key,
                    "' (a list of numbers), got ", json_brief(r.contains(key) ? r.at(key) : nlohmann::json()));
      std::vector<double> out;
      for (const auto& v : r.at(key)) {
        STRATUM_CHECK(v.is_number(), where(path), ": rope_scaling.", key, " must hold numbers, got ", json_brief(v));
        out.push_back(v.get<double>());
      }
      return out;
    };
    s.short_factor = factors("short_factor");
    s.long_factor = factors("long_factor");
    if (given(r, "attention_factor")) {
      s.attention_factor = number_field(path, r, "attention_factor", 1.0);
      s.attention_factor_given = true;
    }
    return s;
  }
  STRATUM_CHECK(type == "llama3" || type == "linear", where(path), ": rope_scaling type \"", type,
                "\" is not supported; Stratum implements \"llama3\", \"linear\", Phi-3's \"longrope\" (and no scaling)");
  STRATUM_CHECK(r.contains("factor"), where(path), ": rope_scaling (", type, ") needs 'factor'");
  s.factor = number_field(path, r, "factor", 1.0);
  if (type == "linear") {
    s.type = RopeScaling::Type::Linear;
    return s;
  }
  s.type = RopeScaling::Type::Llama3;
  for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    STRATUM_CHECK(r.contains(key), where(path), ": rope_scaling (llama3) needs '", key, "'");
  s.low_freq_factor = number_field(path, r, "low_freq_factor", 1.0);
  s.high_freq_factor = number_field(path, r, "high_freq_factor", 4.0);
  s.original_max_position_embeddings = int_field(path, r, "original_max_position_embeddings");
  return s;
}

// Gemma 2's soft-capping (Note [gemma2]): Gemma2Config's default when absent, none when null.
float softcap_field(const std::string& path, const nlohmann::json& root, const char* key, double fallback) {
  if (root.contains(key) && root.at(key).is_null()) return 0.0f;
  const double cap = number_field(path, root, key, fallback);
  STRATUM_CHECK(cap > 0 && cap < 1e30, where(path), ": ", key, " must be a number > 0 or null, got ", cap);
  return static_cast<float>(cap);
}

// Note [gemma2], Note [gemma3]: the fields Gemma 2 and Gemma 3 add to Gemma's, into cfg (whose
// variant, n_layer and head_dim are read).
void gemma_layers_read(const std::string& path, const nlohmann::json& root, GptConfig& cfg) {
  const bool gemma3 = cfg.variant == LlamaVariant::Gemma3;
  STRATUM_CHECK(!given(root, "rope_parameters") || given(root, "rope_theta"), where(path),
                ": rope_parameters without rope_theta is not supported; Stratum reads ", cfg.family_title(),
                "'s rope_theta", gemma3 ? ", rope_local_base_freq and rope_scaling" : "",
                " (as the released config.json files have them)");
  if (gemma3) {
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
      STRATUM_CHECK(!given(root, key), where(path), ": ", key, " ", json_brief(root.at(key)),
                    " is not supported; Stratum runs Gemma 3 without logit soft-capping (null, as released)");
  } else {  // Gemma2Config's defaults: 50 and 30
    cfg.attn_softcap = softcap_field(path, root, "attn_logit_softcapping", 50.0);
    cfg.final_softcap = softcap_field(path, root, "final_logit_softcapping", 30.0);
  }
  option_refuse(path, root, "use_bidirectional_attention", true, "Stratum's attention is causal");
  const double scalar = number_field(path, root, "query_pre_attn_scalar", 256.0);
  STRATUM_CHECK(scalar == cfg.head_dim(), where(path), ": query_pre_attn_scalar ", scalar,
                " is not supported; Stratum scales attention by head_dim^-1/2 (query_pre_attn_scalar = head_dim = ",
                cfg.head_dim(), ")");
  cfg.sliding_window = given(root, "sliding_window") ? int_field(path, root, "sliding_window") : 4096;
  STRATUM_CHECK(cfg.sliding_window >= 1, where(path), ": sliding_window must be >= 1, got ", cfg.sliding_window);
  if (gemma3) cfg.rope_local_theta = number_field(path, root, "rope_local_base_freq", 10000.0);
  // validate() bounds it later; a list per layer is made now (and a hostile count must not size it).
  STRATUM_CHECK(cfg.n_layer >= 1 && cfg.n_layer <= 1024, where(path), ": num_hidden_layers must be in 1..1024, got ",
                cfg.n_layer);
  cfg.layer_sliding.assign(static_cast<std::size_t>(cfg.n_layer), 0);
  if (given(root, "layer_types")) {
    const auto& types = root.at("layer_types");
    STRATUM_CHECK(types.is_array() && types.size() == cfg.layer_sliding.size(), where(path),
                  ": layer_types must list one type per layer (", cfg.n_layer, "), got ", json_brief(types));
    for (std::size_t i = 0; i < types.size(); ++i) {
      const bool sliding = types[i] == "sliding_attention";
      STRATUM_CHECK(sliding || types[i] == "full_attention", where(path), ": layer_types[", i, "] ",
                    json_brief(types[i]), " is neither \"sliding_attention\" nor \"full_attention\"");
      cfg.layer_sliding[i] = sliding ? 1 : 0;
    }
  } else {
    const int pattern = given(root, "sliding_window_pattern") ? int_field(path, root, "sliding_window_pattern")
                                                               : gemma3 ? kGemma3SlidingPattern
                                                                        : kGemma2SlidingPattern;
    STRATUM_CHECK(pattern >= 1, where(path), ": sliding_window_pattern must be >= 1, got ", pattern);
    for (int i = 0; i < cfg.n_layer; ++i) cfg.layer_sliding[static_cast<std::size_t>(i)] = (i + 1) % pattern != 0;
  }
}

// Note [gemma3 multimodal]: the text model's config of a multimodal Gemma 3 config.json (model_type
// "gemma3"): Gemma3TextConfig's defaults, the outer bos/eos ids, then text_config's fields.
nlohmann::json gemma3_text_config(const std::string& path, const nlohmann::json& root) {
  STRATUM_CHECK(root.contains("text_config") && root.at("text_config").is_object(), where(path),
                ": a multimodal Gemma 3 config (model_type \"gemma3\") needs its text_config object");
  const nlohmann::json& given_text = root.at("text_config");
  STRATUM_CHECK(!given_text.contains("model_type") || given_text.at("model_type") == "gemma3_text", where(path),
                ": text_config's model_type must be \"gemma3_text\", got ", json_brief(given_text.at("model_type")));
  nlohmann::json text = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                         {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                         {"head_dim", 256}, {"hidden_activation", "gelu_pytorch_tanh"},
                         {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6}, {"bos_token_id", 2},
                         {"eos_token_id", 1}, {"tie_word_embeddings", true}, {"rope_theta", 1000000.0},
                         {"attention_bias", false}, {"query_pre_attn_scalar", 256}, {"sliding_window", 4096},
                         {"rope_local_base_freq", 10000.0}, {"sliding_window_pattern", 6}};
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (given(root, key)) text[key] = root.at(key);
  for (const auto& [key, value] : given_text.items()) text[key] = value;
  return text;
}

// A Llama-family config.json: "llama", "qwen2" (LlamaVariant::Qwen2: q, k and v biases), "qwen3"
// (q_norm and k_norm), "mistral", "phi3" (Note [phi3 fused]), "gemma" (Note [gemma]), "gemma2"
// (Note [gemma2]) or "gemma3_text" (Note [gemma3]).
GptConfig read_llama(const std::string& path, const nlohmann::json& root, LlamaVariant variant) {
  GptConfig cfg;
  cfg.arch = ModelArch::Llama;
  cfg.variant = variant;
  cfg.n_layer = int_field(path, root, "num_hidden_layers");
  cfg.n_head = int_field(path, root, "num_attention_heads");
  cfg.n_embd = int_field(path, root, "hidden_size");
  cfg.vocab_size = int_field(path, root, "vocab_size");
  cfg.n_ctx = int_field(path, root, "max_position_embeddings");
  cfg.n_inner = int_field(path, root, "intermediate_size");
  // n_inner 0 means "4 * n_embd" inside Stratum (GPT-2's n_inner null); a Llama config states its width.
  STRATUM_CHECK(cfg.n_inner >= 1, where(path), ": intermediate_size must be >= 1, got ", cfg.n_inner);
  cfg.n_kv_head = given(root, "num_key_value_heads")
                      ? int_field(path, root, "num_key_value_heads")
                      : cfg.n_head;
  STRATUM_CHECK(cfg.n_kv_head >= 1, where(path), ": num_key_value_heads must be >= 1, got ", cfg.n_kv_head);
  if (given(root, "head_dim")) cfg.n_head_dim = int_field(path, root, "head_dim");
  cfg.layer_norm_eps = static_cast<float>(number_field(path, root, "rms_norm_eps", 1e-6));
  cfg.rope_theta = number_field(path, root, "rope_theta", 10000.0);
  cfg.rope_scaling = rope_scaling_read(path, root);
  STRATUM_CHECK(cfg.rope_scaling.type != RopeScaling::Type::LongRope || variant == LlamaVariant::Phi3, where(path),
                ": rope_scaling \"longrope\" is supported for Phi-3 models (model_type \"phi3\") only");
  const bool gemma = cfg.gemma();
  cfg.tie_word_embeddings = gemma;  // LlamaConfig's default (the Gemma configs': tied)
  if (given(root, "tie_word_embeddings")) {
    const auto& v = root.at("tie_word_embeddings");
    STRATUM_CHECK(v.is_boolean(), where(path), ": field 'tie_word_embeddings' must be true or false, got ", json_brief(v));
    cfg.tie_word_embeddings = v.get<bool>();
  }
  if (gemma) {
    // Note [gemma]: GeGLU with GELU's tanh form. Gemma's first configs say hidden_act "gelu", which
    // transformers runs as gelu_pytorch_tanh (Gemma's reference activation); later ones add
    // hidden_activation, which decides when present.
    const bool activation = given(root, "hidden_activation");
    const char* key = activation ? "hidden_activation" : "hidden_act";
    if (given(root, key)) {
      const auto& act = root.at(key);
      const bool ok = act.is_string() && (act.get<std::string>() == "gelu_pytorch_tanh" ||
                                          (!activation && act.get<std::string>() == "gelu"));
      STRATUM_CHECK(ok, where(path), ": ", key, " ", json_brief(act),
                    " is not supported; Gemma's MLP is GeGLU with GELU's tanh form (\"gelu_pytorch_tanh\")");
    }
    option_refuse(path, root, "attention_bias", true, "Gemma's projections have no biases in its released models");
    if (variant != LlamaVariant::Gemma) gemma_layers_read(path, root, cfg);
  } else if (root.contains("hidden_act")) {
    const auto& act = root.at("hidden_act");
    STRATUM_CHECK(act.is_string() && act.get<std::string>() == "silu", where(path), ": hidden_act ", json_brief(act),
                  " is not supported; Llama's MLP is SwiGLU (\"silu\")");
  }
  if (variant == LlamaVariant::Qwen2 || variant == LlamaVariant::Qwen3) {
    // Qwen2's and Qwen3's sliding-window attention (use_sliding_window, from layer
    // max_window_layers on) is off in their released configs; on, it would attend to fewer keys
    // than Stratum does.
    option_refuse(path, root, "use_sliding_window", true, "Stratum's attention is full causal attention");
    if (variant == LlamaVariant::Qwen3)  // Qwen3Config's attention_bias (false in every release)
      option_refuse(path, root, "attention_bias", true, "Qwen3's projections have no biases in its released models");
  } else if (variant == LlamaVariant::Mistral || variant == LlamaVariant::Phi3) {
    // Phi-3's released rope_scaling is null or longrope; Phi3Config validates no other.
    STRATUM_CHECK(variant != LlamaVariant::Phi3 || cfg.rope_scaling.type == RopeScaling::Type::None ||
                      cfg.rope_scaling.type == RopeScaling::Type::LongRope,
                  where(path), ": a Phi-3 model's rope_scaling must be null or longrope; got ",
                  json_brief(root.at("rope_scaling")));
    if (cfg.rope_scaling.type == RopeScaling::Type::LongRope) {  // Note [longrope]
      RopeScaling& s = cfg.rope_scaling;
      s.original_max_position_embeddings = root.contains("original_max_position_embeddings")
                                                ? int_field(path, root, "original_max_position_embeddings")
                                                : cfg.n_ctx;
      STRATUM_CHECK(s.original_max_position_embeddings >= 1, where(path),
                    ": original_max_position_embeddings must be >= 1, got ", s.original_max_position_embeddings);
      const double scale = static_cast<double>(cfg.n_ctx) / s.original_max_position_embeddings;
      if (!s.attention_factor_given)  // transformers' default for Phi-3 (max / original positions)
        s.attention_factor =
            scale <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log(s.original_max_position_embeddings));
    }
    if (variant == LlamaVariant::Phi3)  // Phi-4-mini's 0.75: part of each head (Note [partial rotary])
      cfg.partial_rotary_factor = number_field(path, root, "partial_rotary_factor", 1.0);
    // Note [mistral window]: every layer attends to its last sliding_window keys.
    if (given(root, "sliding_window")) {
      cfg.sliding_window = int_field(path, root, "sliding_window");
      STRATUM_CHECK(cfg.sliding_window >= 1, where(path), ": sliding_window must be >= 1 or null, got ",
                    cfg.sliding_window);
    }
  } else if (variant == LlamaVariant::Llama) {
    option_refuse(path, root, "attention_bias", true,
                  "Llama projections without biases, or Qwen2's q, k and v biases (model_type \"qwen2\")");
    option_refuse(path, root, "mlp_bias", true, "Llama projections without biases only");
  }
  const auto bos = token_ids_field(path, root, "bos_token_id");
  cfg.bos_token_id = bos.empty() ? -1 : bos[0];
  cfg.eos_token_ids = token_ids_field(path, root, "eos_token_id");
  try {
    cfg.validate();
  } catch (const Error& e) {
    STRATUM_FAIL(where(path), ": invalid ", cfg.family_title(), " config: ", e.what());
  }
  for (std::int32_t id : cfg.eos_token_ids)
    STRATUM_CHECK(id < cfg.vocab_size, where(path), ": eos_token_id ", id, " is not below vocab_size ", cfg.vocab_size);
  return cfg;
}

void write_llama(const std::string& path, const GptConfig& cfg, const char* torch_dtype) {
  nlohmann::ordered_json j;
  const bool qwen2 = cfg.variant == LlamaVariant::Qwen2;
  const bool mistral = cfg.variant == LlamaVariant::Mistral;
  const bool qwen3 = cfg.variant == LlamaVariant::Qwen3;
  const bool phi3 = cfg.variant == LlamaVariant::Phi3;
  const bool gemma = cfg.gemma();
  j["architectures"] = {qwen2          ? "Qwen2ForCausalLM"
                        : qwen3        ? "Qwen3ForCausalLM"
                        : mistral      ? "MistralForCausalLM"
                        : phi3         ? "Phi3ForCausalLM"
                        : cfg.gemma3() ? "Gemma3ForCausalLM"
                        : cfg.gemma2() ? "Gemma2ForCausalLM"
                        : gemma        ? "GemmaForCausalLM"
                                       : "LlamaForCausalLM"};
  j["model_type"] = cfg.family();
  j["hidden_size"] = cfg.n_embd;
  j["intermediate_size"] = cfg.mlp_width();
  j["num_hidden_layers"] = cfg.n_layer;
  j["num_attention_heads"] = cfg.n_head;
  j["num_key_value_heads"] = cfg.kv_heads();
  j["head_dim"] = cfg.head_dim();
  j["max_position_embeddings"] = cfg.n_ctx;
  j["vocab_size"] = cfg.vocab_size;
  j["rms_norm_eps"] = float_for_json(cfg.layer_norm_eps);
  j["rope_theta"] = cfg.rope_theta;
  const RopeScaling& s = cfg.rope_scaling;
  if (s.type == RopeScaling::Type::None) {
    j["rope_scaling"] = nullptr;
  } else if (s.type == RopeScaling::Type::Linear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  } else if (s.type == RopeScaling::Type::LongRope) {  // Note [longrope]: Phi3Config's spelling
    j["rope_scaling"] = {{"type", "longrope"}, {"long_factor", s.long_factor}, {"short_factor", s.short_factor}};
    if (s.attention_factor_given) j["rope_scaling"]["attention_factor"] = s.attention_factor;
  } else {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  j["hidden_act"] = gemma ? "gelu_pytorch_tanh" : "silu";
  if (gemma) {  // GemmaConfig's (Note [gemma]): the activation under both names, no biases
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["attention_bias"] = false;
    if (cfg.gemma2() || cfg.gemma3()) {  // Gemma2Config's and Gemma3TextConfig's (Note [gemma2], Note [gemma3])
      j["query_pre_attn_scalar"] = cfg.head_dim();
      j["sliding_window"] = cfg.sliding_window > 0 ? cfg.sliding_window : cfg.n_ctx;
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (int l = 0; l < cfg.n_layer; ++l)
        types.push_back(cfg.layer_sliding_attention(l) ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      if (cfg.gemma3()) j["rope_local_base_freq"] = cfg.rope_local_theta;
      auto cap = [](float c) { return c > 0.0f ? nlohmann::ordered_json(float_for_json(c)) : nlohmann::ordered_json(); };
      j["final_logit_softcapping"] = cap(cfg.final_softcap);
      j["attn_logit_softcapping"] = cap(cfg.attn_softcap);
    }
  } else if (qwen2 || qwen3) {  // Qwen2Config's fields (its q, k and v biases are implied by the model type)
    if (qwen3) j["attention_bias"] = false;  // Qwen3Config's; its q_norm and k_norm come with the type
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = cfg.n_layer;
  } else if (mistral || phi3) {  // MistralConfig and Phi3Config have no bias fields
    if (phi3) {  // Phi3Config's (its longrope's base, Note [longrope]; Note [partial rotary])
      j["original_max_position_embeddings"] =
          s.type == RopeScaling::Type::LongRope ? s.original_max_position_embeddings : cfg.n_ctx;
      j["partial_rotary_factor"] = cfg.partial_rotary_factor;
    }
    if (cfg.sliding_window > 0) {
      j["sliding_window"] = cfg.sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  if (cfg.bos_token_id >= 0) j["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_ids.size() == 1) j["eos_token_id"] = cfg.eos_token_ids[0];
  if (cfg.eos_token_ids.size() > 1) j["eos_token_id"] = cfg.eos_token_ids;
  j["torch_dtype"] = torch_dtype;
  j["stratum_version"] = STRATUM_VERSION;
  file_write_atomic(path, j.dump(2) + "\n");
}

// The JSON object in the file at `path`; a file that is not one gets one line naming it.
nlohmann::json json_object_read(const std::string& path) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(file_read_all(path));
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL(where(path), ": not valid JSON (", e.what(), ")");
  }
  STRATUM_CHECK(root.is_object(), where(path), ": must be a JSON object, got ", root.type_name());
  return root;
}
}  // namespace

GptConfig hf_config_read(const std::string& path) {
  STRATUM_CHECK(!dir_exists(path), where(path), " is a directory; pass the config.json inside it");
  STRATUM_CHECK(file_exists(path), where(path),
                ": file not found; expected a Hugging Face config.json (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma, "
                "Gemma 2 or Gemma 3)");
  const nlohmann::json root = json_object_read(path);

  if (root.contains("model_type")) {
    const auto& type = root.at("model_type");
    STRATUM_CHECK(type.is_string(), where(path), ": model_type must be a string, got ", json_brief(type));
    const std::string name = type.get<std::string>();
    if (name == "gemma3") {  // Note [gemma3 multimodal]: the text model
      GptConfig cfg = read_llama(path, gemma3_text_config(path, root), LlamaVariant::Gemma3);
      cfg.weights_prefix = "language_model.";
      return cfg;
    }
    STRATUM_CHECK(name == "gpt2" || name == "llama" || name == "qwen2" || name == "qwen3" || name == "mistral" ||
                      name == "phi3" || name == "gemma" || name == "gemma2" || name == "gemma3_text" ||
                      name == "gemma3",
                  where(path), ": model_type ", json_brief(type),
                  " is not supported; Stratum runs GPT-2 (\"gpt2\"), Llama (\"llama\"), Qwen2 (\"qwen2\"), Qwen3 "
                  "(\"qwen3\"), Mistral (\"mistral\"), Phi-3/Phi-4 (\"phi3\"), Gemma (\"gemma\"), Gemma 2 "
                  "(\"gemma2\") and Gemma 3 (\"gemma3_text\", and the text model of \"gemma3\") models");
    if (name == "llama") return read_llama(path, root, LlamaVariant::Llama);
    if (name == "qwen2") return read_llama(path, root, LlamaVariant::Qwen2);
    if (name == "qwen3") return read_llama(path, root, LlamaVariant::Qwen3);
    if (name == "mistral") return read_llama(path, root, LlamaVariant::Mistral);
    if (name == "phi3") return read_llama(path, root, LlamaVariant::Phi3);
    if (name == "gemma") return read_llama(path, root, LlamaVariant::Gemma);
    if (name == "gemma2") return read_llama(path, root, LlamaVariant::Gemma2);
    if (name == "gemma3_text") return read_llama(path, root, LlamaVariant::Gemma3);
  }
  GptConfig cfg;
  cfg.n_layer = int_field(path, root, "n_layer");
  cfg.n_head = int_field(path, root, "n_head");
  cfg.n_embd = int_field(path, root, "n_embd");
  cfg.vocab_size = int_field(path, root, "vocab_size");
  STRATUM_CHECK(root.contains("n_positions") || root.contains("n_ctx"), where(path),
                ": missing required field 'n_positions' (or legacy 'n_ctx')");
  cfg.n_ctx = int_field(path, root, root.contains("n_positions") ? "n_positions" : "n_ctx");

  if (root.contains("layer_norm_epsilon")) {
    const auto& eps = root.at("layer_norm_epsilon");
    STRATUM_CHECK(eps.is_number(), where(path), ": layer_norm_epsilon must be a number, got ", json_brief(eps));
    cfg.layer_norm_eps = static_cast<float>(eps.get<double>());
  }
  if (root.contains("activation_function")) {
    const auto& act = root.at("activation_function");
    STRATUM_CHECK(act.is_string() && (act.get<std::string>() == "gelu_new" ||
                                      act.get<std::string>() == "gelu_pytorch_tanh"),
                  where(path), ": activation_function ", json_brief(act),
                  " is not supported; expected \"gelu_new\" or \"gelu_pytorch_tanh\" (GELU, tanh form)");
  }
  if (given(root, "n_inner")) {
    const int n_inner = int_field(path, root, "n_inner");
    const std::int64_t mlp_width = 4 * static_cast<std::int64_t>(cfg.n_embd);  // n_embd is not validated yet
    STRATUM_CHECK(n_inner == mlp_width, where(path), ": n_inner = ", n_inner,
                  " is not supported; Stratum's GPT-2 MLP width is 4 * n_embd = ", mlp_width);
  }
  option_refuse(path, root, "tie_word_embeddings", false, "the LM head is tied to wte");
  option_refuse(path, root, "scale_attn_weights", false, "attention scores are scaled by 1/sqrt(head_dim)");
  option_refuse(path, root, "scale_attn_by_inverse_layer_idx", true, "not implemented");
  option_refuse(path, root, "add_cross_attention", true, "decoder-only models only");
  // Generation stops at these. GPT2Config's default 50256 stands in configs of any vocabulary
  // (Stratum wrote it into every GPT-2 config it saved): an id outside the vocabulary is dropped,
  // so such a model stops at its tokenizer's <|endoftext|> as before, not never. (An empty GPT-2
  // prompt starts from the tokenizer's <|endoftext|>, so bos_token_id is unused.)
  cfg.eos_token_ids = token_ids_field(path, root, "eos_token_id");
  std::erase_if(cfg.eos_token_ids, [&](std::int32_t id) { return id >= cfg.vocab_size; });

  try {
    cfg.validate();
  } catch (const Error& e) {
    STRATUM_FAIL(where(path), ": invalid GPT-2 config: ", e.what());
  }
  return cfg;
}

HfGenerationConfig hf_generation_config_read(const std::string& path) {
  HfGenerationConfig g;
  if (!file_exists(path)) return g;
  g.present = true;
  const nlohmann::json root = json_object_read(path);
  if (given(root, "do_sample")) {
    const auto& v = root.at("do_sample");
    STRATUM_CHECK(v.is_boolean(), where(path), ": field 'do_sample' must be true or false, got ", json_brief(v));
    g.do_sample = v.get<bool>();
  }
  if (given(root, "temperature")) g.temperature = number_field(path, root, "temperature", 1.0);
  STRATUM_CHECK(std::isfinite(g.temperature) && g.temperature >= 0, where(path),
                ": field 'temperature' must be a finite number >= 0, got ", g.temperature);
  if (given(root, "top_k")) g.top_k = int_field(path, root, "top_k");
  STRATUM_CHECK(g.top_k >= 0, where(path), ": field 'top_k' must be >= 0, got ", g.top_k);
  if (given(root, "top_p")) g.top_p = number_field(path, root, "top_p", 1.0);
  STRATUM_CHECK(g.top_p > 0 && g.top_p <= 1, where(path), ": field 'top_p' must be in (0, 1], got ", g.top_p);
  if (given(root, "repetition_penalty")) g.repetition_penalty = number_field(path, root, "repetition_penalty", 1.0);
  STRATUM_CHECK(std::isfinite(g.repetition_penalty) && g.repetition_penalty > 0, where(path),
                ": field 'repetition_penalty' must be a finite number > 0, got ", g.repetition_penalty);
  g.eos_token_ids = token_ids_field(path, root, "eos_token_id");
  return g;
}

void hf_config_write(const std::string& path, const GptConfig& cfg, const char* torch_dtype) {
  try {
    cfg.validate();
  } catch (const Error& e) {
    STRATUM_FAIL(where(path), ": refusing to write an invalid config: ", e.what());
  }
  if (cfg.llama()) {
    write_llama(path, cfg, torch_dtype);
    return;
  }
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["n_layer"] = cfg.n_layer;
  j["n_head"] = cfg.n_head;
  j["n_embd"] = cfg.n_embd;
  j["n_positions"] = cfg.n_ctx;
  j["n_ctx"] = cfg.n_ctx;
  j["vocab_size"] = cfg.vocab_size;
  j["layer_norm_epsilon"] = float_for_json(cfg.layer_norm_eps);
  j["activation_function"] = "gelu_new";
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["bos_token_id"] = 50256;  // GPT2Config's defaults
  if (cfg.eos_token_ids.size() > 1)
    j["eos_token_id"] = cfg.eos_token_ids;
  else
    j["eos_token_id"] = cfg.eos_token_ids.empty() ? 50256 : cfg.eos_token_ids[0];
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = torch_dtype;
  j["stratum_version"] = STRATUM_VERSION;
  file_write_atomic(path, j.dump(2) + "\n");
}

}  // namespace stratum
