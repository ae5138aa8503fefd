// Rotary position embedding (RoPE) tables, Hugging Face Llama "rotate-half" convention: the
// frequency scaling settings (none, linear, llama3), the float32 inverse frequencies and the
// cos/sin tables. Backend-independent data: the CPU kernels read it, a device backend would copy
// it to its memory. Does not rotate anything (that is the ops' rope_forward / rope_backward) and
// does not support dynamic / YaRN scaling.
#pragma once

#include <cstddef>
#include <vector>

namespace stratum {

// Note [longrope]
// Phi-3.5 and Phi-3's 128k models scale their rotary frequencies by LongRoPE (rope_scaling type
// "longrope", transformers' _compute_longrope_parameters): inv_freq[i] = 1 / (ext[i] * theta^(2i/d))
// with ext the short_factor list while the sequence is at most original_max_position_embeddings
// long and the long_factor list beyond it, and cos and sin multiplied by an attention factor
// (the config's attention_factor, else sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings
// / original, 1 when s <= 1). transformers picks the factors per forward by its longest position
// (_longrope_frequency_update: seq_len = max(position_ids) + 1): a forward of more than
// original_max_position_embeddings positions turns every position, the first ones too, by the
// long factors. Training and evaluation run sequences of one length, so their tables are the long
// factors' when --seq is longer than the original context (GptConfig::rope_long_factors; up to
// max_position_embeddings, Phi-3.5-mini's 131072) and the short ones otherwise, as transformers
// computes them. In generation transformers keeps the keys its cache rotated with the short
// factors once later positions turn by the long ones (or turns a whole prompt longer than the
// original context by the long ones); Stratum's decoder runs the short factors only and caps a
// generated sequence at the original context (GptConfig::generation_context: 4096 for
// Phi-3.5-mini).

// The `rope_scaling` block of a Hugging Face config (rope_type "linear", "llama3" or "longrope").
struct RopeScaling {
  enum class Type { None, Linear, Llama3, LongRope };
  Type type = Type::None;
  double factor = 1.0;                          // linear and llama3
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int original_max_position_embeddings = 8192;  // llama3, longrope (Phi-3's top-level field)
  std::vector<double> short_factor, long_factor;  // longrope (Note [longrope]): head_dim / 2 each
  double attention_factor = 1.0;                // longrope: cos and sin multiplied by it
  bool attention_factor_given = false;          // longrope: the config states it (else computed)
};

// inv_freq (head_dim/2) fp32 = 1 / theta^(2i/head_dim), then scaled: Linear divides every
// frequency by factor; Llama3 follows transformers' _compute_llama3_parameters (long
// wavelengths divided by factor, short ones kept, a smooth blend in between); LongRope divides
// each by its short factor, or with long_factors its long one (Note [longrope]). Computed in
// float32 step by step the way transformers does it (Note [rope float32] in rope.cpp).
std::vector<float> rope_inv_freq(int head_dim, double theta, const RopeScaling& scaling, bool long_factors = false);

// cos/sin tables of the angles pos * inv_freq[i] for positions 0..max_pos-1.
class RopeTable {
 public:
  // long_factors: LongRoPE's long factors (Note [longrope]); ignored by the other scalings.
  RopeTable(int head_dim, int max_pos, double theta, const RopeScaling& scaling, bool long_factors = false);
  // Bytes a table for (head_dim, max_pos) holds: cos and sin, (max_pos, head_dim/2) floats each.
  static std::size_t bytes_for(int head_dim, int max_pos) {
    return 2 * sizeof(float) * table_floats(head_dim, max_pos);
  }

  const float* cos(int pos) const { return cos_.data() + static_cast<std::size_t>(pos) * half_; }  // (head_dim/2)
  const float* sin(int pos) const { return sin_.data() + static_cast<std::size_t>(pos) * half_; }  // (head_dim/2)
  int head_dim() const { return 2 * half_; }
  int max_pos() const { return max_pos_; }

 private:
  static std::size_t table_floats(int head_dim, int max_pos) {
    return static_cast<std::size_t>(max_pos) * (head_dim / 2);
  }
  int half_;                // head_dim / 2
  int max_pos_;
  std::vector<float> cos_;  // (max_pos, head_dim/2) fp32
  std::vector<float> sin_;  // (max_pos, head_dim/2) fp32
};

// Note [partial rotary]: Phi-4-mini rotates the first partial_rotary_factor of each head's
// channels only (transformers' Phi3: rotate-half over q[..., :rotary_dim], the rest passed
// through): its tables are built for rotary_dim = int(head_dim * partial_rotary_factor)
// (GptConfig::rotary_dim; longrope's factors are rotary_dim / 2 long), and the rotation of a head
// of hd channels pairs channel i with i + rotary_dim / 2 for i < rotary_dim / 2, leaving channels
// rotary_dim.. as they are.

// Throws Error (one line) unless rope_forward/rope_backward can rotate `heads` vectors of hd
// floats in B*T rows row_stride apart with `table`: the table's head_dim (the rotary size, Note
// [partial rotary]) is at most hd, the counts are >= 0, the rows do not overlap. Both backends
// call it before touching memory.
void rope_check_shape(const RopeTable& table, int B, int T, int heads, int hd, std::size_t row_stride);

}  // namespace stratum
