// What every backend's attention kernels share about their arguments (kernels/cpu/attention.h,
// kernels/cuda/attention_rows.cuh): the shape checks, and the query rows [r0, r0 + n) of the B*T
// rows as each sequence's part of them (Note [attention row ranges] in kernels/cpu/attention.h).
// One definition, compiled for the host and (STRATUM_HOST_DEVICE) for a device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.h"
#include "stratum/error.h"

namespace stratum {

// Note [attention scores]: what a layer does to its attention scores besides scaling them by
// head_dim^-1/2 and the causal mask, the same in the forward, its backward and the cached variant:
// - window > 0: each query attends to its last `window` keys, itself among them (every layer
//   of a Mistral or Phi-3 with a window, Gemma 2's and Gemma 3's sliding layers; Note [sliding
//   window] in kernels/cpu/attention.cpp);
// - softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) before the softmax (Gemma
//   2's attn_logit_softcapping; Note [softcapping] in kernels/cpu/attention.cpp).
// {} is plain causal attention, the models' without a window or caps. A backend without them
// (CUDA) takes only scores that are plain within its sequences: GptConfig::backend_check refuses
// Gemma 2 and 3, and context(backend) keeps a Mistral's or Phi-3's sequences within their window
// (Note [mistral window] in model/model_config.h).
struct AttentionScores {
  int window = 0;
  float softcap = 0.0f;
  // Plain causal attention over sequences of at most `positions` positions: no cap, and no window
  // or one that cuts no key (a query sees at most `positions` keys, itself among them).
  bool plain_within(int positions) const { return softcap == 0.0f && (window == 0 || window >= positions); }
};
// Note [sliding KV cache] (infer/decoder.h): a sliding layer's KV cache may start at a position
// other than 0, always a multiple of this; positions relative to it give every backend's cached
// attention the bits of the whole cache (their key tiles divide it: the CPU's are 32 keys).
inline constexpr int kCacheShiftAlign = 256;

// window >= 0 and a finite softcap >= 0: one line naming `what` otherwise.
inline void attention_check_scores(const char* what, AttentionScores s) {
  STRATUM_CHECK(s.window >= 0, "[kernels.attention] ", what, ": window must be >= 0, got ", s.window);
  STRATUM_CHECK(s.softcap >= 0.0f && s.softcap < 3.0e38f, "[kernels.attention] ", what,
                ": softcap must be finite and >= 0, got ", s.softcap);
}

// Sequence b's query positions [q0, q1) among the range's rows (empty when q0 >= q1), and where
// row (b, q0) is among the range's own n rows.
struct SeqRange {
  int q0, q1;
  std::size_t local0;
};

// The range's rows as whole or partial sequences first .. first + seqs - 1.
struct RowRange {
  int r0, n, T, first, seqs;
  // The part of sequence first + i.
  STRATUM_HOST_DEVICE SeqRange seq(int i) const {
    const std::int64_t b = first + i, lo = b * T, hi = lo + T;
    const std::int64_t q0 = (r0 > lo ? r0 : lo) - lo;
    const std::int64_t end = static_cast<std::int64_t>(r0) + n;
    const std::int64_t q1 = (end < hi ? end : hi) - lo;
    return SeqRange{static_cast<int>(q0), static_cast<int>(q1 > q0 ? q1 : q0), static_cast<std::size_t>(lo + q0 - r0)};
  }
};

// B, T >= 0, H, KV, hd > 0, H a multiple of KV: one line naming `what` otherwise.
inline void attention_check_shape(const char* what, int B, int T, int H, int KV, int hd) {
  STRATUM_CHECK(B >= 0 && T >= 0, "[kernels.attention] ", what, ": B and T must be >= 0, got ", B, " and ", T);
  STRATUM_CHECK(H > 0 && KV > 0 && hd > 0, "[kernels.attention] ", what, ": H, KV, hd must be > 0, got ", H, ", ",
                KV, ", ", hd);
  STRATUM_CHECK(H % KV == 0, "[kernels.attention] ", what, ": query heads H=", H,
                " must be a multiple of the key/value heads KV=", KV);
}

// The query rows [r0, r0 + n) of B sequences of T rows, checked to lie among them.
inline RowRange attention_row_range(const char* what, int B, int T, int r0, int n) {
  const std::int64_t rows = static_cast<std::int64_t>(B) * T, end = static_cast<std::int64_t>(r0) + n;
  STRATUM_CHECK(r0 >= 0 && n >= 0 && end <= rows, "[kernels.attention] ", what, ": query rows [", r0, ", ", end,
                ") are outside the ", rows, " rows of B=", B, " T=", T);
  const int first = T > 0 ? r0 / T : 0;
  const int seqs = (T == 0 || n == 0) ? 0 : static_cast<int>((end - 1) / T) + 1 - first;
  return RowRange{r0, n, T, first, seqs};
}

}  // namespace stratum
