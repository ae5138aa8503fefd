// PEFT LoRA adapter directories; see adapter_io.h.
#include "weights/adapter_io.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/rng.h"
#include "formats/json_fields.h"
#include "stratum/error.h"
#include "weights/tensor_io.h"

namespace stratum {

LoraConfig adapter_config_read(const std::string& dir, LoraFamily family) {
  const std::string path = dir + "/" + kAdapterConfigFile;
  STRATUM_CHECK(dir_exists(dir), "[lora] adapter directory '", dir, "' does not exist");
  STRATUM_CHECK(file_exists(path), "[lora] '", dir, "' has no ", kAdapterConfigFile,
                ": expected a PEFT LoRA adapter directory");
  return adapter_config_parse(file_read_all(path), path, family);
}

std::string adapter_base_model(const std::string& dir) {
  try {
    const nlohmann::json root = nlohmann::json::parse(file_read_all(dir + "/" + kAdapterConfigFile));
    const auto it = root.find("base_model_name_or_path");
    return it != root.end() && it->is_string() ? it->get<std::string>() : std::string();
  } catch (const nlohmann::json::exception&) {
  } catch (const Error&) {
  }
  return {};
}

LoraConfig adapter_config_parse(const std::string& text, const std::string& path, LoraFamily family) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[lora] ", path, ": not valid JSON (", e.what(), ")");
  }
  STRATUM_CHECK(root.is_object(), "[lora] ", path, ": expected a JSON object");
  const JsonFields f(root, path, "lora");
  const std::string type = f.str("peft_type");
  STRATUM_CHECK(type == "LORA", "[lora] ", path, ": peft_type is '", type, "'; only LORA adapters can be used");
  LoraConfig lora;
  lora.r = static_cast<int>(f.integer("r", 1, 1 << 16));
  lora.alpha = f.number("lora_alpha", 1e-30, 1e30);
  lora.dropout = f.number_or("lora_dropout", 0.0);
  f.check(lora.dropout >= 0 && lora.dropout < 1, "lora_dropout", "must be in [0, 1)");
  if (root.contains("use_rslora") && !root.at("use_rslora").is_null()) lora.rslora = f.boolean("use_rslora");
  const std::string bias = f.str_or("bias", "none");
  f.check(bias == "none", "bias", "must be \"none\" (trained biases are not supported)");
  auto empty = [&](const char* key) {
    const auto it = root.find(key);
    return it == root.end() || it->is_null() || (it->is_object() && it->empty()) || (it->is_array() && it->empty()) ||
           (it->is_boolean() && !it->get<bool>());
  };
  for (const char* key : {"modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform", "use_dora"})
    f.check(empty(key), key, "is set; only plain LoRA (the same r and alpha on every layer, no extra modules) is supported");
  const nlohmann::json& targets = f.at("target_modules");
  f.check(targets.is_array() && !targets.empty(), "target_modules",
          "must be a non-empty list of module names (a regular expression is not supported)");
  for (const auto& t : targets) {
    f.check(t.is_string(), "target_modules", "must list strings");
    lora.targets.push_back(t.get<std::string>());
  }
  // PEFT loads an adapter whose target_modules also name modules the model lacks, as long as one
  // matches (a list shared across families: ["q_proj", "v_proj", "c_attn"]); those adapt
  // nothing, so they are dropped. When none matches, the strict check below names the first.
  std::vector<std::string> known;
  for (const std::string& t : lora.targets)
    if (lora_target_known(family, t)) known.push_back(t);
  if (!known.empty()) lora.targets = std::move(known);
  lora_config_validate(lora, family);
  return lora;
}

void adapter_write_files(const std::string& dir, const ParamLayout& layout, SegmentStore& store,
                         const std::string& base_model) {
  STRATUM_ASSERT(layout.has_lora());
  const LoraConfig& lora = layout.lora();
  nlohmann::ordered_json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", lora.r},
      {"lora_alpha", lora.alpha},
      {"lora_dropout", lora.dropout},
      {"target_modules", lora.targets},
      {"fan_in_fan_out", layout.arch() == ModelArch::Gpt2},  // GPT-2's Conv1D
      {"bias", "none"},
      {"use_rslora", lora.rslora},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"init_lora_weights", true},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"inference_mode", true},
      {"revision", nullptr},
  };
  file_write_atomic(dir + "/" + kAdapterConfigFile, config.dump(2) + "\n");
  write_kinds(dir + "/" + kAdapterWeightsFile, layout, store, {{SegmentKind::Params, ""}}, {{"format", "pt"}},
              SegmentSelect::Adapters, kAdapterPrefix);
}

void adapter_load_weights(const std::string& dir, const ParamLayout& layout, SegmentStore& store) {
  const std::string path = dir + "/" + kAdapterWeightsFile;
  STRATUM_CHECK(file_exists(path), "[lora] '", dir, "' has no ", kAdapterWeightsFile);
  load_kinds({path}, layout, &store, {{SegmentKind::Params, ""}}, [](const std::string&) { return false; },
             "the LoRA adapters", nullptr, SegmentSelect::Adapters, kAdapterPrefix);
}

void lora_init_random(const ParamLayout& layout, SegmentStore& store, std::uint64_t seed) {
  Rng rng(seed ^ 0x4c6f5241ull);  // "LoRA": a stream of its own, apart from the base's init
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (layout.segments()[s].role != SegmentRole::Lora) continue;
    SegmentChunksHold params(store, s, SegmentKind::Params, Access::Overwrite);
    const auto& tensors = layout.segments()[s].tensors;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorSlot& t = tensors[i];
      float* p = params.tensor(t);
      if (i % 2 == 1) {  // lora_B
        std::fill(p, p + t.numel, 0.0f);
        continue;
      }
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));  // fan_in = in
      for (std::size_t j = 0; j < t.numel; ++j) p[j] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    }
  }
}

}  // namespace stratum
