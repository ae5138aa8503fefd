// GPT-2 block forward/backward; see gpt2_block.h.
#include "model/gpt2_block.h"

#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"

namespace stratum {

Gpt2BlockTensors gpt2_block_tensors(const SegmentLayout& layout, float* base) {
  auto at = [&](int i) { return base + layout.tensors[i].offset_floats; };
  return Gpt2BlockTensors{at(kLn1W), at(kLn1B),       at(kAttnW), at(kAttnB), at(kAttnProjW), at(kAttnProjB),
                          at(kLn2W), at(kLn2B),       at(kFcW),   at(kFcB),   at(kMlpProjW),  at(kMlpProjB)};
}

Gpt2Scratch::Gpt2Scratch(const GptConfig& cfg, int max_batch, int max_seq) {
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq;
  const std::size_t C = cfg.n_embd;
  const std::size_t H = cfg.n_head;
  const std::size_t sizes[] = {BT * C, BT, BT, BT * 3 * C, static_cast<std::size_t>(max_batch) * H * max_seq * max_seq,
                               BT * C, BT * C, BT * C, BT, BT, BT * 4 * C, BT * 4 * C, BT * C,
                               BT * C, BT * 4 * C, BT * C, BT * C, BT * 3 * C, static_cast<std::size_t>(max_batch) * H * max_seq};
  float** slots[] = {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &atty, &res2, &ln2, &ln2_mean, &ln2_rstd, &fch,
                     &fch_gelu, &tmp, &dres2, &dfch, &dln, &datty, &dqkv, &datt_row};
  std::size_t total = 0;
  for (std::size_t n : sizes) total += align_up(n, 16);
  buffer_ = AlignedBuffer(total * sizeof(float));
  float* cursor = buffer_.as_f32();
  for (std::size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    *slots[i] = cursor;
    cursor += align_up(sizes[i], 16);
  }
}

void gpt2_block_forward(ThreadPool& pool, const GptConfig& cfg, const Gpt2BlockTensors& p, const float* x,
                        float* out, Gpt2Scratch& s, int B, int T) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head;
  const float eps = cfg.layer_norm_eps;
  layernorm_forward(pool, s.ln1, s.ln1_mean, s.ln1_rstd, x, p.ln1_w, p.ln1_b, BT, C, eps);
  matmul_forward(pool, s.qkv, s.ln1, p.attn_w, p.attn_b, BT, C, 3 * C);
  attention_forward(pool, s.atty, s.att, s.qkv, B, T, C, H);
  matmul_forward(pool, s.tmp, s.atty, p.attn_proj_w, p.attn_proj_b, BT, C, C);
  add_f32(pool, s.res2, x, s.tmp, static_cast<std::size_t>(BT) * C);
  layernorm_forward(pool, s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, p.ln2_w, p.ln2_b, BT, C, eps);
  matmul_forward(pool, s.fch, s.ln2, p.fc_w, p.fc_b, BT, C, 4 * C);
  gelu_forward(pool, s.fch_gelu, s.fch, static_cast<std::size_t>(BT) * 4 * C);
  matmul_forward(pool, s.tmp, s.fch_gelu, p.mlp_proj_w, p.mlp_proj_b, BT, 4 * C, C);
  add_f32(pool, out, s.res2, s.tmp, static_cast<std::size_t>(BT) * C);
}

void gpt2_block_backward(ThreadPool& pool, const GptConfig& cfg, const Gpt2BlockTensors& p,
                         const Gpt2BlockTensors& g, const float* x, const float* dout, float* dx,
                         Gpt2Scratch& s, int B, int T) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head;
  const std::size_t rows_c = static_cast<std::size_t>(BT) * C;
  // Recompute the forward internals (the block output itself is not needed).
  gpt2_block_forward(pool, cfg, p, x, s.tmp, s, B, T);

  // MLP: out = res2 + mlp_proj(gelu(fc(ln2(res2))))
  matmul_backward(pool, s.dfch, g.mlp_proj_w, g.mlp_proj_b, dout, s.fch_gelu, p.mlp_proj_w, BT, 4 * C, C, false);
  gelu_backward(pool, s.dfch, s.fch, s.dfch, static_cast<std::size_t>(BT) * 4 * C);
  matmul_backward(pool, s.dln, g.fc_w, g.fc_b, s.dfch, s.ln2, p.fc_w, BT, C, 4 * C, false);
  std::memcpy(s.dres2, dout, rows_c * sizeof(float));
  layernorm_backward(pool, s.dres2, g.ln2_w, g.ln2_b, s.dln, s.res2, p.ln2_w, s.ln2_mean, s.ln2_rstd, BT, C, false);

  // Attention: res2 = x + attn_proj(attention(c_attn(ln1(x))))
  matmul_backward(pool, s.datty, g.attn_proj_w, g.attn_proj_b, s.dres2, s.atty, p.attn_proj_w, BT, C, C, false);
  attention_backward(pool, s.dqkv, s.datt_row, s.datty, s.qkv, s.att, B, T, C, H);
  matmul_backward(pool, s.dln, g.attn_w, g.attn_b, s.dqkv, s.ln1, p.attn_w, BT, C, 3 * C, false);
  std::memcpy(dx, s.dres2, rows_c * sizeof(float));
  layernorm_backward(pool, dx, g.ln1_w, g.ln1_b, s.dln, x, p.ln1_w, s.ln1_mean, s.ln1_rstd, BT, C, false);
}

}  // namespace stratum
