// GptConfig validation and description.
#include "model/model_config.h"

#include <cmath>

#include "stratum/error.h"

namespace stratum {

void GptConfig::validate() const {
  STRATUM_CHECK(n_layer >= 1 && n_layer <= 1024, "[model.config] n_layer must be in 1..1024, got ", n_layer);
  STRATUM_CHECK(n_head >= 1, "[model.config] n_head must be >= 1, got ", n_head);
  STRATUM_CHECK(n_embd >= 1 && n_embd <= 65536, "[model.config] n_embd must be in 1..65536, got ", n_embd);
  STRATUM_CHECK(n_embd % n_head == 0, "[model.config] n_embd (", n_embd,
                ") must be divisible by n_head (", n_head, ")");
  STRATUM_CHECK(n_ctx >= 1 && n_ctx <= 1 << 20, "[model.config] n_ctx must be in 1..1048576, got ", n_ctx);
  STRATUM_CHECK(vocab_size >= 1 && vocab_size <= 1 << 24,
                "[model.config] vocab_size must be in 1..16777216, got ", vocab_size);
  STRATUM_CHECK(layer_norm_eps > 0.0f && std::isfinite(layer_norm_eps),
                "[model.config] layer_norm_epsilon must be a finite number > 0, got ", layer_norm_eps);
}

std::string GptConfig::describe() const {
  return "L" + std::to_string(n_layer) + " H" + std::to_string(n_head) + " C" + std::to_string(n_embd) +
         " ctx" + std::to_string(n_ctx) + " V" + std::to_string(vocab_size);
}

}  // namespace stratum
