// Decoder: KV-cached incremental forward; see decoder.h and Note [decode schedule].
#include "infer/decoder.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"
#include "model/gpt2_block.h"
#include "model/llama_block.h"
#include "stratum/error.h"

namespace stratum {

namespace {
std::size_t rows_for(int max_batch) { return static_cast<std::size_t>(std::max(Decoder::kMaxRows, max_batch)); }
std::size_t qkv_width(const GptConfig& c) { return static_cast<std::size_t>(c.q_dim()) + 2 * c.kv_dim(); }
std::size_t cache_floats_for(const GptConfig& c, int max_batch, int max_ctx) {
  return static_cast<std::size_t>(max_batch) * c.kv_heads() * max_ctx * c.head_dim();
}
std::size_t buffer_floats(const GptConfig& c, int max_batch, int max_ctx) {
  const std::size_t R = rows_for(max_batch), C = c.n_embd, Q = c.q_dim(), I = c.mlp_width();
  return R * (5 * C + 2 + qkv_width(c) + 2 * Q + 3 * I) + static_cast<std::size_t>(max_batch) * C +
         static_cast<std::size_t>(max_batch) * c.n_head * max_ctx + 16 * 16;
}
}  // namespace

std::size_t Decoder::fixed_bytes_for(const GptConfig& cfg, int max_batch, int max_ctx) {
  const std::size_t head = static_cast<std::size_t>(max_batch) * (2 * cfg.n_embd + 6) +
                           static_cast<std::size_t>(kHeadRows) * vocab_block_rows(cfg);
  return sizeof(float) * (2 * cfg.n_layer * cache_floats_for(cfg, max_batch, max_ctx) +
                          buffer_floats(cfg, max_batch, max_ctx) + head +
                          static_cast<std::size_t>(max_ctx) * cfg.head_dim());
}

std::size_t Decoder::min_store_bytes(const UnitTable& units) {
  const ParamLayout& layout = units.layout();
  std::size_t layer = 0, vocab = 0;
  for (int s = 0; s < layout.segment_count(); ++s) {
    std::size_t bytes = 0;
    for (int c = 0; c < units.chunk_count(s, SegmentKind::Params); ++c)
      bytes += units.bytes(units.index(s, SegmentKind::Params, c));
    if (layout.segments()[s].role == SegmentRole::Vocab || layout.segments()[s].role == SegmentRole::HeadVocab)
      vocab = std::max(vocab, bytes);
    else
      layer = std::max(layer, bytes);
  }
  return layer + vocab;
}

Decoder::Decoder(ThreadPool& pool, const GptConfig& cfg, SegmentStore& store, int max_batch, int max_ctx)
    : pool_(pool),
      cfg_(cfg),
      store_(store),
      layout_(store.units().layout()),
      max_batch_(max_batch),
      max_ctx_(max_ctx),
      cache_floats_(cache_floats_for(cfg, max_batch, max_ctx)),
      cache_(2 * static_cast<std::size_t>(cfg.n_layer) * cache_floats_ * sizeof(float)),
      head_scratch_(cfg, max_batch),
      schedule_(store.units().count()) {
  STRATUM_CHECK(max_ctx >= 1 && max_ctx <= cfg.n_ctx, "[generate] context ", max_ctx,
                " exceeds the model's maximum of ", cfg.n_ctx);
  const std::size_t R = rows_for(max_batch), C = cfg.n_embd, Q = cfg.q_dim(), I = cfg.mlp_width();
  buffer_ = aligned_buffer_carve({{&x_, R * C},
                                  {&xn_, R * C},
                                  {&mean_, R},
                                  {&rstd_, R},
                                  {&qkv_, R * qkv_width(cfg)},
                                  {&q_, R * Q},
                                  {&atty_, R * Q},
                                  {&tmp_, R * C},
                                  {&mlp_a_, R * I},
                                  {&mlp_b_, R * I},
                                  {&mlp_c_, R * I},
                                  {&last_, static_cast<std::size_t>(max_batch) * C},
                                  {&scratch_, attention_cached_scratch_floats(max_batch, 1, cfg.n_head, max_ctx)}});
  if (cfg.llama()) rope_ = std::make_unique<RopeTable>(cfg.head_dim(), max_ctx, cfg.rope_theta, cfg.rope_scaling);
  // Note [decode schedule]
  const UnitTable& units = store.units();
  auto params = [&](int s) {
    std::vector<UnitUse> uses;
    for (int c = 0; c < units.chunk_count(s, SegmentKind::Params); ++c)
      uses.push_back({units.index(s, SegmentKind::Params, c), Access::Read});
    return uses;
  };
  for (int l = 0; l < cfg.n_layer; ++l)
    group_layer_.push_back(schedule_.group_add(params(layout_.layer_segment(l)), GroupWork::LayerForward));
  group_head_ = schedule_.group_add(params(layout_.head_segment()), GroupWork::HeadBegin);
  for (int k = 0; k < layout_.vocab_block_count(); ++k)
    group_head_vocab_.push_back(schedule_.group_add(params(layout_.head_vocab_segment(k)), GroupWork::HeadLse));
  store_.schedule_set(&schedule_);
}

Decoder::~Decoder() { store_.schedule_set(nullptr); }

void Decoder::step(const std::int32_t* tokens, int B, int Tn, const int* past, float* logits, const int* slot) {
  STRATUM_ASSERT(B >= 1 && B <= max_batch_ && Tn >= 1 && Tn <= max_step_tokens(B));
  std::vector<int> slots(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    slots[b] = slot != nullptr ? slot[b] : b;
    STRATUM_ASSERT(slots[b] >= 0 && slots[b] < max_batch_);
  }
  for (int b = 0; b < B; ++b) {
    STRATUM_CHECK(past[b] >= 0 && past[b] + Tn <= max_ctx_, "[generate] sequence ", b, " would reach position ",
                  past[b] + Tn, ", beyond the context of ", max_ctx_, " tokens");
    for (int t = 0; t < Tn; ++t) {
      const std::int32_t id = tokens[static_cast<std::size_t>(b) * Tn + t];
      STRATUM_CHECK(id >= 0 && id < cfg_.vocab_size, "[generate] token id ", id, " is outside the model vocabulary (0..",
                    cfg_.vocab_size - 1, ")");
    }
  }
  embed(tokens, B, Tn, past);
  for (int l = 0; l < cfg_.n_layer; ++l) layer(l, B, Tn, past, slots.data());
  head(B, Tn, logits);
}

void Decoder::embed(const std::int32_t* tokens, int B, int Tn, const int* past) {
  const int C = cfg_.n_embd;
  const std::size_t rows = static_cast<std::size_t>(B) * Tn;
  if (cfg_.llama()) {
    std::memset(x_, 0, rows * C * sizeof(float));
  } else {  // positions past[b] + t of wpe
    SegmentHold embed(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
    const float* wpe = embed.data() + layout_.segments()[layout_.embed_segment()].tensors[kWpe].offset_floats;
    for (int b = 0; b < B; ++b)
      std::memcpy(x_ + static_cast<std::size_t>(b) * Tn * C, wpe + static_cast<std::size_t>(past[b]) * C,
                  static_cast<std::size_t>(Tn) * C * sizeof(float));
  }
  // Only the vocabulary blocks holding one of the step's tokens.
  std::vector<bool> needed(static_cast<std::size_t>(layout_.vocab_block_count()), false);
  for (std::size_t i = 0; i < rows; ++i) needed[tokens[i] / layout_.vocab_block_rows()] = true;
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    if (!needed[k]) continue;
    SegmentHold wte(store_, layout_.vocab_segment(k), SegmentKind::Params, Access::Read);
    embedding_forward_block(pool_, x_, tokens, wte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k), B, Tn, C);
  }
}

void Decoder::layer(int l, int B, int Tn, const int* past, const int* slot) {
  const int C = cfg_.n_embd, H = cfg_.n_head, KV = cfg_.kv_heads(), hd = cfg_.head_dim();
  const int Q = cfg_.q_dim(), KVd = cfg_.kv_dim(), W = static_cast<int>(qkv_width(cfg_)), I = cfg_.mlp_width();
  const int rows = B * Tn;
  const float eps = cfg_.layer_norm_eps;
  const int s = layout_.layer_segment(l);
  store_.schedule_at(group_layer_[l]);
  SegmentChunksHold params(store_, s, SegmentKind::Params, Access::Read);
  const SegmentLayout& seg = layout_.segments()[s];
  auto linear = [&](int M, int N, int K, const float* x, int ldx, const float* w, float* y, int ldy) {
    sgemm(false, true, M, N, K, 1.0f, x, ldx, w, K, 0.0f, y, ldy);  // y = x @ w^T, w (N, K)
  };
  // Attention input and qkv.
  const float* mlp_norm_w = nullptr;
  const float* mlp_norm_b = nullptr;
  Gpt2BlockTensors g{};
  LlamaBlockTensors m{};
  if (cfg_.llama()) {
    m = llama_block_tensors(seg, params.chunks());
    rmsnorm_forward(pool_, xn_, rstd_, x_, m.attn_norm_w, rows, C, eps);
    linear(rows, Q, C, xn_, C, m.q_w, qkv_, W);
    linear(rows, KVd, C, xn_, C, m.k_w, qkv_ + Q, W);
    linear(rows, KVd, C, xn_, C, m.v_w, qkv_ + Q + KVd, W);
    rope_forward(pool_, qkv_, B, Tn, H, hd, static_cast<std::size_t>(W), past, *rope_);
    rope_forward(pool_, qkv_ + Q, B, Tn, KV, hd, static_cast<std::size_t>(W), past, *rope_);
    mlp_norm_w = m.mlp_norm_w;
  } else {
    g = gpt2_block_tensors(seg, params.chunks());
    layernorm_forward(pool_, xn_, mean_, rstd_, x_, g.ln1_w, g.ln1_b, rows, C, eps);
    matmul_forward(pool_, qkv_, xn_, g.attn_w, g.attn_b, rows, C, 3 * C);
    mlp_norm_w = g.ln2_w;
    mlp_norm_b = g.ln2_b;
  }
  // Append the new keys and values to the cache; queries to a contiguous buffer.
  float* kc = kcache(l);
  float* vc = vcache(l);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      const std::size_t r = static_cast<std::size_t>(b) * Tn + t;
      const float* row = qkv_ + r * W;
      std::memcpy(q_ + r * Q, row, static_cast<std::size_t>(Q) * sizeof(float));
      for (int j = 0; j < KV; ++j) {
        const std::size_t at = ((static_cast<std::size_t>(slot[b]) * KV + j) * max_ctx_ + past[b] + t) * hd;
        std::memcpy(kc + at, row + Q + static_cast<std::size_t>(j) * hd, hd * sizeof(float));
        std::memcpy(vc + at, row + Q + KVd + static_cast<std::size_t>(j) * hd, hd * sizeof(float));
      }
    }
  // Slots run from 0 in the usual case (one call for the batch); otherwise row by row.
  bool identity = true;
  for (int b = 0; b < B; ++b) identity = identity && slot[b] == b;
  if (identity) {
    attention_cached(pool_, atty_, scratch_, q_, kc, vc, B, Tn, past, max_ctx_, H, KV, hd);
  } else {
    const std::size_t per_slot = static_cast<std::size_t>(KV) * max_ctx_ * hd;
    for (int b = 0; b < B; ++b) {
      const std::size_t r = static_cast<std::size_t>(b) * Tn;
      attention_cached(pool_, atty_ + r * Q, scratch_, q_ + r * Q, kc + slot[b] * per_slot, vc + slot[b] * per_slot, 1,
                       Tn, past + b, max_ctx_, H, KV, hd);
    }
  }
  const std::size_t rows_c = static_cast<std::size_t>(rows) * C;
  if (cfg_.llama()) {
    linear(rows, C, Q, atty_, Q, m.o_w, tmp_, C);
    add_f32(pool_, x_, x_, tmp_, rows_c);
    rmsnorm_forward(pool_, xn_, rstd_, x_, mlp_norm_w, rows, C, eps);
    linear(rows, I, C, xn_, C, m.gate_w, mlp_a_, I);
    linear(rows, I, C, xn_, C, m.up_w, mlp_b_, I);
    swiglu_forward(pool_, mlp_c_, mlp_a_, mlp_b_, static_cast<std::size_t>(rows) * I);
    linear(rows, C, I, mlp_c_, I, m.down_w, tmp_, C);
  } else {
    matmul_forward(pool_, tmp_, atty_, g.attn_proj_w, g.attn_proj_b, rows, C, C);
    add_f32(pool_, x_, x_, tmp_, rows_c);
    layernorm_forward(pool_, xn_, mean_, rstd_, x_, mlp_norm_w, mlp_norm_b, rows, C, eps);
    matmul_forward(pool_, mlp_a_, xn_, g.fc_w, g.fc_b, rows, C, I);
    gelu_forward(pool_, mlp_b_, mlp_a_, static_cast<std::size_t>(rows) * I);
    matmul_forward(pool_, tmp_, mlp_b_, g.mlp_proj_w, g.mlp_proj_b, rows, I, C);
  }
  add_f32(pool_, x_, x_, tmp_, rows_c);
}

void Decoder::head(int B, int Tn, float* logits) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  for (int b = 0; b < B; ++b)
    std::memcpy(last_ + static_cast<std::size_t>(b) * C, x_ + (static_cast<std::size_t>(b) * Tn + Tn - 1) * C,
                C * sizeof(float));
  const int head = layout_.head_segment();
  store_.schedule_at(group_head_);
  {
    SegmentHold head_p(store_, head, SegmentKind::Params, Access::Read);
    const auto& tensors = layout_.segments()[head].tensors;
    gpt2_head_begin(pool_, cfg_, head_p.data() + tensors[kLnFW].offset_floats,
                    cfg_.llama() ? nullptr : head_p.data() + tensors[kLnFB].offset_floats, last_, B, head_scratch_);
  }
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    store_.schedule_at(group_head_vocab_[k]);
    SegmentHold rows(store_, layout_.head_vocab_segment(k), SegmentKind::Params, Access::Read);
    // logits[:, v0 : v0 + n] = lnf (B, C) @ rows^T
    sgemm(false, true, B, layout_.vocab_rows(k), C, 1.0f, head_scratch_.lnf, C, rows.data(), C, 0.0f,
          logits + layout_.vocab_row0(k), V);
  }
}

}  // namespace stratum
