// Model hyper-parameters of the two decoder-only families Stratum runs (what Hugging Face
// config.json describes): GPT-2 (LayerNorm, learned positions, GELU MLP, fused qkv with biases,
// LM head tied to wte) and Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention without biases, tied or untied LM head), with Qwen2 as a Llama whose q, k and v
// projections have biases and Qwen3 as a Llama whose queries and keys are RMSNorm'd per head.
// Does not hold weights or layouts: see param_layout.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "ops/attention_rows.h"
#include "ops/rope_table.h"

namespace stratum {

enum class ModelArch { Gpt2, Llama };
const char* model_arch_name(ModelArch arch);  // "gpt2", "llama" (the config.json model_type)
// A Llama-family model's config.json model_type: Qwen2 is Llama's block with biases on the q, k
// and v projections (transformers' Qwen2Attention; its o_proj has none), read and saved as
// "qwen2" (Qwen2ForCausalLM).
// Qwen2: q, k and v biases. Mistral: Llama's math with a sliding window in every layer (Note [mistral window]).
// Qwen3: q_norm and k_norm (Note [qk norm] in model/llama_block.h). Phi-3: Llama's math with fused
// projections (Note [phi3 fused]) and Mistral's window. Gemma: Note [gemma]; Gemma 3: Note [gemma3];
// Gemma 2: Note [gemma2].
enum class LlamaVariant { Llama, Qwen2, Mistral, Qwen3, Phi3, Gemma, Gemma3, Gemma2 };

// Note [gemma]
// Gemma (model_type "gemma": Gemma 2B and 7B, CodeGemma) is Llama's block and weight names with
// three changes, all as transformers' GemmaModel computes them in fp32: every RMSNorm multiplies by
// (1 + w) (GemmaRMSNorm; its weights start at 0), the MLP is GeGLU, gelu_tanh(gate) * up
// (gelu_pytorch_tanh), and the token embedding's rows are multiplied by sqrt(hidden_size) rounded
// to fp32 (the LM head, tied, reads them unscaled). Stratum keeps the stored w and hands every
// norm kernel the vector 1 + w, added in fp32 through the ops seam (`norm_offset`), so the norm's
// bits are the reference's and the weight gradient, d(1 + w)/dw = 1, is the norm's own. The
// embedding scale is the embedding kernels' `scale` (Ops::embedding_forward_block): the rows times
// the scale as they are added, and d wte += scale * d x. Heads are wider than hidden_size /
// num_attention_heads (head_dim 256). CUDA has no GeGLU kernel yet: refused on --backend cuda.

// Note [gemma3]
// Gemma 3's text models (model_type "gemma3_text", Gemma3ForCausalLM: Gemma 3 270M and 1B) are
// Gemma (Note [gemma]) with Qwen3's per-head q and k norms (Note [qk norm], by 1 + w too) and two
// more norms a block: post_attention_layernorm norms the attention's output before the residual
// add, pre_feedforward_layernorm is the MLP's input norm (Llama's post_attention_layernorm slot),
// post_feedforward_layernorm norms the MLP's output before its add (Note [post norms] in
// model/llama_block.h). Layers are sliding (layer_types "sliding_attention", or every layer but
// each sliding_window_pattern-th) or full: a sliding layer's rotary base is rope_local_base_freq
// without scaling, a full layer's rope_theta with rope_scaling. A sliding layer's queries attend
// to their last sliding_window keys (layer_window; Note [sliding window] in
// kernels/cpu/attention.cpp), so sequences run to max_position_embeddings (32768 for Gemma 3 1B,
// whose window is 512); CUDA has no windowed attention (Gemma 3 is refused there anyway).
// Attention is scaled by query_pre_attn_scalar^-1/2, which must be head_dim's;
// logit soft-capping (Gemma 2's) must be off, as in Gemma 3's configs.

// Note [gemma3 multimodal]
// Gemma 3 4B, 12B and 27B ship as multimodal checkpoints (model_type "gemma3",
// Gemma3ForConditionalGeneration): a text model and a vision tower. Stratum reads the text model:
// its config is text_config over Gemma3TextConfig's defaults (the released files list only the
// fields that differ) with the outer bos/eos ids, its tensors are the text model's under
// "language_model." (GptConfig::weights_prefix; ParamLayout::find takes a name with or without it)
// as released, or with it after the first "model." as transformers 4.52 and later save the model
// ("model.language_model.layers.0...", "model.vision_tower..."), and the vision tower's and the
// projector's tensors are passed over. What it saves is the text
// model alone: a gemma3_text Gemma3ForCausalLM directory (names without the prefix), which
// transformers loads as such; LoRA adapters are named for that text model. Gemma 3 27B's
// query_pre_attn_scalar (168, not head_dim 128) stays refused.

// Note [gemma2]
// Gemma 2 (model_type "gemma2", Gemma2ForCausalLM: Gemma 2 2B, 9B and their instruction-tuned
// versions) is Gemma 3's block without the q and k norms and with one rotary table (rope_theta)
// for every layer: Gemma's norms by 1 + w, GeGLU and scaled embedding, the four norms a block
// (Note [post norms] in model/llama_block.h), sliding layers (layer_types, by default every other
// layer from layer 0) attending to their last sliding_window keys (4096; sequences run to
// max_position_embeddings, 8192), and soft-capping twice, as transformers' Gemma2 computes it:
// every scaled attention score s becomes attn_logit_softcapping * tanh(s / attn_logit_softcapping)
// (50) before the mask and the softmax (Note [softcapping] in kernels/cpu/attention.cpp), and every
// logit l of the LM head final_logit_softcapping * tanh(l / final_logit_softcapping) (30) before
// the cross-entropy and sampling (Note [final softcapping] in kernels/cpu/softmax_xent.h). As for
// Gemma 3, query_pre_attn_scalar must be head_dim (Gemma 2 27B's 144 is refused). CUDA has none of
// it yet: refused there.
// Gemma 2's and Gemma 3's default layer patterns: each pattern-th layer is a full one.
inline constexpr int kGemma2SlidingPattern = 2;

// Note [phi3 fused]
// Phi-3 and Phi-4 (model_type "phi3": Phi-3-mini/medium, Phi-4) compute exactly Llama's block,
// but store q, k and v as one tensor, self_attn.qkv_proj.weight (rows: the Q query rows, then the
// KV key rows, then the KV value rows), and the MLP's gate and up as mlp.gate_up_proj.weight (the
// I gate rows, then the I up rows; transformers' Phi3MLP chunks it in two, gate first). Stratum
// keeps the parts in Llama's slots: each slot holds its rows of the fused tensor (TensorSlot's
// row0 and hf_shape, as a vocabulary block holds rows of the embedding), so loading, saving and
// every kernel are Llama's. Its sliding_window is Mistral's, in every layer (Note [mistral
// window]; Phi-3-mini's 2047). Its rope_scaling "longrope" (Phi-3-128k, Phi-3.5, Phi-4-mini) runs
// its short factors (Note [longrope]); a partial_rotary_factor below 1 (Phi-4-mini's 0.75) turns
// the first part of each head (Note [partial rotary]). LoRA adapters go on PEFT's fused modules (one
// lora_A over q, k and v together): Note [fused lora] in model/lora.h.

// Note [mistral window]
// Mistral (model_type "mistral") is Llama's architecture and weight names with a sliding window:
// in Hugging Face a query at position i attends to the keys at positions j <= i with i - j <
// sliding_window, in every layer; Phi-3's sliding_window is the same (Phi-3-mini-4k's 2047 of its
// 4096 positions). Every layer of such a model is a sliding layer (layer_sliding_attention), its
// window passed to the attention kernels (GptConfig::layer_scores, Note [attention scores]), which
// on the CPU skip the keys before it (Note [sliding window] in kernels/cpu/attention.cpp): a
// sequence may run to max_position_embeddings (Mistral 7B v0.1: 32768 over a window of 4096).
// The CUDA attention has no window, so there context(Backend::Cuda) caps every sequence at the
// window, within which the window cuts no key. sliding_window null (Mistral 7B v0.2 and later)
// is full causal attention. Saved as MistralForCausalLM with its window.
// Gemma3TextConfig's default sliding_window_pattern: every 6th layer is a full one.
inline constexpr int kGemma3SlidingPattern = 6;

struct GptConfig {
  ModelArch arch = ModelArch::Gpt2;
  int n_layer = 0;     // transformer blocks (L)
  int n_head = 0;      // attention (query) heads (H)
  int n_embd = 0;      // channels (C)
  int n_ctx = 0;       // maximum sequence length (n_positions / max_position_embeddings)
  int vocab_size = 0;  // V
  float layer_norm_eps = 1e-5f;  // LayerNorm eps (GPT-2) or RMSNorm eps (Llama: rms_norm_eps)

  // Llama only (GPT-2 keeps the defaults: n_kv_head = n_head, head_dim = C/H, 4C MLP, tied).
  int n_kv_head = 0;   // key/value heads (num_key_value_heads); 0 = n_head
  int n_head_dim = 0;  // head_dim; 0 = n_embd / n_head
  int n_inner = 0;     // MLP width (intermediate_size); 0 = 4 * n_embd
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Phi-3's partial_rotary_factor (Phi-4-mini's 0.75; Note [partial rotary] in ops/rope_table.h).
  double partial_rotary_factor = 1.0;
  bool tie_word_embeddings = true;
  LlamaVariant variant = LlamaVariant::Llama;
  int sliding_window = 0;  // Mistral's, Phi-3's, Gemma 2's and Gemma 3's sliding_window; 0 = none (null)
  // Gemma 2 and 3 (Note [gemma2], Note [gemma3]): per layer, whether it is a sliding layer (empty:
  // the family's pattern, each kGemma2SlidingPattern-th or kGemma3SlidingPattern-th layer full),
  // and Gemma 3's sliding layers' rotary base (rope_local_base_freq, unscaled).
  std::vector<std::uint8_t> layer_sliding;
  double rope_local_theta = 10000.0;
  // Gemma 2's soft-capping (Note [gemma2]): attn_logit_softcapping and final_logit_softcapping;
  // 0 = none (null).
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // The prefix of the model's tensor names in the directory it was read from: "language_model."
  // for a multimodal Gemma 3 checkpoint (Note [gemma3 multimodal]); empty otherwise, and in what
  // Stratum saves.
  std::string weights_prefix;
  // Token ids from config.json (-1 when absent); eos may list several (Llama 3 instruct).
  std::int32_t bos_token_id = -1;
  std::vector<std::int32_t> eos_token_ids;

  bool llama() const { return arch == ModelArch::Llama; }
  // Note [phi3 fused]: q, k, v and gate, up stored as two fused Hugging Face tensors.
  bool fused_projections() const { return llama() && variant == LlamaVariant::Phi3; }
  bool qkv_bias() const { return llama() && variant == LlamaVariant::Qwen2; }  // q_proj/k_proj/v_proj.bias
  bool qk_norm() const {  // self_attn.q_norm/k_norm.weight
    return llama() && (variant == LlamaVariant::Qwen3 || variant == LlamaVariant::Gemma3);
  }
  // Note [gemma]: RMSNorms multiply by 1 + w, GeGLU MLP, the embedding scaled by sqrt(hidden_size);
  // Gemma, Gemma 2 (Note [gemma2]) and Gemma 3 (Note [gemma3]).
  bool gemma() const {
    return llama() && (variant == LlamaVariant::Gemma || variant == LlamaVariant::Gemma2 || variant == LlamaVariant::Gemma3);
  }
  bool gemma2() const { return llama() && variant == LlamaVariant::Gemma2; }
  bool gemma3() const { return llama() && variant == LlamaVariant::Gemma3; }
  // Note [gemma3]: the attention's and the MLP's outputs RMSNorm'd before their residual adds.
  bool post_norms() const { return gemma2() || gemma3(); }
  // Note [gemma2], Note [gemma3]: whether layer l is a sliding layer.
  bool layer_sliding_attention(int l) const;
  // Note [gemma3]: whether layer l is a Gemma 3 sliding layer, whose rotary table is
  // rope_local_theta's, unscaled.
  bool layer_local_rope(int l) const { return gemma3() && layer_sliding_attention(l); }
  // What layer l's attention does to its scores (Note [attention scores] in ops/attention_rows.h):
  // a sliding layer's window (sliding_window; else 0, all keys) and Gemma 2's soft-capping.
  AttentionScores layer_scores(int l) const {
    return {layer_sliding_attention(l) ? sliding_window : 0, attn_softcap};
  }
  float norm_offset() const { return gemma() ? 1.0f : 0.0f; }  // added to every RMSNorm weight
  bool gelu_mlp() const { return gemma(); }                     // gelu_tanh(gate) * up, not silu(gate) * up
  float embed_scale() const;                                   // sqrt(hidden_size) as fp32 (Gemma), else 1
  // "gpt2", "llama", "qwen2", "mistral", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text": config.json's model_type
  const char* family() const;
  // "GPT-2", "Llama", "Qwen2", "Mistral", "Qwen3", "Phi-3", "Gemma", "Gemma 2", "Gemma 3": for messages
  const char* family_title() const;
  // The longest sequence the model runs exactly, on the CPU: n_ctx.
  int context() const { return context_limit(Backend::Cpu).first; }
  // What `backend` runs of it: a Mistral's or Phi-3's sliding window caps it on a backend without
  // windowed attention (CUDA; Note [mistral window]).
  int context(Backend backend) const { return context_limit(backend).first; }
  // What limits context(backend) and its config.json name: n_ctx, or (CUDA) sliding_window.
  std::pair<int, const char*> context_limit(Backend backend) const;
  // "n_ctx=1024" or "sliding_window=4096 (the cuda attention has no window; --backend cpu runs
  // n_ctx=32768)": context_limit(backend), for messages.
  std::string context_text(Backend backend) const;
  // The longest sequence generation runs: context(backend), or a LongRoPE model's
  // original_max_position_embeddings (its decoder runs the short factors only, Note [longrope]
  // in ops/rope_table.h); its name, and for messages "original_max_position_embeddings=4096
  // (generation runs longrope's short factors)".
  std::pair<int, const char*> generation_context_limit(Backend backend) const;
  int generation_context(Backend backend) const { return generation_context_limit(backend).first; }
  std::string generation_context_text(Backend backend) const;
  // Note [longrope]: whether sequences of `seq` positions turn by LongRoPE's long factors (past
  // original_max_position_embeddings), as transformers does for a forward that long.
  bool rope_long_factors(int seq) const {
    return rope_scaling.type == RopeScaling::Type::LongRope && seq > rope_scaling.original_max_position_embeddings;
  }
  int head_dim() const { return n_head_dim > 0 ? n_head_dim : n_embd / n_head; }
  // The channels of a head the rotary embedding turns (Note [partial rotary]): int(head_dim *
  // partial_rotary_factor), as transformers rounds it.
  int rotary_dim() const { return static_cast<int>(head_dim() * partial_rotary_factor); }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  int q_dim() const { return n_head * head_dim(); }      // query width (H * hd)
  int kv_dim() const { return kv_heads() * head_dim(); }  // key (and value) width (KV * hd)
  // Throws stratum::Error naming the bad field when the config cannot describe a model.
  void validate() const;
  std::string describe() const;  // "L12 H12 C768 ctx1024 V50257"; Llama's (or Qwen2's) "llama L.. KV8 hd64 I8192 untied"
  // Throws Error ("[<who>] ...: use --backend cpu") when `backend` has no kernels for this model:
  // Qwen3's per-head q and k norm on CUDA (Note [qk norm] in model/llama_block.h), Gemma's GeGLU (Note [gemma]).
  void backend_check(Backend backend, const char* who) const;
};

}  // namespace stratum
