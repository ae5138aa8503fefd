// Reads and writes Hugging Face GPT-2 config.json files (the "gpt2" model_type).
// Reading checks the fields Stratum's GPT-2 needs and refuses options it does not implement;
// writing produces a config that transformers' GPT2LMHeadModel.from_pretrained accepts.
// Does not handle other architectures (Llama comes later), tokenizer or generation configs.
#pragma once

#include <string>

#include "model/model_config.h"

namespace stratum {

// Throws stratum::Error ("[hf_config] '<path>': ...") for a missing or malformed file, a
// model_type other than "gpt2", missing or non-integer size fields, unsupported options, or a
// config that GptConfig::validate() rejects.
GptConfig hf_config_read_gpt2(const std::string& config_json_path);

// Validates cfg, then writes config.json atomically (temporary file + fsync + rename).
void hf_config_write_gpt2(const std::string& config_json_path, const GptConfig& cfg);

}  // namespace stratum
