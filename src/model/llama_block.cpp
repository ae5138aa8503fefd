// Llama block forward/backward; see llama_block.h.
#include "model/llama_block.h"

#include <algorithm>
#include <cstring>

namespace stratum {

LlamaBlockTensors llama_block_tensors(const Ops& ops, const SegmentLayout& layout, const TensorView* chunks,
                                    float* widened, const GptConfig* offset_norms) {
  auto view = [&](int i) { return layout.tensor_view(chunks, layout.tensors[i]); };
  const float offset = offset_norms != nullptr ? offset_norms->norm_offset() : 0.0f;
  WidenedVectors vectors(ops, widened, offset, offset != 0.0f ? llama_offset_floats(*offset_norms) : 0);
  // Braced initialisation evaluates left to right: the slices follow one another.
  LlamaBlockTensors t{vectors(view(kAttnNormW)), view(kQW),    view(kKW),  view(kVW), view(kOW),
                      vectors(view(kMlpNormW)),  view(kGateW), view(kUpW), view(kDownW)};
  const int n = static_cast<int>(layout.tensors.size());
  if (n <= kLlamaBlockTensorCount) return t;
  // The slots after the nine are told apart by name (the gradient sets come without a config).
  if (layout.tensors[kQB].name.ends_with("self_attn.q_proj.bias")) {  // Qwen2
    t.q_b = vectors(view(kQB));
    t.k_b = vectors(view(kKB));
    t.v_b = vectors(view(kVB));
  } else if (layout.tensors[kQNormW].name.ends_with("self_attn.q_norm.weight")) {  // Qwen3, Gemma 3 (Note [qk norm])
    t.q_norm_w = vectors(view(kQNormW));
    t.k_norm_w = vectors(view(kKNormW));
  }
  if (layout.tensors[n - 1].name.ends_with("post_feedforward_layernorm.weight")) {  // Gemma 2, 3 (Note [post norms])
    t.post_attn_norm_w = vectors(view(n - 2));
    t.post_ff_norm_w = vectors(view(n - 1));
  }
  return t;
}

LlamaRopes::LlamaRopes(const GptConfig& cfg, int max_pos)  // Note [partial rotary], Note [longrope]
    : full_(cfg.rotary_dim(), max_pos, cfg.rope_theta, cfg.rope_scaling, cfg.rope_long_factors(max_pos)) {
  if (!cfg.gemma3()) return;
  local_.emplace(cfg.rotary_dim(), max_pos, cfg.rope_local_theta, RopeScaling{});
  for (int l = 0; l < cfg.n_layer; ++l) local_layers_.push_back(cfg.layer_local_rope(l) ? 1 : 0);
}

std::size_t LlamaRopes::bytes_for(const GptConfig& cfg, int max_pos) {
  return (cfg.gemma3() ? 2 : 1) * RopeTable::bytes_for(cfg.rotary_dim(), max_pos);
}

std::size_t llama_offset_floats(const GptConfig& cfg) {
  return cfg.norm_offset() != 0.0f ? static_cast<std::size_t>(std::max(cfg.n_embd, cfg.head_dim())) : 0;
}

std::size_t llama_vector_floats(const GptConfig& cfg) {
  const std::size_t C = cfg.n_embd;
  return llama_offset_floats(cfg) + (cfg.post_norms() ? 4 : 2) * C +
         (cfg.qkv_bias() ? static_cast<std::size_t>(cfg.q_dim()) + 2 * static_cast<std::size_t>(cfg.kv_dim()) : 0) +
         (cfg.qk_norm() ? 2 * static_cast<std::size_t>(cfg.head_dim()) : 0);
}

void llama_bias_add(const Ops& ops, float* y, int ldy, const float* bias, const float* ones, int n, int N) {
  ops.sgemm(false, false, n, N, 1, 1.0f, ones, 1, bias, N, 1.0f, y, ldy);
}

void llama_bias_grad(const Ops& ops, float* db, const float* dy, int ldy, const float* ones, int n, int N, bool acc) {
  ops.sgemm(true, false, 1, N, n, 1.0f, ones, 1, dy, ldy, acc ? 1.0f : 0.0f, db, N);
}

LlamaActivations::LlamaActivations(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                   const LlamaWorkspace* borrow, bool chunked)
    : buffer_(ops_buffer_carve(ops, slices(cfg, max_batch, max_seq, attention_stats, borrow != nullptr, chunked,
                                           borrow != nullptr ? borrow->rows : BlockRows{}))) {
  STRATUM_ASSERT(borrow != nullptr || !chunked);  // a chunked set takes the workspace's chunk
  this->chunked = chunked;
  if (borrow != nullptr) {
    rows = borrow->rows;
    STRATUM_ASSERT(!borrow->gate_holds_hmid || chunked);
    hmid = borrow->gate_holds_hmid ? gate : borrow->dgate;
    borrowed = true;
    xn1 = xn2 = borrow->tmp;
    ones = borrow->ones;
  } else if (cfg.qkv_bias()) {
    ops.fill(ones, 1.0f, static_cast<std::size_t>(max_batch) * max_seq);
  } else {
    ones = nullptr;
  }
}

LlamaActivations::LlamaActivations(const GptConfig& cfg, int max_batch, int max_seq, const LlamaWorkspace& w,
                                   float* memory) {
  aligned_carve_into(slices(cfg, max_batch, max_seq, true, true, false, w.rows), memory);
  STRATUM_ASSERT(!w.gate_holds_hmid);  // a held set keeps gate for the backward
  rows = w.rows;
  hmid = w.dgate;
  borrowed = true;
  xn1 = xn2 = w.tmp;
  ones = w.ones;
}

std::size_t LlamaActivations::bytes_for(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                        bool borrowed) {
  LlamaActivations probe{NoBuffer{}};
  return aligned_buffer_carve_bytes(
      probe.slices(cfg, max_batch, max_seq, attention_stats, borrowed, false, BlockRows{}));
}

CarveSlices LlamaActivations::slices(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                     bool borrow, bool chunked, BlockRows chunk_rows) {
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  const std::size_t Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim()), I = cfg.mlp_width();
  const std::size_t stats = attention_stats ? static_cast<std::size_t>(max_batch) * cfg.n_head * max_seq * 2 : 0;
  const std::size_t own = borrow ? 0 : 1;
  const std::size_t rows = chunked ? static_cast<std::size_t>(row_chunk_rows(BT, chunk_rows.chunk)) : BT;
  const std::size_t mlp = chunked ? std::min(rows, static_cast<std::size_t>(chunk_rows.mlp)) : BT;
  const std::size_t qk_norm = cfg.qk_norm() ? BT : 0, post = cfg.post_norms() ? BT : 0;
  return CarveSlices({{&xn1, own * BT * C}, {&rstd1, BT}, {&qkv, BT * QKV},
                      {&rstd_q, qk_norm * cfg.n_head}, {&rstd_k, qk_norm * cfg.kv_heads()},
                      {&rstd_pa, post}, {&rstd_pf, post},
                      {&this->att_stats, stats}, {&atty, rows * Q},
                                  {&res2, rows * C}, {&xn2, own * BT * C}, {&rstd2, BT}, {&gate, mlp * I}, {&up, mlp * I},
                                  {&hmid, own * BT * I}, {&ones, cfg.qkv_bias() ? own * BT : 0}});
}

LlamaWorkspace::LlamaWorkspace(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool bf16_weights,
                               bool backward, BlockRows rows, bool gate_holds_hmid) {
  this->rows = rows;
  this->gate_holds_hmid = gate_holds_hmid;
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  const std::size_t Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim()), I = cfg.mlp_width();
  // Note [widened in panels]: the scratch holds a panel of the largest matrix.
  wide_floats = bf16_weights ? widen_scratch_floats(std::max(Q, I) * C) : 0;
  // Note [gemma]: a Gemma block's norm weights are 1 + w in this scratch, fp32 too.
  const std::size_t vector_floats = bf16_weights || cfg.norm_offset() != 0.0f ? llama_vector_floats(cfg) : 0;
  const std::size_t chunk = static_cast<std::size_t>(row_chunk_rows(BT, rows.chunk)), bwd = backward ? 1 : 0;
  const std::size_t mlp = std::min(chunk, static_cast<std::size_t>(rows.mlp));
  buffer_ = ops_buffer_carve(ops,
      {{&tmp, chunk * C}, {&dxn, bwd * chunk * C}, {&datty, bwd * chunk * Q}, {&dqkv, bwd * BT * QKV},
       {&dgate, gate_holds_hmid ? 0 : mlp * I}, {&dup, bwd * mlp * I},
       {&attn_scratch, ops.attention_scratch_floats(max_batch, max_seq, cfg.n_head, cfg.kv_heads(), cfg.head_dim())},
       {&wide, wide_floats}, {&wide_vectors, vector_floats}, {&ones, cfg.qkv_bias() ? chunk : 0},
       {&post, cfg.post_norms() ? bwd * chunk * C : 0}});
  if (!bf16_weights) wide = nullptr;
  if (vector_floats == 0) wide_vectors = nullptr;
  if (cfg.qkv_bias()) ops.fill(ones, 1.0f, chunk);
  else ones = nullptr;
  if (!backward) dxn = datty = dqkv = dup = nullptr;
  if (!backward || !cfg.post_norms()) post = nullptr;
  STRATUM_ASSERT(!gate_holds_hmid || !cfg.post_norms());  // Note [post norms]: the backward needs hmid
  if (gate_holds_hmid) dgate = nullptr;
}

namespace {
// The MLP's gated activation, hmid = act(gate) * up: SwiGLU, or Gemma's GeGLU (Note [gemma]).
void gated_forward(const Ops& ops, const GptConfig& cfg, float* hmid, const float* gate, const float* up,
                   std::size_t n) {
  if (cfg.gelu_mlp())
    ops.geglu_forward(hmid, gate, up, n);
  else
    ops.swiglu_forward(hmid, gate, up, n);
}

// Rows [r0, r0 + n) of xn1 and qkv (Note [row chunks]), adapters 0, 1 and 2 (q, k, v) added;
// not normed (Note [qk norm]) nor rotated. with_v false: q and k only (the backward's recompute).
void llama_qkv_rows(const Ops& ops, const Linear& linear, const GptConfig& cfg, const LlamaBlockTensors& p,
                    const float* x, LlamaActivations& s, int r0, int n, const LoraBlock* lora, bool with_v = true) {
  const int C = cfg.n_embd, Q = cfg.q_dim(), KVd = cfg.kv_dim(), QKV = Q + 2 * KVd;
  const std::size_t at = static_cast<std::size_t>(r0) * C;
  float* const xn1 = s.xn1 + s.work_row(r0) * C;
  float* const qkv = s.qkv + static_cast<std::size_t>(r0) * QKV;
  ops.rmsnorm_forward(xn1, s.rstd1 + r0, x + at, p.attn_norm_w, n, C, cfg.layer_norm_eps);
  linear.nt(ops, qkv, QKV, xn1, C, p.q_w, n, Q, C);
  linear.nt(ops, qkv + Q, QKV, xn1, C, p.k_w, n, KVd, C);
  if (with_v) linear.nt(ops, qkv + Q + KVd, QKV, xn1, C, p.v_w, n, KVd, C);
  if (cfg.qkv_bias()) {  // Qwen2: the biased projections, which PEFT's adapters add to
    STRATUM_ASSERT(p.q_b != nullptr && p.k_b != nullptr && p.v_b != nullptr && s.ones != nullptr);
    llama_bias_add(ops, qkv, QKV, p.q_b, s.ones, n, Q);
    llama_bias_add(ops, qkv + Q, QKV, p.k_b, s.ones, n, KVd);
    if (with_v) llama_bias_add(ops, qkv + Q + KVd, QKV, p.v_b, s.ones, n, KVd);
  }
  if (lora != nullptr) {
    lora_forward(ops, lora_rows(*lora, 0, r0, C), 0, qkv, QKV, xn1, C, n, C, Q);
    lora_forward(ops, lora_rows(*lora, 1, r0, C), 1, qkv + Q, QKV, xn1, C, n, C, KVd);
    if (with_v) lora_forward(ops, lora_rows(*lora, 2, r0, C), 2, qkv + Q + KVd, QKV, xn1, C, n, C, KVd);
  }
}

// Note [qk norm]: Qwen3's per-head norms of rows [r0, r0 + n) of qkv's q and k, in place.
void llama_qk_norm_rows(const Ops& ops, const GptConfig& cfg, const LlamaBlockTensors& p, LlamaActivations& s, int r0,
                        int n) {
  const int Q = cfg.q_dim(), QKV = Q + 2 * cfg.kv_dim(), H = cfg.n_head, KV = cfg.kv_heads();
  STRATUM_ASSERT(p.q_norm_w != nullptr && p.k_norm_w != nullptr && s.rstd_q != nullptr && s.rstd_k != nullptr);
  float* const qkv = s.qkv + static_cast<std::size_t>(r0) * QKV;
  ops.rmsnorm_heads_forward(qkv, QKV, s.rstd_q + static_cast<std::size_t>(r0) * H, p.q_norm_w, n, H, cfg.head_dim(),
                            cfg.layer_norm_eps);
  ops.rmsnorm_heads_forward(qkv + Q, QKV, s.rstd_k + static_cast<std::size_t>(r0) * KV, p.k_norm_w, n, KV,
                            cfg.head_dim(), cfg.layer_norm_eps);
}

// Every row's qkv, q and k rotated: what the attention of any row needs.
void llama_qkv(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
               const RopeTable& rope, const LlamaBlockTensors& p, const float* x, LlamaActivations& s, int B, int T,
               const LoraBlock* lora) {
  const int Q = cfg.q_dim(), QKV = Q + 2 * cfg.kv_dim();
  for_each_row_chunk(B * T, s.rows.chunk, [&](int r0, int n) {
    llama_qkv_rows(ops, linear, cfg, p, x, s, r0, n, lora);
    if (cfg.qk_norm()) llama_qk_norm_rows(ops, cfg, p, s, r0, n);
  });
  ops.rope_forward(s.qkv, B, T, cfg.n_head, cfg.head_dim(), QKV, attention.positions(), rope);
  ops.rope_forward(s.qkv + Q, B, T, cfg.kv_heads(), cfg.head_dim(), QKV, attention.positions(), rope);
}

// Rows [r0, r0 + n) of the attention output (Note [attention row ranges] in
// kernels/cpu/attention.h; already there when the attention takes the whole pass) and res2 = x +
// o(atty) (through tmp) at `res2` (the chunk's rows), adapter 3 (o_proj) added.
void llama_attention_rows(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                          const LlamaBlockTensors& p, const float* x, LlamaActivations& s, float* tmp,
                          float* attn_scratch, int B, int T, int r0, int n, const LoraBlock* lora, float* res2,
                          AttentionScores scores) {
  const int C = cfg.n_embd, Q = cfg.q_dim();
  const std::size_t at = static_cast<std::size_t>(r0) * C;
  float* const atty = s.atty + s.chunk_row(r0) * Q;
  if (attention.by_row_chunks())
    attention.attend(ops, atty, s.att_stats, attn_scratch, s.qkv, B, T, cfg.n_head, cfg.kv_heads(), cfg.head_dim(),
                     r0, n, scores);
  linear.nt(ops, tmp, C, atty, Q, p.o_w, n, C, Q);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 3, r0, Q), 3, tmp, C, atty, Q, n, Q, C);
  if (cfg.post_norms())  // Note [post norms]: in place
    ops.rmsnorm_forward(tmp, s.rstd_pa + r0, tmp, p.post_attn_norm_w, n, C, cfg.layer_norm_eps);
  ops.add(res2, x + at, tmp, static_cast<std::size_t>(n) * C);
}

// Rows [r0, r0 + n) of the MLP half (Note [row chunks]): xn2, gate, up and hmid at the
// chunk's rows, adapters 4 and 5 (gate_proj, up_proj) added; then, with out, out rows = res2 +
// down(hmid) (through tmp), adapter 6 added; without, only adapter 6's u, and without
// hmid_needed (a backward that needs no hmid) not even hmid. res2: the chunk's rows (may be
// out's: in place).
void llama_mlp_rows(const Ops& ops, const Linear& linear, const GptConfig& cfg, const LlamaBlockTensors& p,
                    LlamaActivations& s, float* tmp, float* out, int r0, int n, const LoraBlock* lora,
                    const float* res2, bool hmid_needed = true) {
  const int C = cfg.n_embd, I = cfg.mlp_width();
  const std::size_t at = static_cast<std::size_t>(r0) * C, mlp = s.chunk_row(r0) * I;
  float* const xn2 = s.xn2 + s.work_row(r0) * C;
  float* const gate = s.gate + mlp;
  float* const up = s.up + mlp;
  float* const hmid = s.hmid + s.work_row(r0) * I;
  ops.rmsnorm_forward(xn2, s.rstd2 + r0, res2, p.mlp_norm_w, n, C, cfg.layer_norm_eps);
  linear.nt(ops, gate, I, xn2, C, p.gate_w, n, I, C);
  linear.nt(ops, up, I, xn2, C, p.up_w, n, I, C);
  if (lora != nullptr) {
    lora_forward(ops, lora_rows(*lora, 4, r0, C), 4, gate, I, xn2, C, n, C, I);
    lora_forward(ops, lora_rows(*lora, 5, r0, C), 5, up, I, xn2, C, n, C, I);
  }
  if (out == nullptr && !hmid_needed) return;  // Note [hmid in the workspace]: a frozen MLP's backward
  gated_forward(ops, cfg, hmid, gate, up, static_cast<std::size_t>(n) * I);
  if (out == nullptr) {
    if (lora != nullptr) lora_forward_u(ops, lora_rows(*lora, 6, r0, I), 6, hmid, I, n, I);
    return;
  }
  linear.nt(ops, tmp, C, hmid, I, p.down_w, n, C, I);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, 6, r0, I), 6, tmp, C, hmid, I, n, I, C);
  if (cfg.post_norms())  // Note [post norms]: in place
    ops.rmsnorm_forward(tmp, s.rstd_pf + r0, tmp, p.post_ff_norm_w, n, C, cfg.layer_norm_eps);
  ops.add(out + at, res2, tmp, static_cast<std::size_t>(n) * C);
}

// Note [post norms]: the gradient of a projection's output y = proj(in) (+ adapter k) given d z
// for z = rmsnorm(y) (n rows): y and its rstd recomputed into w.post (the norm's output into
// w.dxn, then dropped), then d y into w.dxn; dw (+)= the norm weight's gradient (null: frozen).
const float* post_norm_backward(const Ops& ops, const Linear& linear, const TensorView& proj, const float* norm_w,
                                float* dw, const float* in, int K, const float* dz, float* rstd, LlamaWorkspace& w,
                                int r0, int n, int C, int k, const LoraBlock* lora, float eps, bool acc) {
  STRATUM_ASSERT(w.post != nullptr && norm_w != nullptr);
  linear.nt(ops, w.post, C, in, K, proj, n, C, K);
  if (lora != nullptr) lora_forward(ops, lora_rows(*lora, k, r0, K), k, w.post, C, in, K, n, K, C);
  ops.rmsnorm_forward(w.dxn, rstd, w.post, norm_w, n, C, eps);
  ops.fill(w.dxn, 0.0f, static_cast<std::size_t>(n) * C);
  ops.rmsnorm_backward(w.dxn, dw, dz, w.post, norm_w, rstd, n, C, acc);
  return w.dxn;
}
}  // namespace

void llama_block_forward(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                         const RopeTable& rope, AttentionScores scores, const LlamaBlockTensors& p, const float* x, float* out,
                         LlamaActivations& s, float* tmp, float* attn_scratch, int B, int T, const LoraBlock* lora,
                         BlockPart part) {
  const int BT = B * T, C = cfg.n_embd;
  STRATUM_ASSERT(part != BlockPart::Attention || x != out);
  // Row chunk by row chunk (Note [row chunks]): every row's q, k and v first (a row attends to
  // the keys before it), then the rest of the block; adapters (Note [lora math]) add to each
  // projection before it is used (q and k before rope). A half (Note [block halves]) keeps res2
  // in out.
  if (part != BlockPart::Mlp) {
    llama_qkv(ops, linear, attention, cfg, rope, p, x, s, B, T, lora);
    if (!attention.by_row_chunks())
      attention.attend(ops, s.atty, s.att_stats, attn_scratch, s.qkv, B, T, cfg.n_head, cfg.kv_heads(),
                       cfg.head_dim(), 0, BT, scores);
  }
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    float* const res2 = part == BlockPart::Whole ? s.res2 + s.chunk_row(r0) * C : out + static_cast<std::size_t>(r0) * C;
    if (part != BlockPart::Mlp)
      llama_attention_rows(ops, linear, attention, cfg, p, x, s, tmp, attn_scratch, B, T, r0, n, lora, res2, scores);
    if (part != BlockPart::Attention)  // in sub-chunks (Note [frozen MLP rows])
      for_each_sub_chunk(r0, n, s.rows.mlp, [&](int q0, int m) {
        llama_mlp_rows(ops, linear, cfg, p, s, tmp, out, q0, m, lora, res2 + static_cast<std::size_t>(q0 - r0) * C);
      });
  });
}

void llama_block_backward(const Ops& ops, const GptConfig& cfg, const RopeTable& rope, AttentionScores scores,
                          const LlamaBlockTensors& p,
                          const LlamaBlockTensors* g, const float* x, const float* dout, float* dx,
                          LlamaActivations& s, LlamaWorkspace& w, int B, int T, bool recompute, const LoraBlock* lora,
                          BlockPart part) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), hd = cfg.head_dim();
  const int Q = cfg.q_dim(), KVd = cfg.kv_dim(), QKV = Q + 2 * KVd, I = cfg.mlp_width();
  const GemmLinear linear{w.wide, w.wide_floats};
  // Recompute every row's qkv; each chunk's attention rows and MLP internals are recomputed
  // below, just before its backward; or, in two parts (Note [attention recompute first]), the
  // attention half's first, for the pass's one chunk.
  STRATUM_ASSERT(part == BlockPart::Whole || (recompute && BT <= w.rows.chunk));
  if (recompute && part != BlockPart::Mlp) llama_qkv(ops, linear, CausalAttention{}, cfg, rope, p, x, s, B, T, lora);
  if (part == BlockPart::Attention) {
    llama_attention_rows(ops, linear, CausalAttention{}, cfg, p, x, s, w.tmp, w.attn_scratch, B, T, 0, BT, lora, s.res2,
                         scores);
    return;
  }
  // A frozen base (g null, Note [lora segments]) gets no weight gradients; dx is the same.
  auto weight_grad = [&](int M, int N, int K, const float* a, int lda, const float* b, int ldb,
                         TensorView LlamaBlockTensors::*field, bool acc = false) {  // g.field (M,N) (+)= a^T b
    if (g != nullptr) ops.sgemm(true, false, M, N, K, 1.0f, a, lda, b, ldb, acc ? 1.0f : 0.0f, (g->*field).f32(), N);
  };
  auto norm_grad = [&](float* LlamaBlockTensors::*field) { return g != nullptr ? g->*field : nullptr; };
  auto adapt = [&](int k, int r0, int n, bool acc, const float* dy, int ldy, const float* in, int ldx, float* din, int K,
                   int N) {
    if (lora != nullptr) lora_backward(ops, lora_rows(*lora, k, r0, K), k, dy, ldy, in, ldx, din, K, n, K, N, acc);
  };

  // Chunk by chunk (Note [row chunks]): the MLP, out = res2 + down(silu(gate(xn2)) * up(xn2)), xn2
  // = rmsnorm(res2), then the attention output's projection, res2 = x + o(atty), and the
  // attention's rows (Note [attention row ranges]), which add to the dk and dv of every row before
  // them. hmid is in w.dgate (Note [hmid in the workspace]): the chunk's recompute writes it
  // there, or it is recomputed from kept gate and up. d res2 is built in dx's rows.
  STRATUM_ASSERT((s.hmid == w.dgate || (w.gate_holds_hmid && s.hmid == s.gate)) && s.xn1 == w.tmp && s.xn2 == w.tmp);
  // hmid feeds only down's weight gradient and its adapter; where neither is, its swiglu is
  // skipped, and the d gate rows may be gate's (Note [hmid in the workspace]).
  // Note [post norms]: Gemma 3's backward recomputes down(hmid).
  const bool hmid_needed = g != nullptr || (lora != nullptr && lora->t[6].a != nullptr) || cfg.post_norms();
  STRATUM_ASSERT(!w.gate_holds_hmid || !hmid_needed);
  const float eps = cfg.layer_norm_eps;
  STRATUM_ASSERT(s.rows == w.rows);
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    const std::size_t at = static_cast<std::size_t>(r0) * C;
    float* const res2_chunk = s.res2 + s.chunk_row(r0) * C;
    const float* const atty = s.atty + s.chunk_row(r0) * Q;
    const bool acc = r0 > 0;  // later chunks add to the gradients
    if (recompute && part == BlockPart::Whole)
      llama_attention_rows(ops, linear, CausalAttention{}, cfg, p, x, s, w.tmp, w.attn_scratch, B, T, r0, n, lora,
                           res2_chunk, scores);
    // The MLP half in sub-chunks (Note [frozen MLP rows]: one, the chunk, where it trains).
    STRATUM_ASSERT(w.rows.mlp >= n || (g == nullptr && (lora == nullptr || (lora->t[4].a == nullptr &&
                                                         lora->t[5].a == nullptr && lora->t[6].a == nullptr))));
    for_each_sub_chunk(r0, n, w.rows.mlp, [&](int q0, int m) {
      const std::size_t qat = static_cast<std::size_t>(q0) * C, mlp = s.chunk_row(q0) * I;
      const std::size_t rows_i = static_cast<std::size_t>(m) * I;
      const bool qacc = q0 > 0;
      float* const res2 = res2_chunk + static_cast<std::size_t>(q0 - r0) * C;
      const float* const dout_c = dout + qat;
      const float* const gate = s.gate + mlp;
      const float* const up = s.up + mlp;
      const float* const xn2 = s.xn2;
      if (recompute) {
        llama_mlp_rows(ops, linear, cfg, p, s, nullptr, nullptr, q0, m, lora, res2, hmid_needed);
      } else {
        ops.rmsnorm_forward(s.xn2, s.rstd2 + q0, res2, p.mlp_norm_w, m, C, eps);  // into tmp again
        if (hmid_needed) gated_forward(ops, cfg, w.dgate, gate, up, rows_i);
      }
      // d gate's rows: the workspace's, or gate's own (read by the swiglu backward before it writes)
      float* const dgate = w.gate_holds_hmid ? s.gate + mlp : w.dgate;
      // The gradient of down's output: d out, or (Note [post norms]) through the norm after it.
      const float* const dmlp =
          cfg.post_norms() ? post_norm_backward(ops, linear, p.down_w, p.post_ff_norm_w,
                                                norm_grad(&LlamaBlockTensors::post_ff_norm_w), s.hmid, I, dout_c,
                                                s.rstd_pf + q0, w, q0, m, C, 6, lora, eps, qacc)
                           : dout_c;
      sgemm_w(ops, false, false, m, I, C, 1.0f, dmlp, C, p.down_w, I, 0.0f, w.dup, I, w.wide, w.wide_floats);  // d hmid (m, I)
      weight_grad(C, I, m, dmlp, C, s.hmid, I, &LlamaBlockTensors::down_w, qacc);  // d down (C, I)
      adapt(6, q0, m, qacc, dmlp, C, s.hmid, I, w.dup, I, C);
      if (cfg.gelu_mlp())  // Note [gemma]; both read each d hmid and gate before writing
        ops.geglu_backward(dgate, w.dup, w.dup, gate, up, rows_i);
      else
        ops.swiglu_backward(dgate, w.dup, w.dup, gate, up, rows_i);
      sgemm_w(ops, false, false, m, C, I, 1.0f, dgate, I, p.gate_w, C, 0.0f, w.dxn, C, w.wide, w.wide_floats);
      sgemm_w(ops, false, false, m, C, I, 1.0f, w.dup, I, p.up_w, C, 1.0f, w.dxn, C, w.wide, w.wide_floats);
      weight_grad(I, C, m, dgate, I, xn2, C, &LlamaBlockTensors::gate_w, qacc);
      weight_grad(I, C, m, w.dup, I, xn2, C, &LlamaBlockTensors::up_w, qacc);
      adapt(4, q0, m, qacc, dgate, I, xn2, C, w.dxn, C, I);
      adapt(5, q0, m, qacc, w.dup, I, xn2, C, w.dxn, C, I);
      // d res2, in dx's rows: dout_c's last read (dx may be dout: in place)
      if (dx != dout) ops.copy(dx + qat, dout_c, static_cast<std::size_t>(m) * C);
      ops.rmsnorm_backward(dx + qat, norm_grad(&LlamaBlockTensors::mlp_norm_w), w.dxn, res2, p.mlp_norm_w,
                           s.rstd2 + q0, m, C, qacc);
    });
    // The gradient of o's output: d res2, or (Note [post norms]) through the norm after it.
    const float* const datt =
        cfg.post_norms() ? post_norm_backward(ops, linear, p.o_w, p.post_attn_norm_w,
                                              norm_grad(&LlamaBlockTensors::post_attn_norm_w), atty, Q, dx + at,
                                              s.rstd_pa + r0, w, r0, n, C, 3, lora, eps, acc)
                         : dx + at;
    sgemm_w(ops, false, false, n, Q, C, 1.0f, datt, C, p.o_w, Q, 0.0f, w.datty, Q, w.wide, w.wide_floats);
    weight_grad(C, Q, n, datt, C, atty, Q, &LlamaBlockTensors::o_w, acc);
    adapt(3, r0, n, acc, datt, C, atty, Q, w.datty, Q, C);
    ops.attention_backward(w.dqkv, w.attn_scratch, w.datty, s.qkv, s.att_stats, B, T, H, KV, hd, r0, n, scores);
  });

  // Attention: qkv = rope(q(xn1)), rope(k(xn1)), v(xn1), xn1 = rmsnorm(x); every row's dk and dv
  // are complete now.
  ops.rope_backward(w.dqkv, B, T, H, hd, QKV, nullptr, rope);
  ops.rope_backward(w.dqkv + Q, B, T, KV, hd, QKV, nullptr, rope);
  for_each_row_chunk(BT, s.rows.chunk, [&](int r0, int n) {
    const std::size_t at = static_cast<std::size_t>(r0) * C;
    const bool acc = r0 > 0;
    float* const dqkv = w.dqkv + static_cast<std::size_t>(r0) * QKV;
    if (cfg.qk_norm()) {  // Note [qk norm]: the raw q and k (and xn1) again, then their gradients in place
      llama_qkv_rows(ops, linear, cfg, p, x, s, r0, n, lora, /*with_v=*/false);
      const float* const qk = s.qkv + static_cast<std::size_t>(r0) * QKV;
      ops.rmsnorm_heads_backward(dqkv, qk, QKV, norm_grad(&LlamaBlockTensors::q_norm_w), p.q_norm_w,
                                 s.rstd_q + static_cast<std::size_t>(r0) * H, n, H, hd, acc);
      ops.rmsnorm_heads_backward(dqkv + Q, qk + Q, QKV, norm_grad(&LlamaBlockTensors::k_norm_w), p.k_norm_w,
                                 s.rstd_k + static_cast<std::size_t>(r0) * KV, n, KV, hd, acc);
    }
    sgemm_w(ops, false, false, n, C, Q, 1.0f, dqkv, QKV, p.q_w, C, 0.0f, w.dxn, C, w.wide, w.wide_floats);
    sgemm_w(ops, false, false, n, C, KVd, 1.0f, dqkv + Q, QKV, p.k_w, C, 1.0f, w.dxn, C, w.wide, w.wide_floats);
    sgemm_w(ops, false, false, n, C, KVd, 1.0f, dqkv + Q + KVd, QKV, p.v_w, C, 1.0f, w.dxn, C, w.wide, w.wide_floats);
    if (!cfg.qk_norm()) ops.rmsnorm_forward(s.xn1, s.rstd1 + r0, x + at, p.attn_norm_w, n, C, eps);  // into tmp again
    weight_grad(Q, C, n, dqkv, QKV, s.xn1, C, &LlamaBlockTensors::q_w, acc);
    weight_grad(KVd, C, n, dqkv + Q, QKV, s.xn1, C, &LlamaBlockTensors::k_w, acc);
    weight_grad(KVd, C, n, dqkv + Q + KVd, QKV, s.xn1, C, &LlamaBlockTensors::v_w, acc);
    if (g != nullptr && cfg.qkv_bias()) {  // Qwen2 (Note [biases by products])
      STRATUM_ASSERT(g->q_b != nullptr && g->k_b != nullptr && g->v_b != nullptr && w.ones != nullptr);
      llama_bias_grad(ops, g->q_b, dqkv, QKV, w.ones, n, Q, acc);
      llama_bias_grad(ops, g->k_b, dqkv + Q, QKV, w.ones, n, KVd, acc);
      llama_bias_grad(ops, g->v_b, dqkv + Q + KVd, QKV, w.ones, n, KVd, acc);
    }
    adapt(0, r0, n, acc, dqkv, QKV, s.xn1, C, w.dxn, C, Q);
    adapt(1, r0, n, acc, dqkv + Q, QKV, s.xn1, C, w.dxn, C, KVd);
    adapt(2, r0, n, acc, dqkv + Q + KVd, QKV, s.xn1, C, w.dxn, C, KVd);
    ops.rmsnorm_backward(dx + at, norm_grad(&LlamaBlockTensors::attn_norm_w), w.dxn, x + at, p.attn_norm_w,
                         s.rstd1 + r0, n, C, acc);
  });
}

}  // namespace stratum
