// Reads and writes Hugging Face config.json files of the "gpt2", "llama", "qwen2", "qwen3",
// "mistral", "phi3", "gemma", "gemma2" and "gemma3_text" model types (Qwen2: a Llama with q, k and
// v biases; Qwen3: a Llama with per-head q and k RMSNorms, Note [qk norm]; Mistral: a Llama within
// its sliding window, Note [mistral window]; Phi-3: a Llama with fused projections, Note [phi3
// fused]; the Gemmas: Note [gemma], Note [gemma2], Note [gemma3]; GptConfig::variant). Reading checks the fields Stratum needs and refuses
// options it does not implement (other model types, rope scalings other than llama3/linear,
// biases in Llama projections, Qwen2's and Qwen3's sliding window, activations other than GELU-tanh / SiLU);
// writing produces a config that transformers' GPT2LMHeadModel / LlamaForCausalLM /
// Qwen2ForCausalLM / Qwen3ForCausalLM / MistralForCausalLM / Phi3ForCausalLM / GemmaForCausalLM /
// Gemma2ForCausalLM / Gemma3ForCausalLM.from_pretrained accepts. Does not handle tokenizer or
// generation configs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace stratum {

// Throws stratum::Error ("[hf_config] '<path>': ...") for a missing or malformed file, a
// model_type other than "gpt2", "llama", "qwen2", "qwen3", "mistral" or "phi3" (absent = "gpt2"), missing or
// non-integer size fields,
// unsupported options, or a config that GptConfig::validate() rejects.
GptConfig hf_config_read(const std::string& config_json_path);

// Note [generation config]: a model directory's generation_config.json, what transformers'
// generate() starts from: do_sample (false: greedy), temperature, top_k and top_p (used when
// sampling; transformers' defaults 1.0, 50 and 1.0 where the file leaves one out),
// repetition_penalty (greedy or not; Note [repetition penalty] in infer/generator.h) and eos_token_id
// (more stop tokens than config.json's: Qwen3's <|endoftext|> beside <|im_end|>, Llama 3.1
// Instruct's three). `stratum generate` takes the sampling values its flags do not give and stops
// at every eos id of both files; saves carry the file. Other fields (max_new_tokens, min_p,
// no_repeat_ngram_size, ...) are not used.
struct HfGenerationConfig {
  bool present = false;  // the file exists
  bool do_sample = false;
  double temperature = 1.0;
  int top_k = 50;
  double top_p = 1.0;
  double repetition_penalty = 1.0;  // 1: none
  std::vector<std::int32_t> eos_token_ids;
};
// Reads `path` (absent: present false, the defaults). Throws stratum::Error ("[hf_config] '<path>':
// ...") for a file that is not a JSON object or a field of the wrong type or range.
HfGenerationConfig hf_generation_config_read(const std::string& path);

// Validates cfg, then writes config.json atomically (temporary file + fsync + rename).
// torch_dtype: what the weights beside it are stored as ("float32" or "bfloat16").
void hf_config_write(const std::string& config_json_path, const GptConfig& cfg, const char* torch_dtype = "float32");

}  // namespace stratum
