// GPT-2 family model hyper-parameters (what Hugging Face config.json describes).
// Does not hold weights or layouts: see param_layout.h.
#pragma once

#include <cstdint>
#include <string>

namespace stratum {

struct GptConfig {
  int n_layer = 0;     // transformer blocks (L)
  int n_head = 0;      // attention heads (H); n_embd % n_head == 0
  int n_embd = 0;      // channels (C)
  int n_ctx = 0;       // maximum sequence length (n_positions)
  int vocab_size = 0;  // V
  float layer_norm_eps = 1e-5f;

  int head_dim() const { return n_embd / n_head; }
  // Throws stratum::Error naming the bad field when the config cannot describe a model.
  void validate() const;
  std::string describe() const;  // "L12 H12 C768 ctx1024 V50257"
};

}  // namespace stratum
