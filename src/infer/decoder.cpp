// Decoder: KV-cached incremental forward; see decoder.h and Note [decode schedule].
#include "infer/decoder.h"

#include <algorithm>
#include <cstring>
#include <optional>

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
          {&b.scratch, ops.attention_cached_scratch_floats(cfg.head_dim(), max_ctx)},
          {&b.widened, cfg.llama() ? llama_vector_floats(cfg) : 13 * C}};
}

int Decoder::cache_rows(const GptConfig& cfg, int l, int max_batch, int max_ctx, bool sliding) {
  if (!sliding || !cfg.layer_sliding_attention(l) || cfg.sliding_window <= 0) return max_ctx;
  // Note [sliding KV cache]: the window, a step's new rows, and the rounding of base.
  const std::int64_t rows = std::int64_t{cfg.sliding_window} + static_cast<std::int64_t>(rows_for(max_batch)) + kCacheShiftAlign;
  return static_cast<int>(std::min<std::int64_t>(max_ctx, rows));
}

std::vector<std::size_t> Decoder::kv_unit_floats(const GptConfig& cfg, int max_batch, int max_ctx, bool sliding) {
  std::vector<std::size_t> floats;
  for (int l = 0; l < cfg.n_layer; ++l)
    floats.push_back(2 * cache_floats_for(cfg, max_batch, cache_rows(cfg, l, max_batch, max_ctx, sliding)));
  return floats;
}

std::size_t Decoder::fixed_bytes_for(const Ops& ops, const GptConfig& cfg, int max_batch, int max_ctx) {
  Buffers sink{};
  const std::size_t rope = cfg.llama() ? LlamaRopes::bytes_for(cfg, max_ctx) : 0;
  const int R = static_cast<int>(rows_for(max_batch));
  const std::size_t acts = cfg.llama() ? LlamaActivations::bytes_for(cfg, 1, R, /*attention_stats=*/false)
                                       : Gpt2Activations::bytes_for(cfg, 1, R, /*attention_stats=*/false);
  return aligned_buffer_carve_bytes(slices(ops, sink, cfg, max_batch, max_ctx)) +
         Gpt2HeadScratch::bytes_for(cfg, max_batch) + rope + acts;
}

namespace {
// Note [decode schedule]: one step's groups, and where each layer's and vocabulary block's is.
struct DecodeSchedule {
  StepSchedule schedule;
  std::vector<int> layer, head_vocab;
  int head = 0;
};

DecodeSchedule decode_schedule_build(const UnitTable& units) {
  const ParamLayout& layout = units.layout();
  DecodeSchedule d{StepSchedule(units.count()), {}, {}, 0};
  auto params = [&](int s) {
    std::vector<UnitUse> uses;
    for (int c = 0; c < units.chunk_count(s, SegmentKind::Params); ++c)
      uses.push_back({units.index(s, SegmentKind::Params, c), Access::Read});
    return uses;
  };
  for (int l = 0; layout.layer_segment(l) < layout.head_segment(); ++l) {
    std::vector<UnitUse> uses = params(layout.layer_segment(l));
    if (layout.has_lora())  // the layer's adapters (generate --adapter), fp32 beside the base
      for (const UnitUse& use : params(layout.lora_segment(l))) uses.push_back(use);
    uses.push_back({units.index(layout.layer_segment(l), SegmentKind::Activations), Access::Update});
    d.layer.push_back(d.schedule.group_add(uses, GroupWork::LayerForward));
  }
  d.head = d.schedule.group_add(params(layout.head_segment()), GroupWork::HeadBegin);
  for (int k = 0; k < layout.vocab_block_count(); ++k)
    d.head_vocab.push_back(d.schedule.group_add(params(layout.head_vocab_segment(k)), GroupWork::HeadLse));
  return d;
}
}  // namespace

std::size_t Decoder::min_store_bytes(const UnitTable& units) {
  const ParamLayout& layout = units.layout();
  auto params_bytes = [&](int s) { return units.segment_held_bytes(s, SegmentKind::Params); };
  // The schedule's largest group, and the embedding's holds outside it (Note [decode schedule]):
  // the position table, then one token-embedding block at a time.
  std::size_t most = std::max(schedule_min_bytes(decode_schedule_build(units).schedule, units, /*worker=*/false),
                              params_bytes(layout.embed_segment()));
  for (int k = 0; k < layout.vocab_block_count(); ++k) most = std::max(most, params_bytes(layout.vocab_segment(k)));
  return most;
}

Decoder::Decoder(ThreadPool& pool, const GptConfig& cfg, SegmentStore& store, int max_batch, int max_ctx,
                 std::shared_ptr<const Ops> ops, bool sliding_cache)
    : ops_(ops != nullptr ? std::move(ops) : std::shared_ptr<const Ops>(ops_make(pool))),
      cfg_(cfg),
      store_(store),
      layout_(store.units().layout()),
      max_batch_(max_batch),
      max_ctx_(max_ctx),
      bf16_(store.units().param_bf16()),
      buffer_(ops_buffer_carve(*ops_, slices(*ops_, b_, cfg, max_batch, max_ctx))),
      head_scratch_(*ops_, cfg, max_batch),
      schedule_(0) {
  STRATUM_CHECK(max_ctx >= 1 && max_ctx <= cfg.generation_context(Backend::Cpu), "[generate] context ", max_ctx,
                " exceeds the model's maximum of ", cfg.generation_context_text(Backend::Cpu));
  const std::vector<std::size_t> kv_floats = kv_unit_floats(cfg, max_batch, max_ctx, sliding_cache);
  for (int l = 0; l < cfg.n_layer; ++l)  // Note [KV cache units]
    STRATUM_ASSERT(store.units().bytes(store.units().index(layout_.layer_segment(l), SegmentKind::Activations)) >=
                   kv_floats[static_cast<std::size_t>(l)] * sizeof(float));
  for (int l = 0; l < cfg.n_layer; ++l) {  // Note [sliding KV cache]: every sliding layer's rows are the same
    const int rows = cache_rows(cfg, l, max_batch, max_ctx, sliding_cache);
    if (rows < max_ctx) {
      window_ = cfg.sliding_window;
      sliding_rows_ = rows;
    }
  }
  base_.assign(static_cast<std::size_t>(max_batch), 0);
  // Off the host only Mistral and Phi-3 slide, within their window there (context(backend)): no
  // shifted cache, so the ops read past as it is.
  STRATUM_ASSERT(window_ == 0 || ops_->host_memory());
  const int R = static_cast<int>(rows_for(max_batch));
  if (layout_.has_lora()) lora_u_ = OpsBuffer(*ops_, static_cast<std::size_t>(R) * layout_.lora().r * sizeof(float));
  if (!ops_->host_memory()) {  // tokens (R), past (max_batch)
    dev_ints_ = OpsBuffer(*ops_, (static_cast<std::size_t>(R) + max_batch) * sizeof(std::int32_t));
    dev_logits_ = OpsBuffer(*ops_, static_cast<std::size_t>(max_batch) * cfg.vocab_size * sizeof(float));
  }
  if (cfg.llama()) {
    ropes_ = std::make_unique<LlamaRopes>(cfg, max_ctx);
    llama_acts_ = std::make_unique<LlamaActivations>(*ops_, cfg, 1, R, /*attention_stats=*/false);
  } else {
    gpt2_acts_ = std::make_unique<Gpt2Activations>(*ops_, cfg, 1, R, /*attention_stats=*/false);
  }
  DecodeSchedule d = decode_schedule_build(store.units());  // Note [decode schedule]
  STRATUM_ASSERT(static_cast<int>(d.layer.size()) == cfg.n_layer);
  schedule_ = std::move(d.schedule);
  group_layer_ = std::move(d.layer);
  group_head_ = d.head;
  group_head_vocab_ = std::move(d.head_vocab);
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
  // Note [sliding KV cache]: where each sequence's new rows go in a sliding layer's cache, and
  // whether its rows move up first.
  std::vector<int> cache_past(static_cast<std::size_t>(B));
  shift_.assign(static_cast<std::size_t>(B), 0);
  for (int b = 0; b < B; ++b) {
    STRATUM_CHECK(past[b] >= 0 && past[b] + Tn <= max_ctx_, "[generate] sequence ", b, " would reach position ",
                  past[b] + Tn, ", beyond the context of ", max_ctx_, " tokens");
    int& base = base_[static_cast<std::size_t>(slots[b])];
    if (past[b] == 0) base = 0;  // a new sequence in the slot
    if (window_ > 0) {
      const int first_key = past[b] >= window_ ? past[b] - window_ + 1 : 0;
      STRATUM_CHECK(first_key >= base, "[generate] sequence ", b, " continues at position ", past[b],
                    " but its sliding layers' KV cache keeps positions from ", base,
                    " only; continue from Decoder::resume_point (bug)");
      if (past[b] + Tn - base > sliding_rows_) {
        shift_[b] = first_key / kCacheShiftAlign * kCacheShiftAlign - base;
        STRATUM_ASSERT(shift_[b] > 0 && past[b] + Tn - (base + shift_[b]) <= sliding_rows_);
      }
    }
    cache_past[b] = past[b] - base - shift_[b];
    for (int t = 0; t < Tn; ++t) {
      const std::int32_t id = tokens[static_cast<std::size_t>(b) * Tn + t];
      STRATUM_CHECK(id >= 0 && id < cfg_.vocab_size, "[generate] token id ", id, " is outside the model vocabulary (0..",
                    cfg_.vocab_size - 1, ")");
    }
  }
  const std::int32_t* dev_tokens = tokens;
  const int* dev_past = past;
  if (!ops_->host_memory()) {  // Note [ops memory]: the ops read the step's ids from their memory
    std::int32_t* const ints = dev_ints_.as<std::int32_t>();
    ops_->upload(ints, tokens, static_cast<std::size_t>(B) * Tn * sizeof(std::int32_t));
    ops_->upload(ints + rows_for(max_batch_), past, static_cast<std::size_t>(B) * sizeof(int));
    dev_tokens = ints;
    dev_past = ints + rows_for(max_batch_);
  }
  {
    TraceSpan span(trace_, TraceRecorder::kCompute, "forward", "embed");
    embed(tokens, dev_tokens, B, Tn, past);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    TraceSpan span(trace_, TraceRecorder::kCompute, "forward", trace_ ? "layer." + std::to_string(l) : std::string());
    layer(l, B, Tn, past, dev_past, slots.data(), cache_past.data());
  }
  for (int b = 0; b < B; ++b) base_[static_cast<std::size_t>(slots[b])] += shift_[b];
  TraceSpan span(trace_, TraceRecorder::kCompute, "forward", "head");
  head(B, Tn, logits);
}

void Decoder::embed(const std::int32_t* tokens, const std::int32_t* dev_tokens, int B, int Tn, const int* past) {
  const int C = cfg_.n_embd;
  const std::size_t rows = static_cast<std::size_t>(B) * Tn;
  if (cfg_.llama()) {
    ops_->fill(b_.x, 0.0f, rows * C);
  } else {  // positions past[b] + t of wpe
    SegmentHold embed(store_, layout_.embed_segment(), SegmentKind::Params, Access::Read);
    const std::size_t wpe = layout_.segments()[layout_.embed_segment()].tensors[kWpe].offset_floats;
    for (int b = 0; b < B; ++b) {
      float* const into = b_.x + static_cast<std::size_t>(b) * Tn * C;
      const float* rows = weights_f32(embed.view(), wpe + static_cast<std::size_t>(past[b]) * C, Tn * C, into);
      if (rows != into) ops_->copy(into, rows, static_cast<std::size_t>(Tn) * C);
    }
  }
  // Only the vocabulary blocks holding one of the step's tokens.
  std::vector<bool> needed(static_cast<std::size_t>(layout_.vocab_block_count()), false);
  for (std::size_t i = 0; i < rows; ++i) needed[tokens[i] / layout_.vocab_block_rows()] = true;
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    if (!needed[k]) continue;
    SegmentHold wte(store_, layout_.vocab_segment(k), SegmentKind::Params, Access::Read);
    if (bf16_)
      ops_->embedding_forward_block_bf16(b_.x, dev_tokens, wte.view().bf16(), layout_.vocab_row0(k),
                                         layout_.vocab_rows(k), B, Tn, C, cfg_.embed_scale());
    else
      ops_->embedding_forward_block(b_.x, dev_tokens, wte.data(), layout_.vocab_row0(k), layout_.vocab_rows(k), B, Tn,
                                    C, cfg_.embed_scale());
  }
}

int Decoder::resume_point(int slot, int past) const {
  STRATUM_ASSERT(slot >= 0 && slot < max_batch_ && past >= 0);
  const int base = base_[static_cast<std::size_t>(slot)];
  return base == 0 || past - window_ + 1 >= base ? past : 0;
}

void Decoder::cache_shift(float* cache, int B, const int* past, const int* slot) const {
  const std::size_t hd = static_cast<std::size_t>(cfg_.head_dim()), KV = static_cast<std::size_t>(cfg_.kv_heads());
  for (int b = 0; b < B; ++b) {
    const int shift = shift_[b];
    if (shift == 0) continue;
    const int keep = past[b] - base_[static_cast<std::size_t>(slot[b])] - shift;  // positions new base .. past-1
    for (std::size_t j = 0; j < KV; ++j) {
      float* const rows = cache + (static_cast<std::size_t>(slot[b]) * KV + j) * sliding_rows_ * hd;
      for (int r = 0; r < keep; r += shift)  // runs of `shift` rows: no copy overlaps its source
        ops_->copy(rows + r * hd, rows + (r + shift) * hd, static_cast<std::size_t>(std::min(shift, keep - r)) * hd);
    }
  }
}

void Decoder::layer(int l, int B, int Tn, const int* past, const int* dev_past, const int* slot,
                    const int* cache_past) {
  const int s = layout_.layer_segment(l);
  store_.schedule_at(group_layer_[l]);
  SegmentChunksHold params(store_, s, SegmentKind::Params, Access::Read);
  SegmentHold kv(store_, s, SegmentKind::Activations, Access::Update);  // Note [KV cache units]
  const bool sliding = window_ > 0 && cfg_.layer_sliding_attention(l);  // Note [sliding KV cache]
  const int rows = sliding ? sliding_rows_ : max_ctx_;
  const std::size_t cache_floats = cache_floats_for(cfg_, max_batch_, rows);
  if (sliding) {
    cache_shift(kv.data(), B, past, slot);
    cache_shift(kv.data() + cache_floats, B, past, slot);
  }
  const CachedAttention attention(kv.data(), kv.data() + cache_floats, b_.q, rows, past, dev_past, slot,
                                  sliding ? cache_past : nullptr, sliding ? cache_past : nullptr);
  const RowDotLinear linear;
  const SegmentLayout& seg = layout_.segments()[s];
  // LoRA adapters (generate --adapter), unmerged: each adapted module's x A^T goes through one
  // scratch, used up before the next module's (Note [lora math]; no backward keeps it).
  std::optional<SegmentChunksHold> adapters;
  LoraBlock lora;
  if (layout_.has_lora()) {
    const int a = layout_.lora_segment(l);
    adapters.emplace(store_, a, SegmentKind::Params, Access::Read);
    lora = lora_block_of(layout_, LoraChunks{&layout_.segments()[a], adapters->chunks(), nullptr});
    for (LoraBlock::Target& t : lora.t) t.u = lora_u_.as_f32();
  }
  const LoraBlock* lp = adapters ? &lora : nullptr;
  if (cfg_.llama())
    llama_block_forward(*ops_, linear, attention, cfg_, ropes_->layer(l), cfg_.layer_scores(l),
                        llama_tensors(seg, params), b_.x, b_.x,
                        *llama_acts_, b_.tmp, b_.scratch, B, Tn, lp);
  else
    gpt2_block_forward(*ops_, linear, attention, cfg_, gpt2_tensors(seg, params), b_.x, b_.x,
                       *gpt2_acts_, b_.tmp, b_.scratch, B, Tn, lp);
}

LlamaBlockTensors Decoder::llama_tensors(const SegmentLayout& seg, const SegmentChunksHold& params) {
  return llama_block_tensors(*ops_, seg, params.views(), b_.widened, &cfg_);  // bf16: norm weights widened; Gemma's 1 + w
}

Gpt2BlockTensors Decoder::gpt2_tensors(const SegmentLayout& seg, const SegmentChunksHold& params) {
  return gpt2_block_tensors(*ops_, seg, params.views(), b_.widened);  // bf16: norms and biases widened
}

void Decoder::head(int B, int Tn, float* logits) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  for (int b = 0; b < B; ++b)
    ops_->copy(b_.last + static_cast<std::size_t>(b) * C, b_.x + (static_cast<std::size_t>(b) * Tn + Tn - 1) * C,
               static_cast<std::size_t>(C));
  float* const out = ops_->host_memory() ? logits : dev_logits_.as_f32();
  const int head = layout_.head_segment();
  store_.schedule_at(group_head_);
  {
    SegmentHold head_p(store_, head, SegmentKind::Params, Access::Read);
    const auto& tensors = layout_.segments()[head].tensors;
    gpt2_head_begin(*ops_, cfg_, weights_f32(head_p.view(), tensors[kLnFW].offset_floats, C, b_.widened),
                    cfg_.llama() ? nullptr : weights_f32(head_p.view(), tensors[kLnFB].offset_floats, C, b_.widened + C),
                    b_.last, B, head_scratch_);
  }
  for (int k = 0; k < layout_.vocab_block_count(); ++k) {
    store_.schedule_at(group_head_vocab_[k]);
    SegmentHold rows(store_, layout_.head_vocab_segment(k), SegmentKind::Params, Access::Read);
    // logits[:, v0 : v0 + n] = lnf (B, C) @ rows^T
    gpt2_head_logits_block(*ops_, RowDotLinear{}, cfg_, rows.view(), layout_.vocab_rows(k), B,
                           out + layout_.vocab_row0(k), V, head_scratch_);
  }
  if (out != logits) ops_->download(logits, out, static_cast<std::size_t>(B) * V * sizeof(float));
}

const float* Decoder::weights_f32(const TensorView& unit, std::size_t at, int n, float* into) const {
  if (unit.dtype() == DType::F32) return unit.f32() + at;
  ops_->bf16_widen(into, unit.bf16() + at, static_cast<std::size_t>(n));
  return into;
}

}  // namespace stratum
