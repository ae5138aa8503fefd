// LoRA adapters as Hugging Face PEFT directories (what PeftModel.from_pretrained loads):
// adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
// target_modules, fan_in_fan_out, bias "none", use_rslora, base_model_name_or_path) and
// adapter_model.safetensors (F32, PEFT's names: "base_model.model." + the module's Hugging Face
// name + ".lora_A.weight" / ".lora_B.weight"), and the adapters' initialisation. The adapters are
// the "lora.i" segments of a layout (Note [lora segments] in model/param_layout.h). Does not
// touch the base model's files (weights/model_io.h).
#pragma once

#include <cstdint>
#include <string>

#include "model/lora.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"

namespace stratum {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterPrefix = "base_model.model.";

// Reads DIR/adapter_config.json: one line naming the file and field for a missing or bad field,
// another PEFT type, a bias other than "none", modules_to_save, DoRA, per-layer rank or alpha
// patterns, or target modules that are not linear layers of the family's block.
LoraConfig adapter_config_read(const std::string& dir, LoraFamily family);
// The same for the file's text; `where` names it in errors (the fuzz target's entry).
LoraConfig adapter_config_parse(const std::string& text, const std::string& where, LoraFamily family);

// DIR/adapter_config.json's base_model_name_or_path ("" when absent, not a string, or the file
// unreadable): the base a Stratum LoRA run was trained over (an absolute path), or a Hub name.
std::string adapter_base_model(const std::string& dir);

// Writes adapter_config.json and adapter_model.safetensors into the existing directory `dir`
// (each atomically), one adapter chunk held at a time. base_model: base_model_name_or_path.
void adapter_write_files(const std::string& dir, const ParamLayout& layout, SegmentStore& store,
                         const std::string& base_model);

// Loads DIR/adapter_model.safetensors into the adapters' Params units (every adapter tensor the
// layout has must be there with its shape; nothing else may be).
void adapter_load_weights(const std::string& dir, const ParamLayout& layout, SegmentStore& store);

// PEFT's initialisation: lora_A kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)),
// from the run's seed (Rng); lora_B zeros (so the adapted model starts as the base).
void lora_init_random(const ParamLayout& layout, SegmentStore& store, std::uint64_t seed);

}  // namespace stratum
