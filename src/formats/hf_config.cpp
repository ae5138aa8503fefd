// Hugging Face GPT-2 config.json reader and writer; see hf_config.h.
#include "formats/hf_config.h"

#include <charconv>
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "formats/json_brief.h"
#include "stratum/error.h"

#ifndef STRATUM_VERSION
#define STRATUM_VERSION "unknown"
#endif

namespace stratum {

namespace {

std::string where(const std::string& path) { return "[hf_config] '" + path + "'"; }

int int_field(const std::string& path, const nlohmann::json& root, const char* key) {
  STRATUM_CHECK(root.contains(key), where(path), ": missing required field '", key, "'");
  const auto& v = root.at(key);
  STRATUM_CHECK(v.is_number_integer(), where(path), ": field '", key, "' must be an integer, got ", json_brief(v));
  STRATUM_CHECK(v.get<std::int64_t>() >= INT_MIN && v.get<std::int64_t>() <= INT_MAX &&
                    !(v.is_number_unsigned() && v.get<std::uint64_t>() > INT_MAX),
                where(path), ": field '", key, "' = ", json_brief(v), " is out of range");
  return v.get<int>();
}

// Reads an optional boolean option and refuses the value Stratum does not implement.
void option_refuse(const std::string& path, const nlohmann::json& root, const char* key,
                   bool unsupported, const char* why) {
  if (!root.contains(key) || root.at(key).is_null()) return;
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

}  // namespace

GptConfig hf_config_read_gpt2(const std::string& path) {
  STRATUM_CHECK(!dir_exists(path), where(path), " is a directory; pass the config.json inside it");
  STRATUM_CHECK(file_exists(path), where(path),
                ": file not found; expected a Hugging Face GPT-2 config.json");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(file_read_all(path));
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL(where(path), ": not valid JSON (", e.what(), ")");
  }
  STRATUM_CHECK(root.is_object(), where(path), ": must be a JSON object, got ", root.type_name());

  if (root.contains("model_type")) {
    const auto& type = root.at("model_type");
    STRATUM_CHECK(type.is_string(), where(path), ": model_type must be a string, got ", json_brief(type));
    STRATUM_CHECK(type.get<std::string>() == "gpt2", where(path), ": model_type ", json_brief(type),
                  " is not supported; only GPT-2 (model_type \"gpt2\") is supported in this version");
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
  if (root.contains("n_inner") && !root.at("n_inner").is_null()) {
    const int n_inner = int_field(path, root, "n_inner");
    const std::int64_t mlp_width = 4 * static_cast<std::int64_t>(cfg.n_embd);  // n_embd is not validated yet
    STRATUM_CHECK(n_inner == mlp_width, where(path), ": n_inner = ", n_inner,
                  " is not supported; Stratum's GPT-2 MLP width is 4 * n_embd = ", mlp_width);
  }
  option_refuse(path, root, "tie_word_embeddings", false, "the LM head is tied to wte");
  option_refuse(path, root, "scale_attn_weights", false, "attention scores are scaled by 1/sqrt(head_dim)");
  option_refuse(path, root, "scale_attn_by_inverse_layer_idx", true, "not implemented");
  option_refuse(path, root, "add_cross_attention", true, "decoder-only models only");

  try {
    cfg.validate();
  } catch (const Error& e) {
    STRATUM_FAIL(where(path), ": invalid GPT-2 config: ", e.what());
  }
  return cfg;
}

void hf_config_write_gpt2(const std::string& path, const GptConfig& cfg) {
  try {
    cfg.validate();
  } catch (const Error& e) {
    STRATUM_FAIL(where(path), ": refusing to write an invalid GPT-2 config: ", e.what());
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
  j["bos_token_id"] = 50256;
  j["eos_token_id"] = 50256;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = "float32";
  j["stratum_version"] = STRATUM_VERSION;
  file_write_atomic(path, j.dump(2) + "\n");
}

}  // namespace stratum
