// GPT-2 block forward/backward; see gpt2_block.h.
#include "model/gpt2_block.h"

#include <algorithm>
#include <cstring>

namespace stratum {

Gpt2BlockTensors gpt2_block_tensors(const Ops& ops, const SegmentLayout& layout, const TensorView* chunks,
                                    float* widened) {
  auto view = [&](int i) { return layout.tensor_view(chunks, layout.tensors[i]); };
  WidenedVectors vectors(ops, widened);
  auto vec = [&](int i) { return vectors(view(i)); };
  // Braced initialisation evaluates left to right: the slices follow one another.
  return Gpt2BlockTensors{vec(kLn1W), vec(kLn1B), view(kAttnW), vec(kAttnB), view(kAttnProjW), vec(kAttnProjB),
                          vec(kLn2W), vec(kLn2B), view(kFcW),   vec(kFcB),   view(kMlpProjW),  vec(kMlpProjB)};
}

Gpt2Activations::Gpt2Activations(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                 const Gpt2Workspace* borrow, bool chunked)
    : buffer_(ops_buffer_carve(ops, slices(cfg, max_batch, max_seq, attention_stats, borrow != nullptr, chunked,
                                           borrow != nullptr ? borrow->rows : BlockRows{},
                                           borrow != nullptr && borrow->gelu_in_fch))) {
  STRATUM_ASSERT(borrow != nullptr || !chunked);  // a chunked set takes the workspace's chunk
  this->chunked = chunked;
  if (borrow != nullptr) {
    STRATUM_ASSERT(!borrow->gelu_in_fch || chunked);
    if (borrow->gelu_in_fch) fch_gelu = fch;
    rows = borrow->rows;
    ln1 = ln2 = borrow->tmp;
    borrowed = true;
  }
}

Gpt2Activations::Gpt2Activations(const GptConfig& cfg, int max_batch, int max_seq, const Gpt2Workspace& w,
                                   float* memory) {
  aligned_carve_into(slices(cfg, max_batch, max_seq, true, true, false, w.rows), memory);
  STRATUM_ASSERT(!w.gelu_in_fch);  // a held set keeps fch_gelu for the backward
  rows = w.rows;
  ln1 = ln2 = w.tmp;
  borrowed = true;
}

std::size_t Gpt2Activations::bytes_for(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                        bool borrowed) {
  Gpt2Activations probe{NoBuffer{}};
  return aligned_buffer_carve_bytes(
      probe.slices(cfg, max_batch, max_seq, attention_stats, borrowed, false, BlockRows{}));
}

CarveSlices Gpt2Activations::slices(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                    bool borrow, bool chunked, BlockRows chunk_rows, bool gelu_in_fch) {
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  const std::size_t stats = attention_stats ? static_cast<std::size_t>(max_batch) * cfg.n_head * max_seq * 2 : 0;
  const std::size_t own = borrow ? 0 : 1;
  const std::size_t rows = chunked ? static_cast<std::size_t>(row_chunk_rows(BT, chunk_rows.chunk)) : BT;
  const std::size_t mlp = chunked ? std::min(rows, static_cast<std::size_t>(chunk_rows.mlp)) : BT;
  return CarveSlices({{&ln1, own * BT * C}, {&ln1_mean, BT}, {&ln1_rstd, BT}, {&qkv, BT * 3 * C}, {&this->att_stats, stats},
                   {&atty, rows * C}, {&res2, rows * C}, {&ln2, own * BT * C}, {&ln2_mean, BT}, {&ln2_rstd, BT},
                   {&fch, mlp * 4 * C}, {&fch_gelu, gelu_in_fch ? 0 : mlp * 4 * C}});
}

Gpt2Workspace::Gpt2Workspace(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool bf16_weights,
                             bool backward, BlockRows rows, bool gelu_in_fch) {
  this->rows = rows;
  this->gelu_in_fch = gelu_in_fch;
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  wide_floats = bf16_weights ? 4 * C * C : 0;  // kn() widens a whole matrix (GemmLinear)
  const std::size_t vector_floats = bf16_weights ? 13 * C : 0;
  const std::size_t chunk = static_cast<std::size_t>(row_chunk_rows(BT, rows.chunk)), bwd = backward ? 1 : 0;
  const std::size_t mlp = std::min(chunk, static_cast<std::size_t>(rows.mlp));
  buffer_ = ops_buffer_carve(ops, {{&tmp, chunk * C}, {&dfch, bwd * mlp * 4 * C}, {&dln, bwd * chunk * C},
                   {&datty, bwd * chunk * C}, {&dqkv, bwd * BT * 3 * C}, {&attn_scratch, ops.attention_scratch_floats(max_batch, max_seq, cfg.n_head, cfg.n_head, cfg.head_dim())},
                   {&wide, wide_floats}, {&wide_vectors, vector_floats}});
  if (!bf16_weights) wide = wide_vectors = nullptr;
  if (!backward) dfch = dln = datty = dqkv = nullptr;
}

namespace {
// Rows [r0, r0 + n) of ln1 and qkv (Note [row chunks]), adapter 0 (c_attn) added.
void gpt2_qkv_rows(const Ops& ops, const Linear& linear, const GptConfig& cfg, const Gpt2BlockTensors& p,
                   const float* x, Gpt2Activations& s, int r0, int n, const LoraBlock* lora) {
  const int C = cfg.n_embd;
  const std::size_t at = static_cast<std::size_t>(r0) * C;
  float* const ln1 = s.ln1 + s.work_row(r0) * C;
  ops.layernorm_forward(ln1, s.ln1_mean + r0, s.ln1_rstd + r0, x + at, p.ln1_w, p.ln1_b, n, C, cfg.layer_norm_eps);
  linear.kn(ops, s.qkv + 3 * at, ln1, p.attn_w, p.attn_b, n, C, 3 * C);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 0, r0, C), 0, s.qkv + 3 * at, 3 * C, ln1, C, n, C, 3 * C);
}

// Rows [r0, r0 + n) of the attention output (Note [attention row ranges] in
// kernels/cpu/attention.h; already there when the attention takes the whole pass) and res2 = x +
// attn_proj(atty) (through tmp) at `res2` (the chunk's rows), adapter 1 added.
void gpt2_attention_rows(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                         const Gpt2BlockTensors& p, const float* x, Gpt2Activations& s, float* tmp,
                         float* attn_scratch, int B, int T, int r0, int n, const LoraBlock* lora, float* res2) {
  const int C = cfg.n_embd, H = cfg.n_head;
  const std::size_t at = static_cast<std::size_t>(r0) * C, own = s.chunk_row(r0) * C;
  if (attention.by_row_chunks())
    attention.attend(ops, s.atty + own, s.att_stats, attn_scratch, s.qkv, B, T, H, H, cfg.head_dim(), r0, n, {});
  linear.kn(ops, tmp, s.atty + own, p.attn_proj_w, p.attn_proj_b, n, C, C);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 1, r0, C), 1, tmp, C, s.atty + own, C, n, C, C);
  ops.add(res2, x + at, tmp, static_cast<std::size_t>(n) * C);
}

// Rows [r0, r0 + n) of the MLP half (Note [row chunks]): ln2, fch and fch_gelu at the
// chunk's rows, adapter 2 (c_fc) added; then, with out, out rows = res2 + mlp_proj(fch_gelu)
// (through tmp), adapter 3 added; without, only adapter 3's u, and without gelu_needed not even
// fch_gelu. res2: the chunk's rows (may be out's: in place).
void gpt2_mlp_rows(const Ops& ops, const Linear& linear, const GptConfig& cfg, const Gpt2BlockTensors& p,
                   Gpt2Activations& s, float* tmp, float* out, int r0, int n, const LoraBlock* lora,
                   const float* res2, bool gelu_needed = true) {
  const int C = cfg.n_embd;
  const std::size_t at = static_cast<std::size_t>(r0) * C, mlp = s.chunk_row(r0) * 4 * C;
  float* const ln2 = s.ln2 + s.work_row(r0) * C;
  float* const fch = s.fch + mlp;
  float* const fch_gelu = s.fch_gelu + mlp;
  ops.layernorm_forward(ln2, s.ln2_mean + r0, s.ln2_rstd + r0, res2, p.ln2_w, p.ln2_b, n, C, cfg.layer_norm_eps);
  linear.kn(ops, fch, ln2, p.fc_w, p.fc_b, n, C, 4 * C);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 2, r0, C), 2, fch, 4 * C, ln2, C, n, C, 4 * C);
  if (out == nullptr && !gelu_needed) return;  // a backward that reads fch only
  ops.gelu_forward(fch_gelu, fch, static_cast<std::size_t>(n) * 4 * C);
  if (out == nullptr) {
    if (lora != nullptr) lora_forward_u(ops, lora_rows(*lora, 3, r0, 4 * C), 3, fch_gelu, 4 * C, n, 4 * C);
    return;
  }
  linear.kn(ops, tmp, fch_gelu, p.mlp_proj_w, p.mlp_proj_b, n, 4 * C, C);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 3, r0, 4 * C), 3, tmp, C, fch_gelu, 4 * C, n, 4 * C, C);
  ops.add(out + at, res2, tmp, static_cast<std::size_t>(n) * C);
}
}  // namespace

void gpt2_block_forward(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                        const Gpt2BlockTensors& p, const float* x, float* out, Gpt2Activations& s, float* tmp,
                        float* attn_scratch, int B, int T, const LoraBlock* lora, BlockPart part) {
  const int BT = B * T, C = cfg.n_embd;
  STRATUM_ASSERT(part != BlockPart::Attention || x != out);
  // Row chunk by row chunk (Note [row chunks]): every row's q, k and v first (a row attends to
  // the keys before it), then the rest of the block; adapters (Note [lora math]) add to each
  // module's output before it is used. A half (Note [block halves]) keeps res2 in out.
  if (part != BlockPart::Mlp) {
    for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) { gpt2_qkv_rows(ops, linear, cfg, p, x, s, r0, n, lora); });
    if (!attention.by_row_chunks())
      attention.attend(ops, s.atty, s.att_stats, attn_scratch, s.qkv, B, T, cfg.n_head, cfg.n_head, cfg.head_dim(), 0,
                       BT, {});
  }
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    float* const res2 = part == BlockPart::Whole ? s.res2 + s.chunk_row(r0) * C : out + static_cast<std::size_t>(r0) * C;
    if (part != BlockPart::Mlp)
      gpt2_attention_rows(ops, linear, attention, cfg, p, x, s, tmp, attn_scratch, B, T, r0, n, lora, res2);
    if (part != BlockPart::Attention)  // in sub-chunks (Note [frozen MLP rows])
      for_each_sub_chunk(r0, n, s.rows.mlp, [&](int q0, int m) {
        gpt2_mlp_rows(ops, linear, cfg, p, s, tmp, out, q0, m, lora, res2 + static_cast<std::size_t>(q0 - r0) * C);
      });
  });
}

void gpt2_block_backward(const Ops& ops, const GptConfig& cfg, const Gpt2BlockTensors& p,
                         const Gpt2BlockTensors* g, const float* x, const float* dout, float* dx,
                         Gpt2Activations& s, Gpt2Workspace& w, int B, int T, bool recompute, const LoraBlock* lora,
                         BlockPart part) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head;
  const GemmLinear linear{w.wide, w.wide_floats};
  // Recompute every row's qkv; each chunk's attention rows and MLP internals are recomputed
  // below, just before its backward (the block output itself is not needed); or, in two parts
  // (Note [attention recompute first]), the attention half's first, for the pass's one chunk.
  STRATUM_ASSERT(part == BlockPart::Whole || (recompute && BT <= w.rows.chunk));
  if (recompute && part != BlockPart::Mlp)
    for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) { gpt2_qkv_rows(ops, linear, cfg, p, x, s, r0, n, lora); });
  if (part == BlockPart::Attention) {
    gpt2_attention_rows(ops, linear, CausalAttention{}, cfg, p, x, s, w.tmp, w.attn_scratch, B, T, 0, BT, lora, s.res2);
    return;
  }
  // A frozen base (g null, Note [lora segments]) gets no parameter gradients; dx is the same.
  auto grad = [&](float* Gpt2BlockTensors::*field) { return g != nullptr ? g->*field : nullptr; };
  auto grad_w = [&](TensorView Gpt2BlockTensors::*field) { return g != nullptr ? (g->*field).f32() : nullptr; };
  auto adapt = [&](int k, int r0, int n, bool acc, const float* dy, int ldy, const float* in, int ldx, float* din, int K,
                   int N) {
    if (lora != nullptr) lora_backward(ops, lora_rows(*lora, k, r0, K), k, dy, ldy, in, ldx, din, K, n, K, N, acc);
  };

  // Chunk by chunk (Note [row chunks]): the MLP, out = res2 + mlp_proj(gelu(fc(ln2(res2)))), then
  // the attention output's projection, res2 = x + attn_proj(atty), and the attention's rows (Note
  // [attention row ranges]), which add to the dk and dv of every row before them. ln2 and ln1 live
  // in w.tmp (borrowed, Gpt2Activations): the same layernorm writes them again. The gradient at
  // res2 is built in dx's rows, where the attention half's input gradient is added.
  STRATUM_ASSERT(s.ln1 == w.tmp && s.ln2 == w.tmp);
  STRATUM_ASSERT(s.rows == w.rows);
  // fch_gelu feeds only mlp_proj's weight gradient and its adapter: without them the recompute
  // stops before the gelu (Gpt2Workspace::gelu_in_fch).
  const bool gelu_needed = g != nullptr || (lora != nullptr && lora->t[3].a != nullptr);
  STRATUM_ASSERT(!w.gelu_in_fch || !gelu_needed);
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    const std::size_t at = static_cast<std::size_t>(r0) * C, own = s.chunk_row(r0) * C;
    const bool acc = r0 > 0;  // later chunks add to the gradients
    float* const ln2 = s.ln2;
    if (recompute && part == BlockPart::Whole)
      gpt2_attention_rows(ops, linear, CausalAttention{}, cfg, p, x, s, w.tmp, w.attn_scratch, B, T, r0, n, lora,
                          s.res2 + own);
    // The MLP half in sub-chunks (Note [frozen MLP rows]: one, the chunk, where it trains).
    STRATUM_ASSERT(w.rows.mlp >= n ||
                   (g == nullptr && (lora == nullptr || (lora->t[2].a == nullptr && lora->t[3].a == nullptr))));
    for_each_sub_chunk(r0, n, w.rows.mlp, [&](int q0, int m) {
      const std::size_t qat = static_cast<std::size_t>(q0) * C, mlp = s.chunk_row(q0) * 4 * C;
      const bool qacc = q0 > 0;
      const float* const dout_c = dout + qat;
      const float* const fch = s.fch + mlp;
      const float* const fch_gelu = s.fch_gelu + mlp;
      float* const res2 = s.res2 + own + static_cast<std::size_t>(q0 - r0) * C;
      if (recompute) {
        gpt2_mlp_rows(ops, linear, cfg, p, s, nullptr, nullptr, q0, m, lora, res2, gelu_needed);
      } else {
        ops.layernorm_forward(ln2, s.ln2_mean + q0, s.ln2_rstd + q0, res2, p.ln2_w, p.ln2_b, m, C,
                              cfg.layer_norm_eps);
      }
      ops.matmul_backward(w.dfch, grad_w(&Gpt2BlockTensors::mlp_proj_w), grad(&Gpt2BlockTensors::mlp_proj_b), dout_c,
                          fch_gelu, weight_f32(ops, p.mlp_proj_w, w.wide), m, 4 * C, C, qacc);
      adapt(3, q0, m, qacc, dout_c, C, fch_gelu, 4 * C, w.dfch, 4 * C, C);
      ops.gelu_backward(w.dfch, fch, w.dfch, static_cast<std::size_t>(m) * 4 * C);
      ops.matmul_backward(w.dln, grad_w(&Gpt2BlockTensors::fc_w), grad(&Gpt2BlockTensors::fc_b), w.dfch, ln2,
                          weight_f32(ops, p.fc_w, w.wide), m, C, 4 * C, qacc);
      adapt(2, q0, m, qacc, w.dfch, 4 * C, ln2, C, w.dln, C, 4 * C);
      // d res2, in dx's rows: dout_c's last read (dx may be dout: in place)
      if (dx != dout) ops.copy(dx + qat, dout_c, static_cast<std::size_t>(m) * C);
      ops.layernorm_backward(dx + qat, grad(&Gpt2BlockTensors::ln2_w), grad(&Gpt2BlockTensors::ln2_b), w.dln, res2,
                             p.ln2_w, s.ln2_mean + q0, s.ln2_rstd + q0, m, C, qacc);
    });
    ops.matmul_backward(w.datty, grad_w(&Gpt2BlockTensors::attn_proj_w), grad(&Gpt2BlockTensors::attn_proj_b),
                        dx + at, s.atty + own, weight_f32(ops, p.attn_proj_w, w.wide), n, C, C, acc);
    adapt(1, r0, n, acc, dx + at, C, s.atty + own, C, w.datty, C, C);
    ops.attention_backward(w.dqkv, w.attn_scratch, w.datty, s.qkv, s.att_stats, B, T, H, H, cfg.head_dim(), r0, n, {});
  });
  // Attention: qkv = c_attn(ln1(x)); every row's dk and dv are complete now.
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    const std::size_t at = static_cast<std::size_t>(r0) * C;
    const bool acc = r0 > 0;
    ops.layernorm_forward(s.ln1, s.ln1_mean + r0, s.ln1_rstd + r0, x + at, p.ln1_w, p.ln1_b, n, C, cfg.layer_norm_eps);
    ops.matmul_backward(w.dln, grad_w(&Gpt2BlockTensors::attn_w), grad(&Gpt2BlockTensors::attn_b), w.dqkv + 3 * at,
                        s.ln1, weight_f32(ops, p.attn_w, w.wide), n, C, 3 * C, acc);
    adapt(0, r0, n, acc, w.dqkv + 3 * at, 3 * C, s.ln1, C, w.dln, C, 3 * C);
    ops.layernorm_backward(dx + at, grad(&Gpt2BlockTensors::ln1_w), grad(&Gpt2BlockTensors::ln1_b), w.dln, x + at,
                           p.ln1_w, s.ln1_mean + r0, s.ln1_rstd + r0, n, C, acc);
  });
}

}  // namespace stratum
