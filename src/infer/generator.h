// `stratum generate`: autoregressive sampling from a GPT-2 model, streaming each token's text as
// soon as it is chosen. Recomputes the (cropped) context every token; no KV cache yet.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stratum {

struct GenerateOptions {
  std::string model_dir;
  std::string tokenizer_dir;  // default: the model directory's vocab.json + merges.txt
  std::string prompt;
  int max_tokens = 64;
  double temperature = 1.0;   // 0 = greedy
  int top_k = 0;              // 0 = no top-k filter
  std::uint64_t seed = 1337;
  int threads = 0;
  bool stop_at_eot = true;
};

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated ids (without the prompt)
  double tokens_per_s = 0.0;
};

// Calls on_text with the bytes of each generated token, in order.
GenerateResult generate_run(const GenerateOptions& options, const std::function<void(const std::string&)>& on_text);

// Picks the next token from logits (V): argmax when temperature == 0 (lowest id on ties), else
// samples softmax(logits / temperature) restricted to the top_k largest (ties by lower id).
std::int32_t sample_next_token(const float* logits, int V, double temperature, int top_k, double uniform01);

}  // namespace stratum
