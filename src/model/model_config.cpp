// GptConfig validation and description.
#include "model/model_config.h"

#include <cmath>
#include <string_view>

#include "stratum/error.h"

namespace stratum {

const char* model_arch_name(ModelArch arch) { return arch == ModelArch::Llama ? "llama" : "gpt2"; }

const char* GptConfig::family() const {
  if (!llama()) return model_arch_name(arch);
  switch (variant) {
    case LlamaVariant::Qwen2: return "qwen2";
    case LlamaVariant::Mistral: return "mistral";
    case LlamaVariant::Qwen3: return "qwen3";
    case LlamaVariant::Phi3: return "phi3";
    case LlamaVariant::Gemma: return "gemma";
    case LlamaVariant::Gemma2: return "gemma2";
    case LlamaVariant::Gemma3: return "gemma3_text";
    case LlamaVariant::Llama: break;
  }
  return "llama";
}
const char* GptConfig::family_title() const {
  if (!llama()) return "GPT-2";
  switch (variant) {
    case LlamaVariant::Qwen2: return "Qwen2";
    case LlamaVariant::Mistral: return "Mistral";
    case LlamaVariant::Qwen3: return "Qwen3";
    case LlamaVariant::Phi3: return "Phi-3";
    case LlamaVariant::Gemma: return "Gemma";
    case LlamaVariant::Gemma2: return "Gemma 2";
    case LlamaVariant::Gemma3: return "Gemma 3";
    case LlamaVariant::Llama: break;
  }
  return "Llama";
}

void GptConfig::validate() const {
  // Each field by the name its family's config.json gives it (Llama's as Hugging Face writes them).
  const bool l = llama();
  STRATUM_CHECK(n_layer >= 1 && n_layer <= 1024, "[model.config] ", l ? "num_hidden_layers" : "n_layer",
                " must be in 1..1024, got ", n_layer);
  STRATUM_CHECK(n_head >= 1 && n_head <= 4096, "[model.config] ", l ? "num_attention_heads" : "n_head",
                " must be in 1..4096, got ", n_head);
  STRATUM_CHECK(n_embd >= 1 && n_embd <= 65536, "[model.config] ", l ? "hidden_size" : "n_embd",
                " must be in 1..65536, got ", n_embd);
  STRATUM_CHECK(n_ctx >= 1 && n_ctx <= 1 << 20, "[model.config] ", l ? "max_position_embeddings" : "n_ctx",
                " must be in 1..1048576, got ", n_ctx);
  STRATUM_CHECK(vocab_size >= 1 && vocab_size <= 1 << 24,
                "[model.config] vocab_size must be in 1..16777216, got ", vocab_size);
  STRATUM_CHECK(layer_norm_eps > 0.0f && std::isfinite(layer_norm_eps), "[model.config] ",
                l ? "rms_norm_eps" : "layer_norm_epsilon", " must be a finite number > 0, got ", layer_norm_eps);
  if (!llama()) {
    STRATUM_CHECK(n_embd % n_head == 0, "[model.config] n_embd (", n_embd, ") must be divisible by n_head (", n_head,
                  ")");
    STRATUM_CHECK(n_kv_head == 0 || n_kv_head == n_head, "[model.config] GPT-2 has no grouped-query attention");
    STRATUM_CHECK(n_inner == 0 || n_inner == 4 * n_embd, "[model.config] GPT-2's MLP width is 4 * n_embd");
    STRATUM_CHECK(n_head_dim == 0 || n_head_dim * n_head == n_embd, "[model.config] GPT-2's head_dim is n_embd / n_head");
    STRATUM_CHECK(tie_word_embeddings, "[model.config] GPT-2's LM head is tied to wte");
    STRATUM_CHECK(variant == LlamaVariant::Llama,
                  "[model.config] a Qwen2, Qwen3, Mistral, Phi-3 or Gemma model is of the Llama family");
    return;
  }
  STRATUM_CHECK(sliding_window >= 0 && (sliding_window == 0 || variant == LlamaVariant::Mistral ||
                                        variant == LlamaVariant::Phi3 || gemma2() || gemma3()),
                "[model.config] sliding_window must be >= 1 (or null) and belongs to Mistral, Phi-3, Gemma 2 or Gemma 3, got ",
                sliding_window);
  STRATUM_CHECK(layer_sliding.empty() ||
                    ((gemma2() || gemma3()) && layer_sliding.size() == static_cast<std::size_t>(n_layer)),
                "[model.config] layer_types must name one type per layer (Gemma 2's or 3's), got ", layer_sliding.size(),
                " for ", n_layer, " layers");
  for (const auto& [cap, name] : {std::pair{attn_softcap, "attn_logit_softcapping"},
                                  std::pair{final_softcap, "final_logit_softcapping"}})  // Note [gemma2]
    STRATUM_CHECK(cap == 0.0f || (gemma2() && cap > 0.0f && cap < 1e30f), "[model.config] ", name,
                  " must be null or a finite number > 0 and belongs to Gemma 2, got ", cap);
  STRATUM_CHECK(rope_local_theta > 0 && std::isfinite(rope_local_theta),
                "[model.config] rope_local_base_freq must be a finite number > 0, got ", rope_local_theta);
  STRATUM_CHECK(n_head_dim > 0 || n_embd % n_head == 0, "[model.config] hidden_size (", n_embd,
                ") must be divisible by num_attention_heads (", n_head, ") unless head_dim is given");
  const int hd = head_dim();
  STRATUM_CHECK(hd >= 2 && hd % 2 == 0 && hd <= 1024, "[model.config] head_dim must be even and in 2..1024, got ", hd);
  STRATUM_CHECK(kv_heads() >= 1 && n_head % kv_heads() == 0, "[model.config] num_attention_heads (", n_head,
                ") must be a multiple of num_key_value_heads (", kv_heads(), ")");
  STRATUM_CHECK(mlp_width() >= 1 && mlp_width() <= 1 << 20, "[model.config] intermediate_size must be in 1..1048576, got ",
                mlp_width());
  STRATUM_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "[model.config] rope_theta must be a finite number > 0, got ",
                rope_theta);
  STRATUM_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1 &&
                    (partial_rotary_factor == 1 || variant == LlamaVariant::Phi3),
                "[model.config] partial_rotary_factor must be in (0, 1] (below 1: Phi-3's), got ", partial_rotary_factor);
  STRATUM_CHECK(rotary_dim() >= 2 && rotary_dim() % 2 == 0, "[model.config] head_dim * partial_rotary_factor (",
                hd, " * ", partial_rotary_factor, ") must give an even rotary size of at least 2, got ", rotary_dim());
  const RopeScaling& s = rope_scaling;
  if (s.type != RopeScaling::Type::None)
    STRATUM_CHECK(s.factor >= 1.0 && std::isfinite(s.factor), "[model.config] rope_scaling.factor must be >= 1, got ",
                  s.factor);
  if (s.type == RopeScaling::Type::LongRope) {  // Note [longrope]
    const std::size_t half = static_cast<std::size_t>(rotary_dim() / 2);  // Note [partial rotary]
    STRATUM_CHECK(s.short_factor.size() == half && s.long_factor.size() == half,
                  "[model.config] rope_scaling (longrope) needs short_factor and long_factor of rotary_dim / 2 = ", half,
                  " numbers each, got ", s.short_factor.size(), " and ", s.long_factor.size());
    for (const auto* list : {&s.short_factor, &s.long_factor})
      for (double f : *list)
        STRATUM_CHECK(f > 0 && std::isfinite(f), "[model.config] rope_scaling (longrope) factors must be finite and > 0, got ",
                      f);
    STRATUM_CHECK(s.original_max_position_embeddings >= 1 && s.attention_factor > 0 && std::isfinite(s.attention_factor),
                  "[model.config] longrope needs original_max_position_embeddings >= 1 and attention_factor > 0, got ",
                  s.original_max_position_embeddings, " and ", s.attention_factor);
  }
  if (s.type == RopeScaling::Type::Llama3) {
    STRATUM_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor),
                  "[model.config] rope_scaling needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor,
                  " and ", s.high_freq_factor);
    STRATUM_CHECK(s.original_max_position_embeddings >= 1,
                  "[model.config] rope_scaling.original_max_position_embeddings must be >= 1, got ",
                  s.original_max_position_embeddings);
  }
}

bool GptConfig::layer_sliding_attention(int l) const {
  if (!llama() || l < 0 || l >= n_layer) return false;
  // Note [mistral window]: every layer of a Mistral or Phi-3 with a window.
  if (variant == LlamaVariant::Mistral || variant == LlamaVariant::Phi3) return sliding_window > 0;
  if (!(gemma2() || gemma3())) return false;
  if (layer_sliding.empty()) return (l + 1) % (gemma2() ? kGemma2SlidingPattern : kGemma3SlidingPattern) != 0;
  return layer_sliding[static_cast<std::size_t>(l)] != 0;
}

float GptConfig::embed_scale() const {
  return gemma() ? static_cast<float>(std::sqrt(static_cast<double>(n_embd))) : 1.0f;  // GemmaModel's normalizer
}

void GptConfig::backend_check(Backend backend, const char* who) const {
  STRATUM_CHECK(backend == Backend::Cpu || rotary_dim() == head_dim(), "[", who, "] ", family_title(),
                " models with a partial_rotary_factor below 1 have no ", backend_name(backend),
                " rotary kernel for it yet: use --backend cpu");
  STRATUM_CHECK(backend == Backend::Cpu || !(qk_norm() || gemma()), "[", who, "] ", family_title(), " models (",
                gemma3()  ? "GeGLU MLP, RMSNorms by 1 + w, per-head q and k RMSNorm, scaled embedding"
                : gemma2() ? "GeGLU MLP, RMSNorms by 1 + w, soft-capping, sliding window, scaled embedding"
                : gemma() ? "GeGLU MLP, RMSNorm by 1 + w, scaled embedding"
                          : "per-head q and k RMSNorm",
                ") have no ", backend_name(backend), " kernels yet: use --backend cpu");
}

std::pair<int, const char*> GptConfig::context_limit(Backend backend) const {
  std::pair<int, const char*> limit{n_ctx, "n_ctx"};
  // Note [mistral window]: a backend without windowed attention runs up to the window, where it
  // cuts no key (Gemma 2 and 3, whose full layers run past it, are refused there: backend_check).
  if (backend != Backend::Cpu && sliding_window > 0 && sliding_window < limit.first && !(gemma2() || gemma3()))
    limit = {sliding_window, "sliding_window"};
  return limit;
}

std::pair<int, const char*> GptConfig::generation_context_limit(Backend backend) const {
  std::pair<int, const char*> limit = context_limit(backend);
  if (rope_scaling.type == RopeScaling::Type::LongRope && rope_scaling.original_max_position_embeddings < limit.first)
    limit = {rope_scaling.original_max_position_embeddings, "original_max_position_embeddings"};  // Note [longrope]
  return limit;
}

std::string GptConfig::generation_context_text(Backend backend) const {
  const auto [tokens, name] = generation_context_limit(backend);
  if (std::string_view(name) != "original_max_position_embeddings") return context_text(backend);
  return std::string(name) + "=" + std::to_string(tokens) + " (generation runs longrope's short factors)";
}

std::string GptConfig::context_text(Backend backend) const {
  const auto [tokens, name] = context_limit(backend);
  const std::string_view limit(name);
  std::string text = std::string(name) + "=" + std::to_string(tokens);
  if (limit == "sliding_window")
    text += std::string(" (the ") + backend_name(backend) + " attention has no sliding window; --backend cpu runs " +
            context_limit(Backend::Cpu).second + "=" + std::to_string(context()) + ")";
  return text;
}

std::string GptConfig::describe() const {
  std::string text = "L" + std::to_string(n_layer) + " H" + std::to_string(n_head) + " C" + std::to_string(n_embd) +
                     " ctx" + std::to_string(n_ctx) + " V" + std::to_string(vocab_size);
  if (llama())
    text = std::string(family()) + " " + text + " KV" + std::to_string(kv_heads()) + " hd" + std::to_string(head_dim()) + " I" +
           std::to_string(mlp_width()) + (tie_word_embeddings ? " tied" : " untied") +
           (sliding_window > 0 ? " window" + std::to_string(sliding_window) : "");
  return text;
}

}  // namespace stratum
