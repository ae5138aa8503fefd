// Decoder: KV-cached incremental forward; see decoder.h and Note [decode schedule].
#include "infer/decoder.h"

#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "core/bf16.h"
#include "model/gpt2_block.h"
#include "stratum/error.h"

namespace stratum {

namespace {
std::size_t rows_for(int max_batch) { return static_cast<std::size_t>(std::max(Decoder::kMaxRows, max_batch)); }
std::size_t cache_floats_for(const GptConfig& c, int max_batch, int max_ctx) {
  return static_cast<std::size_t>(max_batch) * c.kv_heads() * max_ctx * c.head_dim();
}
}  // namespace

CarveSlices Decoder::slices(const Ops& ops, Buffers& b, const GptConfig& cfg, int max_batch, int max_ctx) {
  const std::size_t R = rows_for(max_batch), C = cfg.n_embd, Q = cfg.q_dim();
  return {{&b.x, R * C},
          {&b.q, R * Q},
          {&b.tmp, R * C},
          {&b.last, static_cast<std::size_t>(max_batch) * C},
          {&b.scratch, ops.attention_cached_scratch_floats(max_batch, 1, cfg.n_head, max_ctx)},
          {&b.norm_w, C},
          {&b.norm_w2, C}};
}

std::size_t Decoder::kv_unit_floats(const GptConfig& cfg, int max_batch, int max_ctx) {
  return 2 * cache_floats_for(cfg, max_batch, max_ctx);
}

std::size_t Decoder::fixed_bytes_for(const Ops& ops, const GptConfig& cfg, int max_batch, int max_ctx) {
  Buffers sink{};
  const std::size_t rope = cfg.llama() ? RopeTable::bytes_for(cfg.head_dim(), max_ctx) : 0;
  const int R = static_cast<int>(rows_for(max_batch));
  const std::size_t acts = cfg.llama() ? LlamaActivations::bytes_for(cfg, 1, R, /*attention_probs=*/false)
                                       : Gpt2Activations::bytes_for(cfg, 1, R, /*attention_probs=*/false);
  return aligned_buffer_carve_bytes(slices(ops, sink, cfg, max_batch, max_ctx)) +
         Gpt2HeadScratch::bytes_for(cfg, max_batch) + rope + acts;
}

std::size_t Decoder::min_store_bytes(const UnitTable& units) {
  const ParamLayout& layout = units.layout();
  std::size_t layer = 0, vocab = 0;
  for (int s = 0; s < layout.segment_count(); ++s) {
    std::size_t bytes = 0;
    for (int c = 0; c < units.chunk_count(s, SegmentKind::Params); ++c)
      bytes += units.bytes(units.index(s, SegmentKind::Params, c));
    const int kv = units.find(s, SegmentKind::Activations);
    if (kv >= 0) bytes += units.bytes(kv);
    if (layout.segments()[s].role == SegmentRole::Vocab || layout.segments()[s].role == SegmentRole::HeadVocab)
      vocab = std::max(vocab, bytes);
    else
      layer = std::max(layer, bytes);
  }
  return layer + vocab;
}

Decoder::Decoder(ThreadPool& pool, const GptConfig& cfg, SegmentStore& store, int max_batch, int max_ctx)
    : ops_(ops_make(pool)),
      cfg_(cfg),
      store_(store),
      layout_(store.units().layout()),
      max_batch_(max_batch),
      max_ctx_(max_ctx),
      cache_floats_(cache_floats_for(cfg, max_batch, max_ctx)),
      bf16_(store.units().param_bf16()),
      buffer_(aligned_buffer_carve(slices(*ops_, b_, cfg, max_batch, max_ctx))),
      head_scratch_(cfg, max_batch),
      schedule_(store.units().count()) {
  STRATUM_CHECK(max_ctx >= 1 && max_ctx <= cfg.n_ctx, "[generate] context ", max_ctx,
                " exceeds the model's maximum of ", cfg.n_ctx);
  STRATUM_ASSERT(store.units().act_floats() >= kv_unit_floats(cfg, max_batch, max_ctx));  // Note [KV cache units]
  STRATUM_ASSERT(!bf16_ || cfg.llama());  // Note [bf16 weights]: Llama only
  const int R = static_cast<int>(rows_for(max_batch));
  if (cfg.llama()) {
    rope_ = std::make_unique<RopeTable>(cfg.head_dim(), max_ctx, cfg.rope_theta, cfg.rope_scaling);
    llama_acts_ = std::make_unique<LlamaActivations>(cfg, 1, R, /*attention_probs=*/false);
  } else {
    gpt2_acts_ = std::make_unique<Gpt2Activations>(cfg, 1, R, /*attention_probs=*/false);
  }
  // Note [decode schedule]
  const UnitTable& units = store.units();
  auto params = [&](int s) {
    std::vector<UnitUse> uses;
    for (int c = 0; c < units.chunk_count(s, SegmentKind::Params); ++c)
      uses.push_back({units.index(s, SegmentKind::Params, c), Access::Read});
    return uses;
  };
  for (int l = 0; l < cfg.n_layer; ++l) {
    std::vector<UnitUse> uses = params(layout_.layer_segment(l));
    uses.push_back({units.index(layout_.layer_segment(l), SegmentKind::Activations), Access::Update});
    group_layer_.push_back(schedule_.group_add(uses, GroupWork::LayerForward));
  }
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
  {
    TraceSpan span(trace_, TraceRecorder::kCompute, "forward", "embed");
    embed(tokens, B, Tn, past);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    TraceSpan span(trace_, TraceRecorder::kCompute, "forward", trace_ ? "layer." + std::to_string(l) : std::string());
    layer(l, B, Tn, past, slots.data());
  }
  TraceSpan span(trace_, TraceRecorder::kCompute, "forward", "head");
  head(B, Tn, logits);
}

void Decoder::embed(const std::int32_t* tokens, int B, int Tn, const int* past) {
  const int C = cfg_.n_embd;
  const std::size_t rows = static_cast<std::size_t>(B) * Tn;
  if (cfg_.llama()) {
    std::memset(b_.x, 0, rows * C * sizeof(float));
  } else {  // positions past[b] + t of wpe
    SegmentHold embed(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
    const float* wpe = embed.data() + layout_.segments()[layout_.embed_segment()].tensors[kWpe].offset_floats;
    for (int b = 0; b < B; ++b)
      std::memcpy(b_.x + static_cast<std::size_t>(b) * Tn * C, wpe + static_cast<std::size_t>(past[b]) * C,
                  static_cast<std::size_t>(Tn) * C * sizeof(float));
  }
  // Only the vocabulary blocks holding one of the step's tokens.
  std::vector<bool> needed(static_cast<std::size_t>(layout_.vocab_block_count()), false);
  for (std::size_t i = 0; i < rows; ++i) needed[tokens[i] / layout_.vocab_block_rows()] = true;
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    if (!needed[k]) continue;
    SegmentHold wte(store_, layout_.vocab_segment(k), SegmentKind::Params, Access::Read);
    if (bf16_)
      ops_->embedding_forward_block_bf16(b_.x, tokens, wte.view().bf16(),
                                   layout_.vocab_row0(k), layout_.vocab_rows(k), B, Tn, C);
    else
      ops_->embedding_forward_block(b_.x, tokens, wte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k), B, Tn, C);
  }
}

void Decoder::layer(int l, int B, int Tn, const int* past, const int* slot) {
  const int s = layout_.layer_segment(l);
  store_.schedule_at(group_layer_[l]);
  SegmentChunksHold params(store_, s, SegmentKind::Params, Access::Read);
  SegmentHold kv(store_, s, SegmentKind::Activations, Access::Update);  // Note [KV cache units]
  const CachedAttention attention(kv.data(), kv.data() + cache_floats_, b_.q, max_ctx_, past, slot);
  const RowDotLinear linear;
  const SegmentLayout& seg = layout_.segments()[s];
  if (cfg_.llama())
    llama_block_forward(*ops_, linear, attention, cfg_, *rope_, llama_tensors(seg, params), b_.x, b_.x,
                        *llama_acts_, b_.tmp, b_.scratch, B, Tn);
  else
    gpt2_block_forward(*ops_, linear, attention, cfg_, gpt2_block_tensors(seg, params.chunks()), b_.x, b_.x,
                       *gpt2_acts_, b_.tmp, b_.scratch, B, Tn);
}

LlamaBlockTensors Decoder::llama_tensors(const SegmentLayout& seg, const SegmentChunksHold& params) {
  if (!bf16_) return llama_block_tensors(seg, params.chunks());
  auto view = [&](int w) { return params.tensor_view(seg.tensors[w]); };
  auto widen = [&](int w, float* into) {
    const TensorView v = view(w);
    bf16_widen(into, v.bf16(), v.elements());
    return into;
  };
  return LlamaBlockTensors{widen(kAttnNormW, b_.norm_w), view(kQW),  view(kKW),   view(kVW),  view(kOW),
                           widen(kMlpNormW, b_.norm_w2),  view(kGateW), view(kUpW), view(kDownW)};
}

void Decoder::head(int B, int Tn, float* logits) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  for (int b = 0; b < B; ++b)
    std::memcpy(b_.last + static_cast<std::size_t>(b) * C, b_.x + (static_cast<std::size_t>(b) * Tn + Tn - 1) * C,
                C * sizeof(float));
  const int head = layout_.head_segment();
  store_.schedule_at(group_head_);
  {
    SegmentHold head_p(store_, head, SegmentKind::Params, Access::Read);
    const auto& tensors = layout_.segments()[head].tensors;
    gpt2_head_begin(*ops_, cfg_, weights_f32(head_p.view(), tensors[kLnFW].offset_floats, C, b_.norm_w),
                    cfg_.llama() ? nullptr : head_p.data() + tensors[kLnFB].offset_floats, b_.last, B, head_scratch_);
  }
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    store_.schedule_at(group_head_vocab_[k]);
    SegmentHold rows(store_, layout_.head_vocab_segment(k), SegmentKind::Params, Access::Read);
    // logits[:, v0 : v0 + n] = lnf (B, C) @ rows^T
    gpt2_head_logits_block(*ops_, RowDotLinear{}, cfg_, rows.view(), layout_.vocab_rows(k), B,
                           logits + layout_.vocab_row0(k), V, head_scratch_);
  }
}

const float* Decoder::weights_f32(const TensorView& unit, std::size_t at, int n, float* into) const {
  if (unit.dtype() == DType::F32) return unit.f32() + at;
  bf16_widen(into, unit.bf16() + at, static_cast<std::size_t>(n));
  return into;
}

}  // namespace stratum
