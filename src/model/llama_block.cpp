// Llama block forward/backward; see llama_block.h.
#include "model/llama_block.h"

#include <algorithm>
#include <cstring>

namespace stratum {

LlamaBlockTensors llama_block_tensors(const Ops& ops, const SegmentLayout& layout, const TensorView* chunks,
                                    float* widened) {
  auto view = [&](int i) { return layout.tensor_view(chunks, layout.tensors[i]); };
  WidenedVectors vectors(ops, widened);
  // Braced initialisation evaluates left to right: the slices follow one another.
  return LlamaBlockTensors{vectors(view(kAttnNormW)), view(kQW),    view(kKW),  view(kVW), view(kOW),
                           vectors(view(kMlpNormW)),  view(kGateW), view(kUpW), view(kDownW)};
}

LlamaActivations::LlamaActivations(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                   const LlamaWorkspace* borrow)
    : buffer_(ops_buffer_carve(ops, slices(cfg, max_batch, max_seq, attention_stats, borrow != nullptr))) {
  if (borrow != nullptr) {
    hmid = borrow->dgate;
    xn1 = xn2 = borrow->tmp;
  }
}

LlamaActivations::LlamaActivations(const GptConfig& cfg, int max_batch, int max_seq, const LlamaWorkspace& w,
                                   float* memory) {
  aligned_carve_into(slices(cfg, max_batch, max_seq, true, true), memory);
  const LlamaWorkspace* borrow = &w;
  if (borrow != nullptr) {
    hmid = borrow->dgate;
    xn1 = xn2 = borrow->tmp;
  }
}

std::size_t LlamaActivations::bytes_for(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                        bool borrowed) {
  LlamaActivations probe{NoBuffer{}};
  return aligned_buffer_carve_bytes(probe.slices(cfg, max_batch, max_seq, attention_stats, borrowed));
}

CarveSlices LlamaActivations::slices(const GptConfig& cfg, int max_batch, int max_seq, bool attention_stats,
                                     bool borrow) {
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  const std::size_t Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim()), I = cfg.mlp_width();
  const std::size_t stats = attention_stats ? static_cast<std::size_t>(max_batch) * cfg.n_head * max_seq * 2 : 0;
  const std::size_t own = borrow ? 0 : 1;
  return CarveSlices({{&xn1, own * BT * C}, {&rstd1, BT}, {&qkv, BT * QKV}, {&this->att_stats, stats}, {&atty, BT * Q},
                                  {&res2, BT * C}, {&xn2, own * BT * C}, {&rstd2, BT}, {&gate, BT * I}, {&up, BT * I},
                                  {&hmid, own * BT * I}});
}

LlamaWorkspace::LlamaWorkspace(const Ops& ops, const GptConfig& cfg, int max_batch, int max_seq, bool bf16_weights) {
  const std::size_t BT = static_cast<std::size_t>(max_batch) * max_seq, C = cfg.n_embd;
  const std::size_t Q = cfg.q_dim(), QKV = Q + 2 * static_cast<std::size_t>(cfg.kv_dim()), I = cfg.mlp_width();
  const std::size_t wide_floats = bf16_weights ? std::max(Q, I) * C : 0, vector_floats = bf16_weights ? 2 * C : 0;
  buffer_ = ops_buffer_carve(ops, 
      {{&tmp, BT * C}, {&dres2, BT * C}, {&dxn, BT * C}, {&datty, BT * Q}, {&dqkv, BT * QKV}, {&dgate, BT * I},
       {&dup, BT * I},
       {&attn_scratch, ops.attention_scratch_floats(max_batch, max_seq, cfg.n_head, cfg.kv_heads(), cfg.head_dim())},
       {&wide, wide_floats}, {&wide_vectors, vector_floats}});
  if (!bf16_weights) wide = wide_vectors = nullptr;
}

void llama_block_forward(const Ops& ops, const Linear& linear, const Attention& attention, const GptConfig& cfg,
                         const RopeTable& rope, const LlamaBlockTensors& p, const float* x, float* out,
                         LlamaActivations& s, float* tmp, float* attn_scratch, int B, int T, const LoraBlock* lora) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), hd = cfg.head_dim();
  const int Q = cfg.q_dim(), KVd = cfg.kv_dim(), QKV = Q + 2 * KVd, I = cfg.mlp_width();
  const float eps = cfg.layer_norm_eps;
  const std::size_t rows_c = static_cast<std::size_t>(BT) * C;
  // Adapters (Note [lora math]) add to each projection before it is used (q and k before rope).
  auto adapt = [&](int k, float* y, int ldy, const float* in, int ldx, int K, int N) {
    if (lora != nullptr) lora_forward(ops, *lora, k, y, ldy, in, ldx, BT, K, N);
  };
  ops.rmsnorm_forward(s.xn1, s.rstd1, x, p.attn_norm_w, BT, C, eps);
  linear.nt(ops, s.qkv, QKV, s.xn1, C, p.q_w, BT, Q, C);
  linear.nt(ops, s.qkv + Q, QKV, s.xn1, C, p.k_w, BT, KVd, C);
  linear.nt(ops, s.qkv + Q + KVd, QKV, s.xn1, C, p.v_w, BT, KVd, C);
  adapt(0, s.qkv, QKV, s.xn1, C, C, Q);
  adapt(1, s.qkv + Q, QKV, s.xn1, C, C, KVd);
  adapt(2, s.qkv + Q + KVd, QKV, s.xn1, C, C, KVd);
  ops.rope_forward(s.qkv, B, T, H, hd, QKV, attention.positions(), rope);
  ops.rope_forward(s.qkv + Q, B, T, KV, hd, QKV, attention.positions(), rope);
  attention.attend(ops, s.atty, s.att_stats, attn_scratch, s.qkv, B, T, H, KV, hd);
  linear.nt(ops, tmp, C, s.atty, Q, p.o_w, BT, C, Q);
  adapt(3, tmp, C, s.atty, Q, Q, C);
  ops.add(s.res2, x, tmp, rows_c);
  ops.rmsnorm_forward(s.xn2, s.rstd2, s.res2, p.mlp_norm_w, BT, C, eps);
  linear.nt(ops, s.gate, I, s.xn2, C, p.gate_w, BT, I, C);
  linear.nt(ops, s.up, I, s.xn2, C, p.up_w, BT, I, C);
  adapt(4, s.gate, I, s.xn2, C, C, I);
  adapt(5, s.up, I, s.xn2, C, C, I);
  ops.swiglu_forward(s.hmid, s.gate, s.up, static_cast<std::size_t>(BT) * I);
  linear.nt(ops, tmp, C, s.hmid, I, p.down_w, BT, C, I);
  adapt(6, tmp, C, s.hmid, I, I, C);
  ops.add(out, s.res2, tmp, rows_c);
}

void llama_block_backward(const Ops& ops, const GptConfig& cfg, const RopeTable& rope, const LlamaBlockTensors& p,
                          const LlamaBlockTensors* g, const float* x, const float* dout, float* dx,
                          LlamaActivations& s, LlamaWorkspace& w, int B, int T, bool recompute, const LoraBlock* lora) {
  const int BT = B * T, C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), hd = cfg.head_dim();
  const int Q = cfg.q_dim(), KVd = cfg.kv_dim(), QKV = Q + 2 * KVd, I = cfg.mlp_width();
  const std::size_t rows_c = static_cast<std::size_t>(BT) * C;
  if (recompute)
    llama_block_forward(ops, GemmLinear{w.wide}, CausalAttention{}, cfg, rope, p, x, w.tmp, s, w.tmp, w.attn_scratch,
                        B, T, lora);
  // A frozen base (g null, Note [lora segments]) gets no weight gradients; dx is the same.
  auto weight_grad = [&](int M, int N, int K, const float* a, int lda, const float* b, int ldb,
                         TensorView LlamaBlockTensors::*field) {  // g.field (M,N) = a^T b, a (K,M), b (K,N)
    if (g != nullptr) ops.sgemm(true, false, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, (g->*field).f32(), N);
  };
  auto norm_grad = [&](float* LlamaBlockTensors::*field) { return g != nullptr ? g->*field : nullptr; };
  auto adapt = [&](int k, const float* dy, int ldy, const float* in, int ldx, float* din, int K, int N) {
    if (lora != nullptr) lora_backward(ops, *lora, k, dy, ldy, in, ldx, din, K, BT, K, N);
  };

  // MLP: out = res2 + down(silu(gate(xn2)) * up(xn2)), xn2 = rmsnorm(res2). hmid is in w.dgate
  // (Note [hmid in the workspace]): the recompute just wrote it there; kept internals need it again.
  const std::size_t rows_i = static_cast<std::size_t>(BT) * I;
  STRATUM_ASSERT(s.hmid == w.dgate && s.xn1 == w.tmp && s.xn2 == w.tmp);
  if (!recompute) ops.swiglu_forward(w.dgate, s.gate, s.up, rows_i);
  const float eps = cfg.layer_norm_eps;
  sgemm_w(ops, false, false, BT, I, C, 1.0f, dout, C, p.down_w, I, 0.0f, w.dup, I, w.wide);   // d hmid (BT, I)
  weight_grad(C, I, BT, dout, C, w.dgate, I, &LlamaBlockTensors::down_w);                // d down (C, I)
  adapt(6, dout, C, w.dgate, I, w.dup, I, C);
  ops.swiglu_backward(w.dgate, w.dup, w.dup, s.gate, s.up, rows_i);  // reads each d hmid before writing
  sgemm_w(ops, false, false, BT, C, I, 1.0f, w.dgate, I, p.gate_w, C, 0.0f, w.dxn, C, w.wide);
  sgemm_w(ops, false, false, BT, C, I, 1.0f, w.dup, I, p.up_w, C, 1.0f, w.dxn, C, w.wide);
  ops.rmsnorm_forward(s.xn2, s.rstd2, s.res2, p.mlp_norm_w, BT, C, eps);  // into tmp again
  weight_grad(I, C, BT, w.dgate, I, s.xn2, C, &LlamaBlockTensors::gate_w);
  weight_grad(I, C, BT, w.dup, I, s.xn2, C, &LlamaBlockTensors::up_w);
  adapt(4, w.dgate, I, s.xn2, C, w.dxn, C, I);
  adapt(5, w.dup, I, s.xn2, C, w.dxn, C, I);
  ops.copy(w.dres2, dout, rows_c);
  ops.rmsnorm_backward(w.dres2, norm_grad(&LlamaBlockTensors::mlp_norm_w), w.dxn, s.res2, p.mlp_norm_w, s.rstd2, BT,
                       C, false);

  // Attention: res2 = x + o(attention(rope(q(xn1)), rope(k(xn1)), v(xn1))), xn1 = rmsnorm(x)
  sgemm_w(ops, false, false, BT, Q, C, 1.0f, w.dres2, C, p.o_w, Q, 0.0f, w.datty, Q, w.wide);
  weight_grad(C, Q, BT, w.dres2, C, s.atty, Q, &LlamaBlockTensors::o_w);
  adapt(3, w.dres2, C, s.atty, Q, w.datty, Q, C);
  ops.attention_backward(w.dqkv, w.attn_scratch, w.datty, s.qkv, s.att_stats, B, T, H, KV, hd);
  ops.rope_backward(w.dqkv, B, T, H, hd, QKV, nullptr, rope);
  ops.rope_backward(w.dqkv + Q, B, T, KV, hd, QKV, nullptr, rope);
  sgemm_w(ops, false, false, BT, C, Q, 1.0f, w.dqkv, QKV, p.q_w, C, 0.0f, w.dxn, C, w.wide);
  sgemm_w(ops, false, false, BT, C, KVd, 1.0f, w.dqkv + Q, QKV, p.k_w, C, 1.0f, w.dxn, C, w.wide);
  sgemm_w(ops, false, false, BT, C, KVd, 1.0f, w.dqkv + Q + KVd, QKV, p.v_w, C, 1.0f, w.dxn, C, w.wide);
  ops.rmsnorm_forward(s.xn1, s.rstd1, x, p.attn_norm_w, BT, C, eps);  // into tmp again
  weight_grad(Q, C, BT, w.dqkv, QKV, s.xn1, C, &LlamaBlockTensors::q_w);
  weight_grad(KVd, C, BT, w.dqkv + Q, QKV, s.xn1, C, &LlamaBlockTensors::k_w);
  weight_grad(KVd, C, BT, w.dqkv + Q + KVd, QKV, s.xn1, C, &LlamaBlockTensors::v_w);
  adapt(0, w.dqkv, QKV, s.xn1, C, w.dxn, C, Q);
  adapt(1, w.dqkv + Q, QKV, s.xn1, C, w.dxn, C, KVd);
  adapt(2, w.dqkv + Q + KVd, QKV, s.xn1, C, w.dxn, C, KVd);
  ops.copy(dx, w.dres2, rows_c);
  ops.rmsnorm_backward(dx, norm_grad(&LlamaBlockTensors::attn_norm_w), w.dxn, x, p.attn_norm_w, s.rstd1, BT, C, false);
}

}  // namespace stratum
