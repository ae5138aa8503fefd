// Final LayerNorm + tied LM head + cross-entropy in row chunks; see gpt2_head.h.
#include "model/gpt2_head.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/softmax_xent.h"

namespace stratum {

Gpt2HeadScratch::Gpt2HeadScratch(const GptConfig& cfg, int max_rows) {
  const std::size_t R = static_cast<std::size_t>(max_rows), C = cfg.n_embd, V = cfg.vocab_size;
  buffer_ = aligned_buffer_carve({{&lnf, R * C}, {&mean, R}, {&rstd, R}, {&logits, kHeadRows * V}, {&losses, R},
                                  {&dlnf, R * C}});
}

float gpt2_head_loss(ThreadPool& pool, const GptConfig& cfg, const Gpt2HeadParams& p, const Gpt2HeadGrads* g,
                     const float* x, const std::int32_t* targets, int BT, Gpt2HeadScratch& s) {
  const int C = cfg.n_embd, V = cfg.vocab_size;
  layernorm_forward(pool, s.lnf, s.mean, s.rstd, x, p.lnf_w, p.lnf_b, BT, C, cfg.layer_norm_eps);
  const float dloss = 1.0f / static_cast<float>(BT);
  for (int r0 = 0; r0 < BT; r0 += kHeadRows) {
    const int rows = std::min(kHeadRows, BT - r0);
    const float* xr = s.lnf + static_cast<std::size_t>(r0) * C;
    // logits (rows, V) = lnf (rows, C) @ wte^T
    sgemm(false, true, rows, V, C, 1.0f, xr, C, p.wte, C, 0.0f, s.logits, V);
    softmax_xent(pool, s.losses + r0, g ? s.logits : nullptr, s.logits, targets + r0, rows, V, dloss);
    if (g != nullptr) {
      // dlnf (rows, C) = dlogits @ wte ; dwte (V, C) (+)= dlogits^T @ lnf
      sgemm(false, false, rows, C, V, 1.0f, s.logits, V, p.wte, C, 0.0f, s.dlnf + static_cast<std::size_t>(r0) * C, C);
      sgemm(true, false, V, C, rows, 1.0f, s.logits, V, xr, C, r0 == 0 ? 0.0f : 1.0f, g->wte, C);
    }
  }
  double total = 0.0;
  for (int r = 0; r < BT; ++r) total += s.losses[r];
  if (g != nullptr) {
    std::memset(g->dx, 0, sizeof(float) * static_cast<std::size_t>(BT) * C);
    layernorm_backward(pool, g->dx, g->lnf_w, g->lnf_b, s.dlnf, x, p.lnf_w, s.mean, s.rstd, BT, C, false);
  }
  return static_cast<float>(total / BT);
}

void gpt2_head_logits_row(ThreadPool& pool, const GptConfig& cfg, const Gpt2HeadParams& p, const float* x,
                          float* logits, Gpt2HeadScratch& s) {
  const int C = cfg.n_embd, V = cfg.vocab_size;
  layernorm_forward(pool, s.lnf, s.mean, s.rstd, x, p.lnf_w, p.lnf_b, 1, C, cfg.layer_norm_eps);
  sgemm(false, true, 1, V, C, 1.0f, s.lnf, C, p.wte, C, 0.0f, logits, V);
}

}  // namespace stratum
