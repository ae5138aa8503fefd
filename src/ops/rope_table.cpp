// RoPE inverse frequencies and cos/sin tables; see rope_table.h.
#include "ops/rope_table.h"

#include <cmath>

#include "stratum/error.h"

namespace stratum {

// Note [rope float32]: transformers builds inv_freq as a float32 tensor
// (1.0 / base ** (arange(0, dim, 2).float() / dim)), applies the llama3 / linear scaling with
// float32 tensor arithmetic (Python scalars are rounded to float32 first), and computes the
// angles as float32 inv_freq * float32 position, then cos/sin in float32. We repeat each step
// in float (pow, cos and sin are evaluated in double and rounded to float, i.e. correctly
// rounded almost always; torch's float pow/cos/sin are within 1 ulp), so the tables match
// transformers' to ~1 ulp of float and do not drift with the position.
std::vector<float> rope_inv_freq(int head_dim, double theta, const RopeScaling& scaling, bool long_factors) {
  STRATUM_CHECK(head_dim > 0 && head_dim % 2 == 0, "[kernels.rope] head_dim must be a positive even number, got ",
                head_dim);
  STRATUM_CHECK(theta > 0.0, "[kernels.rope] rope_theta must be > 0, got ", theta);
  const int half = head_dim / 2;
  const bool longrope = scaling.type == RopeScaling::Type::LongRope;
  const std::vector<double>& factors = long_factors ? scaling.long_factor : scaling.short_factor;
  STRATUM_CHECK(!longrope || factors.size() == static_cast<std::size_t>(half), "[kernels.rope] longrope ",
                long_factors ? "long_factor" : "short_factor", " must have head_dim / 2 = ", half, " entries, got ",
                factors.size());
  std::vector<float> inv(half);
  const float base = static_cast<float>(theta);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    // Note [longrope]: 1 / (factor * base^(2i/d)); 1 * p is p itself for the others.
    inv[i] = 1.0f / ((longrope ? static_cast<float>(factors[i]) : 1.0f) * p);
  }
  switch (scaling.type) {
    case RopeScaling::Type::None:
      break;
    case RopeScaling::Type::Linear: {
      STRATUM_CHECK(scaling.factor > 0.0, "[kernels.rope] linear rope_scaling factor must be > 0, got ",
                    scaling.factor);
      const float factor = static_cast<float>(scaling.factor);
      for (float& f : inv) f /= factor;
      break;
    }
    case RopeScaling::Type::Llama3: {
      STRATUM_CHECK(scaling.factor > 0.0, "[kernels.rope] llama3 rope_scaling factor must be > 0, got ",
                    scaling.factor);
      STRATUM_CHECK(scaling.low_freq_factor > 0.0 && scaling.high_freq_factor > scaling.low_freq_factor,
                    "[kernels.rope] llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor, got ",
                    scaling.low_freq_factor, " and ", scaling.high_freq_factor);
      STRATUM_CHECK(scaling.original_max_position_embeddings > 0,
                    "[kernels.rope] llama3 rope_scaling original_max_position_embeddings must be > 0, got ",
                    scaling.original_max_position_embeddings);
      const double orig = scaling.original_max_position_embeddings;
      const float factor = static_cast<float>(scaling.factor);
      const float low_freq_wavelen = static_cast<float>(orig / scaling.low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(orig / scaling.high_freq_factor);
      const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
      const float low = static_cast<float>(scaling.low_freq_factor);
      const float band = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
      const float orig_f = static_cast<float>(orig);
      for (float& f : inv) {
        const float wavelen = two_pi / f;
        const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float s = (orig_f / wavelen - low) / band;
          f = (1.0f - s) * scaled / factor + s * scaled;
        } else {
          f = scaled;
        }
      }
      break;
    }
    case RopeScaling::Type::LongRope:  // the short or long factors, above
      break;
  }
  return inv;
}

RopeTable::RopeTable(int head_dim, int max_pos, double theta, const RopeScaling& scaling, bool long_factors)
    : half_(head_dim / 2), max_pos_(max_pos) {
  STRATUM_CHECK(head_dim > 0 && head_dim % 2 == 0, "[kernels.rope] head_dim must be a positive even number, got ",
                head_dim);
  STRATUM_CHECK(max_pos > 0 && max_pos <= (1 << 24), "[kernels.rope] max_pos must be in 1..2^24, got ", max_pos);
  const std::vector<float> inv = rope_inv_freq(head_dim, theta, scaling, long_factors);
  cos_.resize(table_floats(head_dim, max_pos));
  sin_.resize(cos_.size());
  for (int pos = 0; pos < max_pos; ++pos)
    for (int i = 0; i < half_; ++i) {
      const float angle = inv[i] * static_cast<float>(pos);  // float32 product, as in transformers
      cos_[static_cast<std::size_t>(pos) * half_ + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[static_cast<std::size_t>(pos) * half_ + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  if (scaling.type == RopeScaling::Type::LongRope && scaling.attention_factor != 1.0) {
    const float f = static_cast<float>(scaling.attention_factor);  // transformers: cos() * attention_scaling
    for (float& c : cos_) c *= f;
    for (float& s : sin_) s *= f;
  }
}

void rope_check_shape(const RopeTable& table, int B, int T, int heads, int hd, std::size_t row_stride) {
  // Note [partial rotary]: the table may rotate the first part of each head only.
  STRATUM_CHECK(table.head_dim() <= hd, "[kernels.rope] head size ", hd, " is smaller than the table's rotary size ",
                table.head_dim());
  STRATUM_CHECK(B >= 0 && T >= 0 && heads >= 0, "[kernels.rope] B, T, heads must be >= 0, got ", B, ", ", T, ", ",
                heads);
  STRATUM_CHECK(row_stride >= static_cast<std::size_t>(heads) * hd || B * T <= 1,
                "[kernels.rope] row_stride ", row_stride, " is smaller than heads * hd = ", heads * hd);
}

}  // namespace stratum
