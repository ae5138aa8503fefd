// Final norm + LM head + cross-entropy by vocabulary block; see gpt2_head.h.
#include "model/gpt2_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/param_layout.h"

namespace stratum {

int head_chunk_rows(Precision precision) { return precision == Precision::Bf16 ? 1024 : 256; }

CarveSlices Gpt2HeadScratch::slices(const GptConfig& cfg, int max_rows, int chunk_rows, bool keep_logits,
                                    bool backward, bool rounded, float** const* f) {
  const std::size_t R = static_cast<std::size_t>(max_rows), C = cfg.n_embd;
  const std::size_t n = static_cast<std::size_t>(vocab_block_rows(cfg));
  const std::size_t chunk = static_cast<std::size_t>(std::min(chunk_rows, max_rows));
  auto halves = [&](std::size_t count) { return rounded ? (count + 1) / 2 : 0; };  // bf16 in float slots
  return {{f[0], R * C}, {f[1], R}, {f[2], R}, {f[3], chunk * n},
          {f[4], R},     {f[5], R}, {f[6], R}, {f[7], R}, {f[8], backward ? R * C : 0},
          {f[9], keep_logits ? R * static_cast<std::size_t>(cfg.vocab_size) : 0},
          {f[10], halves(R * C)}, {f[11], halves(n * C)}, {f[12], backward ? halves(chunk * n) : 0},
          {f[13], cfg.norm_offset() != 0.0f ? 2 * C : 0}};
}

Gpt2HeadScratch::Gpt2HeadScratch(const Ops& ops, const GptConfig& cfg, int max_rows, Precision precision,
                                 bool keep_logits, bool backward)
    // Off the host (the GPU) one chunk of every row: 256-row products left an H100 idle (the head
    // took 204 of 346 ms of a GPT-2 small step), and a backend's bits are its own anyway.
    : chunk_rows_(ops.host_memory() ? head_chunk_rows(precision) : std::max(1, max_rows)) {
  float *l16 = nullptr, *w16f = nullptr, *d16f = nullptr;
  float** const fields[] = {&lnf, &mean, &rstd, &logits, &run_max, &run_sum, &target_logit, &lse, &dlnf, &kept,
                            &l16, &w16f, &d16f, &norm_w};
  const bool rounded = precision == Precision::Bf16 && ops.host_memory();
  buffer_ = ops_buffer_carve(ops, slices(cfg, max_rows, chunk_rows_, keep_logits, backward, rounded, fields));
  if (!keep_logits) kept = nullptr;
  if (!backward) dlnf = nullptr;
  if (cfg.norm_offset() == 0.0f) norm_w = nullptr;
  if (rounded && ops.bf16_rounded()) {
    lnf16 = reinterpret_cast<std::uint16_t*>(l16);
    w16 = reinterpret_cast<std::uint16_t*>(w16f);
    d16 = backward ? reinterpret_cast<std::uint16_t*>(d16f) : nullptr;
  }
}

std::size_t Gpt2HeadScratch::bytes_for(const GptConfig& cfg, int max_rows, Precision precision, bool keep_logits) {
  float* sink = nullptr;
  float** const fields[] = {&sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink, &sink,
                            &sink};
  return aligned_buffer_carve_bytes(
      slices(cfg, max_rows, head_chunk_rows(precision), keep_logits, true, precision == Precision::Bf16, fields));
}

void gpt2_head_begin(const Ops& ops, const GptConfig& cfg, const float* lnf_w, const float* lnf_b, const float* x,
                     int BT, Gpt2HeadScratch& s) {
  if (cfg.llama())  // Note [gemma]: Gemma's norm by 1 + w
    ops.rmsnorm_forward(s.lnf, s.rstd, x, norm_weight_offset(ops, lnf_w, cfg.n_embd, cfg.norm_offset(), s.norm_w), BT,
                        cfg.n_embd, cfg.layer_norm_eps);
  else
    ops.layernorm_forward(s.lnf, s.mean, s.rstd, x, lnf_w, lnf_b, BT, cfg.n_embd, cfg.layer_norm_eps);
  if (s.lnf16 != nullptr) ops.bf16_round(s.lnf16, s.lnf, BT, cfg.n_embd, cfg.n_embd);  // Note [rounded operands]
  ops.fill(s.run_max, -std::numeric_limits<float>::infinity(), static_cast<std::size_t>(BT));
  ops.fill(s.run_sum, 0.0f, static_cast<std::size_t>(BT));
  ops.fill(s.target_logit, 0.0f, static_cast<std::size_t>(BT));
}

void gpt2_head_lse_block(const Ops& ops, const GptConfig& cfg, const float* wte_rows, int v0, int n,
                         const std::int32_t* targets, int BT, Gpt2HeadScratch& s) {
  const int C = cfg.n_embd;
  if (s.w16 != nullptr) ops.bf16_round(s.w16, wte_rows, n, C, C);  // once for every chunk's product
  for (int r0 = 0; r0 < BT; r0 += s.chunk_rows()) {
    const int rows = std::min(s.chunk_rows(), BT - r0);
    // logits (rows, n) = lnf (rows, C) @ wte_rows^T, into the kept block's rows (Note [kept logits])
    float* const logits =
        s.kept != nullptr ? s.kept + static_cast<std::size_t>(v0) * BT + static_cast<std::size_t>(r0) * n : s.logits;
    if (s.w16 != nullptr)
      ops.sgemm_rounded(false, true, rows, n, C, 1.0f, s.lnf16 + static_cast<std::size_t>(r0) * C, s.w16, 0.0f, logits, n);
    else
      ops.sgemm(false, true, rows, n, C, 1.0f, s.lnf + static_cast<std::size_t>(r0) * C, C, wte_rows, C, 0.0f, logits, n);
    if (cfg.final_softcap > 0.0f) ops.logit_softcap(logits, rows, n, n, cfg.final_softcap);  // Note [final softcapping]
    ops.xent_chunk_forward(s.run_max + r0, s.run_sum + r0, s.target_logit + r0, logits, targets + r0, rows, n, v0);
  }
}

float gpt2_head_loss_finish(const Ops& ops, const std::int32_t* targets, int BT, Gpt2HeadScratch& s) {
  return ops.xent_loss_finish(s.lse, s.run_max, s.run_sum, s.target_logit, targets, BT);
}

void gpt2_head_backward_block(const Ops& ops, const GptConfig& cfg, const float* wte_rows, float* dwte_rows, int v0,
                              int n, const std::int32_t* targets, int BT, bool first_block, Gpt2HeadScratch& s,
                              int mean_rows) {
  const int C = cfg.n_embd;
  const float dloss = mean_rows > 0 ? 1.0f / static_cast<float>(mean_rows) : 0.0f;  // 0: every row masked
  const bool rounded = s.w16 != nullptr && s.d16 != nullptr;  // Note [rounded operands]
  if (rounded) ops.bf16_round(s.w16, wte_rows, n, C, C);
  for (int r0 = 0; r0 < BT; r0 += s.chunk_rows()) {
    const int rows = std::min(s.chunk_rows(), BT - r0);
    const float* xr = s.lnf + static_cast<std::size_t>(r0) * C;
    const float* logits = s.logits;
    if (s.kept != nullptr)  // the first pass's (Note [kept logits])
      logits = s.kept + static_cast<std::size_t>(v0) * BT + static_cast<std::size_t>(r0) * n;
    else if (rounded)
      ops.sgemm_rounded(false, true, rows, n, C, 1.0f, s.lnf16 + static_cast<std::size_t>(r0) * C, s.w16, 0.0f,
                        s.logits, n);
    else
      ops.sgemm(false, true, rows, n, C, 1.0f, xr, C, wte_rows, C, 0.0f, s.logits, n);
    // Note [final softcapping]: the kept logits are capped ones; a recomputed block is capped here
    if (cfg.final_softcap > 0.0f && s.kept == nullptr) ops.logit_softcap(s.logits, rows, n, n, cfg.final_softcap);
    ops.xent_chunk_backward(s.logits, logits, s.lse + r0, targets + r0, rows, n, v0, dloss, cfg.final_softcap);
    // dlnf (rows, C) (+)= dlogits @ wte_rows ; dwte_rows (n, C) (+)= dlogits^T @ lnf
    if (rounded) {  // the logit gradients rounded once for both products
      ops.bf16_round(s.d16, s.logits, rows, n, n);
      ops.sgemm_rounded(false, false, rows, C, n, 1.0f, s.d16, s.w16, first_block ? 0.0f : 1.0f,
                        s.dlnf + static_cast<std::size_t>(r0) * C, C);
      if (dwte_rows != nullptr)
        ops.sgemm_rounded(true, false, n, C, rows, 1.0f, s.d16, s.lnf16 + static_cast<std::size_t>(r0) * C,
                          r0 == 0 ? 0.0f : 1.0f, dwte_rows, C);
      continue;
    }
    ops.sgemm(false, false, rows, C, n, 1.0f, s.logits, n, wte_rows, C, first_block ? 0.0f : 1.0f,
          s.dlnf + static_cast<std::size_t>(r0) * C, C);
    if (dwte_rows != nullptr)  // null: a frozen head (LoRA's base)
      ops.sgemm(true, false, n, C, rows, 1.0f, s.logits, n, xr, C, r0 == 0 ? 0.0f : 1.0f, dwte_rows, C);
  }
}

void gpt2_head_backward_finish(const Ops& ops, const GptConfig& cfg, const float* lnf_w, const float* x, float* dx,
                               float* dlnf_w, float* dlnf_b, int BT, Gpt2HeadScratch& s) {
  const int C = cfg.n_embd;
  ops.fill(dx, 0.0f, static_cast<std::size_t>(BT) * C);
  if (cfg.llama())  // Note [gemma]: d(1 + w) = d w
    ops.rmsnorm_backward(dx, dlnf_w, s.dlnf, x, norm_weight_offset(ops, lnf_w, C, cfg.norm_offset(), s.norm_w), s.rstd,
                         BT, C, false);
  else
    ops.layernorm_backward(dx, dlnf_w, dlnf_b, s.dlnf, x, lnf_w, s.mean, s.rstd, BT, C, false);
}

void gpt2_head_logits_block(const Ops& ops, const Linear& linear, const GptConfig& cfg, const TensorView& wte_rows,
                            int n, int rows, float* logits, int ld_logits, const Gpt2HeadScratch& s) {
  const int C = cfg.n_embd;
  linear.nt(ops, logits, ld_logits, s.lnf, C, wte_rows, rows, n, C);
  if (cfg.final_softcap > 0.0f) ops.logit_softcap(logits, rows, n, ld_logits, cfg.final_softcap);  // Note [final softcapping]
}

}  // namespace stratum
