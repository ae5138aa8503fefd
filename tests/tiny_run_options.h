// The tiny training and greedy-generation runs the device-tier and CUDA tests share
// (tests/device_tier_test.cpp, tests/cuda_train_test.cpp, tests/cuda_generate_test.cpp): a
// 2-layer GPT-2 or grouped-query Llama on the golden token file, and greedy decoding of three
// prompts of different lengths in one batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infer/generator.h"
#include "integration_util.h"
#include "train/trainer.h"

namespace stratum::testing {

inline TrainOptions tiny_train_options(bool llama, const std::string& log = "") {
  TrainOptions o;
  o.config.arch = llama ? ModelArch::Llama : ModelArch::Gpt2;
  o.config.n_layer = 2;
  o.config.n_head = 4;
  o.config.n_embd = 64;
  o.config.n_ctx = 64;
  o.config.vocab_size = 211;
  if (llama) {
    o.config.n_kv_head = 2;
    o.config.n_inner = 160;
    o.config.tie_word_embeddings = false;
  }
  o.data_path = source_path("tests/golden/tiny_gpt2/tokens.bin");
  o.batch = 3;
  o.seq = 32;
  o.steps = 8;
  o.lr.max_lr = 3e-3;
  o.lr.warmup_steps = 2;
  o.quiet = true;
  o.threads = 2;
  o.log_path = log;
  return o;
}

inline GenerateOptions greedy_generate_options(const std::string& dir) {
  GenerateOptions o;
  o.model_dir = source_path(dir);
  o.prompt_ids = {{5, 17, 2, 40, 33, 8}, {9, 1}, {3, 60, 21, 7}};
  o.batch = 3;
  o.max_tokens = 12;
  o.temperature = 0.0;
  o.stop_at_eos = false;
  o.threads = 2;
  o.quiet = true;
  return o;
}

// The generated ids of each prompt; `result` (may be null) receives the run's figures.
inline std::vector<std::vector<std::int32_t>> generated_ids(const GenerateOptions& o, GenerateResult* result = nullptr) {
  const GenerateResult r = generate_run(o, [](int, std::int32_t, const std::string&) {});
  if (result != nullptr) *result = r;
  std::vector<std::vector<std::int32_t>> out;
  for (const GenerateSequence& s : r.sequences) out.push_back(s.tokens);
  return out;
}

}  // namespace stratum::testing
