// generate_run and sampling; see generator.h.
#include "infer/generator.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <limits>
#include <memory>
#include <numeric>

#include "backend/backend.h"
#include "model/hf_config.h"
#include "core/byte_size.h"
#include "core/process_memory.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "infer/decoder.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"
#include "store/device_segment_store.h"
#include "store/segment_store.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// The nucleus rule (top-p): how many of n tokens, most likely first, to keep so that their mass
// reaches top_p; mass_of(i) is the i-th token's probability. At least one is kept.
template <class MassOf>
std::size_t nucleus_keep(std::size_t n, double top_p, MassOf mass_of) {
  double mass = 0.0;
  std::size_t keep = 0;
  while (keep < n && (keep == 0 || mass < top_p)) mass += mass_of(keep++);
  return keep;
}
}  // namespace

void repetition_penalize(float* out, const float* logits, int V, const std::int32_t* ids, std::size_t n,
                         double penalty) {
  const float p = static_cast<float>(penalty);
  std::copy(logits, logits + V, out);
  for (std::size_t i = 0; i < n; ++i) {  // from the unpenalized logit: an id seen again is written the same
    const std::int32_t id = ids[i];
    STRATUM_ASSERT(id >= 0 && id < V);
    const float x = logits[id];
    out[id] = x < 0.0f ? x * p : x / p;
  }
}

std::int32_t sample_next_token(const Ops& ops, const float* logits, int V, double temperature, int top_k, double uniform01,
                               double top_p) {
  if (temperature <= 0.0) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  constexpr float kOut = -3.0e38f;
  std::vector<float> probs(static_cast<std::size_t>(V));
  std::vector<float> filtered(logits, logits + V);
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (top_k > 0 && top_k < V) {
    std::vector<int> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), by_logit);
    std::fill(filtered.begin(), filtered.end(), kOut);
    for (int i = 0; i < top_k; ++i) filtered[order[i]] = logits[order[i]];
  }
  // A temperature so small that logits / temperature overflows a float (below about 1e-36 for
  // logits near 100): the limit of the softmax as the temperature goes to 0, an even choice among
  // the largest logits left (those within a float's resolution of each other are all tied). The
  // kernel would see inf - inf and sample nothing.
  double largest = 0.0;
  for (int i = 0; i < V; ++i)
    if (filtered[i] > kOut) largest = std::max(largest, std::fabs(static_cast<double>(filtered[i])));
  const float inv_t = 1.0f / static_cast<float>(temperature);
  if (!std::isfinite(inv_t) || largest * inv_t >= static_cast<double>(std::numeric_limits<float>::max())) {
    const float top = *std::max_element(filtered.begin(), filtered.end());
    std::vector<int> tied;
    for (int i = 0; i < V; ++i)
      if (filtered[i] == top) tied.push_back(i);
    // top-p as below, over the tied tokens (1/n of the mass each, lower ids first).
    const double each = 1.0 / static_cast<double>(tied.size());
    tied.resize(nucleus_keep(tied.size(), top_p, [&](std::size_t) { return each; }));
    const auto pick = static_cast<std::size_t>(uniform01 * static_cast<double>(tied.size()));
    return tied[std::min(pick, tied.size() - 1)];
  }
  ops.softmax_row(probs.data(), filtered.data(), V, static_cast<float>(temperature));
  if (top_p < 1.0) {  // nucleus: the most likely tokens (ties by lower id) until their mass reaches top_p
    std::vector<int> order;
    for (int i = 0; i < V; ++i)
      if (filtered[i] > kOut) order.push_back(i);
    std::sort(order.begin(), order.end(), by_logit);
    const std::size_t keep =
        nucleus_keep(order.size(), top_p, [&](std::size_t i) { return static_cast<double>(probs[order[i]]); });
    for (std::size_t i = keep; i < order.size(); ++i) filtered[order[i]] = kOut;
    ops.softmax_row(probs.data(), filtered.data(), V, static_cast<float>(temperature));
  }
  double cumulative = 0.0;
  int last_nonzero = 0;
  for (int i = 0; i < V; ++i) {
    if (probs[i] <= 0.0f || filtered[i] <= kOut) continue;
    last_nonzero = i;
    cumulative += probs[i];
    if (uniform01 < cumulative) return i;
  }
  return last_nonzero;
}

std::uint64_t sample_stream_seed(std::uint64_t seed, std::uint64_t prompt) {
  return splitmix64_mix(splitmix64_mix(seed + kSplitMix64Gamma) + prompt * kSplitMix64Gamma);
}

namespace {
struct Sequence {
  std::vector<std::int32_t> ids;  // prompt, then generated tokens
  int prompt_len = 0;
  int fed = 0;  // tokens in the KV cache
  int turn_tokens = 0;  // generated since the prompt (Note [next turn]: since the turn's input)
  bool done = false;
  Rng rng{0};
};
}  // namespace

GenerateResult generate_run(const GenerateOptions& o,
                            const std::function<void(int, std::int32_t, const std::string&)>& on_token) {
  STRATUM_CHECK(o.gpu_mem_budget_bytes == 0 || o.backend != Backend::Cpu || o.device_tier_on_cpu,
                "[generate] --gpu-mem-budget bounds the GPU's memory: add --backend cuda, or use --mem-budget for RAM");
  STRATUM_CHECK(o.backend == Backend::Cpu || o.precision == Precision::Fp32, "[generate] --backend ",
                backend_name(o.backend), " computes in fp32 only for now: drop --precision bf16");
  if (std::string why; !backend_available(o.backend, &why)) throw Error(why);  // before the model is read
  STRATUM_CHECK(o.max_tokens >= 0, "[generate] --max-tokens must be >= 0, got ", o.max_tokens);
  STRATUM_CHECK(o.temperature >= 0.0, "[generate] --temperature must be >= 0 (0 = greedy), got ", o.temperature);
  STRATUM_CHECK(o.top_k >= 0, "[generate] --top-k must be >= 0 (0 = off), got ", o.top_k);
  STRATUM_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, "[generate] --top-p must be in (0, 1], got ", o.top_p);
  STRATUM_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.0,
                "[generate] --repetition-penalty must be > 0 (1 = none), got ", o.repetition_penalty);
  STRATUM_CHECK(o.batch >= 1 && o.batch <= 4096, "[generate] --batch must be in 1..4096, got ", o.batch);
  STRATUM_CHECK(o.prompts.empty() || o.prompt_ids.empty(), "[generate] give text prompts or token ids, not both");
  const GptConfig cfg = model_read_config(o.model_dir);
  cfg.backend_check(o.backend, "generate");
  // Note [mistral window]: a sliding window caps it on CUDA; Note [longrope]: the short factors' context.
  const int context = cfg.generation_context(o.backend);
  const std::string tokenizer_dir = corpus_find_tokenizer(o.tokenizer_dir, o.model_dir);
  std::unique_ptr<BpeTokenizer> tokenizer;
  if (!tokenizer_dir.empty()) tokenizer = std::make_unique<BpeTokenizer>(BpeTokenizer::load(tokenizer_dir));
  STRATUM_CHECK(tokenizer != nullptr || !o.prompt_ids.empty(), "[generate] no tokenizer: '", o.model_dir,
                "' has no tokenizer.json (or vocab.json + merges.txt); pass --tokenizer DIR or --prompt-ids");

  // Stop tokens: config.json's and generation_config.json's eos ids (Note [generation config] in
  // model/hf_config.h), else the tokenizer's end-of-text tokens.
  std::vector<std::int32_t> eos = cfg.eos_token_ids;
  for (std::int32_t id : hf_generation_config_read(o.model_dir + "/generation_config.json").eos_token_ids)
    if (id < cfg.vocab_size && std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  if (eos.empty() && tokenizer)
    for (std::int32_t id : {tokenizer->eot_id(), tokenizer->eos_id(), tokenizer->token_id("<|end_of_text|>"),
                            tokenizer->token_id("<|eot_id|>")})
      if (id >= 0 && std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  // A text prompt's ids: with the BOS the tokenizer's post_processor puts first (Llama 2's <s>,
  // Llama 3's <|begin_of_text|>), as Hugging Face's tokenizer(text) does, unless the text has it
  // or is a rendered chat template (add_bos false).
  const auto encode_text = [&](const std::string& text) {
    std::vector<std::int32_t> ids = tokenizer->encode(text);
    if (const std::int32_t bos = tokenizer->bos_id(); o.add_bos && bos >= 0 && (ids.empty() || ids.front() != bos))
      ids.insert(ids.begin(), bos);
    return ids;
  };
  std::vector<std::vector<std::int32_t>> prompts = o.prompt_ids;
  if (prompts.empty()) {
    for (const std::string& text : o.prompts.empty() ? std::vector<std::string>{""} : o.prompts) {
      std::vector<std::int32_t> ids = encode_text(text);
      if (ids.empty()) {  // start from BOS (Llama) or <|endoftext|> (GPT-2)
        const std::int32_t start = cfg.bos_token_id >= 0       ? cfg.bos_token_id
                                   : tokenizer->bos_id() >= 0 ? tokenizer->bos_id()
                                                              : tokenizer->eot_id();
        STRATUM_CHECK(start >= 0, "[generate] the prompt is empty and neither config.json (bos_token_id) nor the "
                      "tokenizer (<|endoftext|>) gives a token to start from");
        ids.push_back(start);
      }
      prompts.push_back(std::move(ids));
    }
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    STRATUM_CHECK(!prompts[i].empty(), "[generate] prompt ", i + 1, " has no tokens");
    STRATUM_CHECK(static_cast<int>(prompts[i].size()) < context, "[generate] prompt ", i + 1, " is ",
                  prompts[i].size(), " tokens, longer than the model context ", cfg.generation_context_text(o.backend),
                  " allows (at least one token must be generated); shorten it");
    for (std::int32_t id : prompts[i])
      STRATUM_CHECK(id >= 0 && id < cfg.vocab_size, "[generate] prompt token id ", id,
                    " is outside the model vocabulary (0..", cfg.vocab_size - 1, ")",
                    o.prompt_ids.empty() ? "; the tokenizer does not match the model" : "");
  }
  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<int>(p.size()));
  STRATUM_CHECK(!o.next_turn || (prompts.size() == 1 && tokenizer != nullptr && o.prompt_ids.empty()),
                "[generate] a chat continues one sequence of text: give one text prompt and a tokenizer");
  STRATUM_CHECK(o.context >= 0, "[generate] --context must be >= 0 (0 = the model's), got ", o.context);
  const int max_ctx = o.next_turn ? std::min(context, o.context > 0 ? std::max(o.context, longest + 1) : context)
                                  : std::min(context, longest + std::max(1, o.max_tokens));
  const int batch = std::min<int>(o.batch, static_cast<int>(prompts.size()));

  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads, /*spin_us=*/200);  // decoding dispatches ~300 small jobs per token
  backend_set_threads(threads);
  const std::unique_ptr<Ops> ops = ops_make(pool);  // sampling (host) and buffer sizes
  const ParamLayout layout =
      o.adapter_dir.empty() ? ParamLayout::of(cfg) : ParamLayout::of(cfg, adapter_config_read(o.adapter_dir, lora_family(cfg)));
  // Note [bf16 weights]: a bf16 model stays bf16 (half the RAM, budget and reads, the same bits);
  // with --precision bf16 any model is rounded to bf16 on load.
  const bool bf16 = o.precision == Precision::Bf16 || (o.keep_bf16 && model_weights_bf16(o.model_dir));
  UnitTable units(layout, Decoder::kv_unit_floats(cfg, batch, max_ctx), bf16);
  std::unique_ptr<SegmentStore> store;
  const std::size_t fixed = Decoder::fixed_bytes_for(*ops, cfg, batch, max_ctx);
  if (o.mem_budget_bytes > 0) {
    const std::size_t need = fixed + Decoder::min_store_bytes(units);
    auto mib = [](std::size_t b) {  // rounded up, in a unit --mem-budget takes
      return b >= (std::size_t{64} << 20) ? std::to_string((b + (1 << 20) - 1) >> 20) + "M"
                                          : std::to_string((b + 1023) >> 10) + "K";
    };
    STRATUM_CHECK(o.mem_budget_bytes >= need, "[generate] --mem-budget ", mib(o.mem_budget_bytes),
                  " is below the minimum of ", mib(need), " for batch ", batch, " and context ", max_ctx,
                  " (buffers ", mib(fixed), " + the most one step holds at once: a layer with its KV cache, or a vocabulary block ",
                  mib(Decoder::min_store_bytes(units)), "); use --mem-budget ", mib(need),
                  " or more, or lower --batch/--max-tokens");
    TieredStoreOptions so;
    so.budget_bytes = o.mem_budget_bytes - fixed;
    so.offload_dir = o.offload_dir;
    so.prefetch_depth = o.prefetch;
    store = std::make_unique<TieredSegmentStore>(units, so);
  } else {
    memory_fit_check(fixed + units.total_bytes(), "generate", "the model (weights, KV cache, buffers)",
                     "stream the weights: --mem-budget SIZE --offload-dir DIR");
    store = std::make_unique<RamSegmentStore>(units);
  }
  model_load_weights(o.model_dir, layout, *store);
  if (layout.has_lora()) adapter_load_weights(o.adapter_dir, layout, *store);
  const StoreStats loaded = store->stats();
  store->stats_reset_peak();
  // Off the CPU the decoder reads the device tier over the loaded weights (Note [ops memory],
  // Note [device tier]): all of them, or what --gpu-mem-budget holds, copied in by the decode schedule.
  std::shared_ptr<const Ops> device;
  std::unique_ptr<DeviceSegmentStore> mirror;
  std::size_t device_fixed = 0;
  if (o.backend != Backend::Cpu || o.device_tier_on_cpu) {
    device = ops_make(pool, Precision::Fp32, o.backend);
    device_fixed = Decoder::fixed_bytes_for(*device, cfg, batch, max_ctx);
    const std::size_t need = device_fixed + Decoder::min_store_bytes(units);
    STRATUM_CHECK(o.gpu_mem_budget_bytes == 0 || o.gpu_mem_budget_bytes >= need, "[generate] --gpu-mem-budget ",
                  bytes_text(o.gpu_mem_budget_bytes), " is below the minimum of ", bytes_text(need), " for batch ", batch,
                  " and context ", max_ctx, " (buffers ", bytes_text(device_fixed), " + a layer with its KV cache, or a "
                  "vocabulary block); use --gpu-mem-budget ", (need + (1 << 20) - 1) >> 20,
                  "M or more, or lower --batch/--max-tokens");
    mirror = std::make_unique<DeviceSegmentStore>(
        *store, device, o.gpu_mem_budget_bytes > 0 ? o.gpu_mem_budget_bytes - device_fixed : 0, o.prefetch);
    mirror->push();
  }
  const StoreStats device_loaded = mirror ? mirror->stats() : StoreStats{};
  Decoder decoder(pool, cfg, mirror ? *mirror : *store, batch, max_ctx, device);
  std::unique_ptr<TraceRecorder> trace;
  if (!o.trace_path.empty()) {
    trace = std::make_unique<TraceRecorder>();
    trace->stream_to(o.trace_path, "stratum generate");  // Note [streamed trace]; an unwritable path fails now
    (mirror ? static_cast<SegmentStore&>(*mirror) : *store).trace_set(trace.get());
    decoder.trace_set(trace.get());
  }

  GenerateResult result;
  result.has_tokenizer = tokenizer != nullptr;
  result.weights_bf16 = bf16;
  for (int u = 0; u < units.count(); ++u)
    if (units.kind(u) == SegmentKind::Params) result.weight_bytes += units.bytes(u);
    else if (units.kind(u) == SegmentKind::Activations) result.kv_cache_bytes += units.bytes(u);
  for (const std::size_t floats : Decoder::kv_unit_floats(cfg, batch, max_ctx, /*sliding=*/false))
    result.kv_cache_whole_bytes += floats * sizeof(float);
  result.max_ctx = max_ctx;
  result.sequences.resize(prompts.size());
  std::vector<float> logits(static_cast<std::size_t>(batch) * cfg.vocab_size);
  std::vector<float> penalized;  // a row with its repetition penalty (Note [repetition penalty])
  double prompt_s = 0.0, generate_s = 0.0;
  long generate_step_tokens = 0;  // tokens sampled by steps that are not prompt-only
  for (std::size_t first = 0; first < prompts.size() && !result.interrupted; first += static_cast<std::size_t>(batch)) {
    const int n = static_cast<int>(std::min<std::size_t>(batch, prompts.size() - first));
    std::vector<Sequence> group(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      group[i].ids = prompts[first + i];
      group[i].prompt_len = static_cast<int>(group[i].ids.size());
      group[i].rng = Rng(sample_stream_seed(o.seed, first + static_cast<std::uint64_t>(i)));
      group[i].done = o.max_tokens == 0;
      result.sequences[first + i].prompt = group[i].ids;
    }
    for (;;) {
      if (o.stop_requested != nullptr && *o.stop_requested != 0) {
        result.interrupted = true;
        break;
      }
      std::vector<int> live;
      for (int i = 0; i < n; ++i)
        if (!group[i].done) live.push_back(i);
      if (live.empty() && o.next_turn) {  // Note [next turn]
        Sequence& s = group[0];
        std::string text;
        if (!o.next_turn(text)) break;
        std::vector<std::int32_t> next = encode_text(text);
        STRATUM_CHECK(!next.empty() && static_cast<int>(next.size()) < max_ctx, "[generate] the conversation is ",
                      next.size(), " tokens, past the ", max_ctx, " the KV cache holds", max_ctx < context
                      ? " (--context N holds more)" : " (the model's context)", "; start a new conversation");
        for (const std::int32_t id : next)
          STRATUM_CHECK(id >= 0 && id < cfg.vocab_size, "[generate] token id ", id, " of the next turn is outside the "
                        "model vocabulary (0..", cfg.vocab_size - 1, ")");
        std::size_t same = 0;  // the KV cache holds s.fed tokens of s.ids: keep those next shares
        while (same < next.size() && same < static_cast<std::size_t>(s.fed) && next[same] == s.ids[same]) ++same;
        s.fed = static_cast<int>(std::min(same, next.size() - 1));  // the last input token is read to give logits
        s.fed = decoder.resume_point(0, s.fed);  // Note [sliding KV cache]: or from the start
        s.ids = std::move(next);
        s.prompt_len = static_cast<int>(s.ids.size());
        s.turn_tokens = 0;
        s.done = o.max_tokens == 0;
        result.sequences[first].stopped_at_eos = false;
        continue;
      }
      if (live.empty()) break;
      const int B = static_cast<int>(live.size());
      bool prompt_only = true;
      int Tn = decoder.max_step_tokens(B);
      for (int i : live) {
        const int left = group[i].prompt_len - group[i].fed;
        if (left <= 0) prompt_only = false;
        Tn = std::min(Tn, std::max(1, left));
      }
      std::vector<std::int32_t> tokens;
      std::vector<int> past, slot;
      for (int i : live) {
        const Sequence& s = group[i];
        tokens.insert(tokens.end(), s.ids.begin() + s.fed, s.ids.begin() + s.fed + Tn);
        past.push_back(s.fed);
        slot.push_back(i);
      }
      const auto t0 = std::chrono::steady_clock::now();
      decoder.step(tokens.data(), B, Tn, past.data(), logits.data(), slot.data());
      const long generated_before = result.generated_tokens;
      for (int r = 0; r < B; ++r) {
        Sequence& s = group[live[r]];
        s.fed += Tn;
        if (s.fed < static_cast<int>(s.ids.size())) continue;  // still reading its prompt
        const float* const row = logits.data() + static_cast<std::size_t>(r) * cfg.vocab_size;
        for (int v = 0; v < cfg.vocab_size; ++v)  // a NaN would make every sample the same id, silently
          STRATUM_CHECK(std::isfinite(row[v]), "[generate] the model's logits are not finite (", row[v],
                        " for token id ", v, ") after ", s.fed, " tokens: its activations overflow; a model that ",
                        "trained to non-finite values cannot generate");
        const float* scores = row;
        if (o.repetition_penalty != 1.0) {  // Note [repetition penalty]
          penalized.resize(static_cast<std::size_t>(cfg.vocab_size));
          repetition_penalize(penalized.data(), row, cfg.vocab_size, s.ids.data(), s.ids.size(), o.repetition_penalty);
          scores = penalized.data();
        }
        const std::int32_t next =
            sample_next_token(*ops, scores, cfg.vocab_size, o.temperature, o.top_k, s.rng.uniform(), o.top_p);
        GenerateSequence& out = result.sequences[first + live[r]];
        if (o.stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) {
          out.stopped_at_eos = true;
          s.done = true;
          continue;
        }
        s.ids.push_back(next);
        out.tokens.push_back(next);
        const std::string text = tokenizer && next < tokenizer->vocab_size() ? tokenizer->decode_token(next) : "";
        out.text += text;
        on_token(static_cast<int>(first) + live[r], next, text);
        ++result.generated_tokens;
        if (++s.turn_tokens >= o.max_tokens) {
          s.done = true;
        } else if (static_cast<int>(s.ids.size()) >= max_ctx) {
          s.done = true;
          out.stopped_at_context = true;
        }
      }
      const long generated_now = result.generated_tokens - generated_before;
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (prompt_only) {
        prompt_s += sec;
        result.prompt_tokens += static_cast<long>(B) * Tn;
      } else {
        generate_s += sec;
        generate_step_tokens += generated_now;
        for (int i : live) result.prompt_tokens += group[i].fed <= group[i].prompt_len ? Tn : 0;
      }
    }
  }
  result.prompt_tokens_per_s = prompt_s > 0 ? result.prompt_tokens / prompt_s : 0.0;
  result.generate_tokens_per_s = generate_s > 0 ? generate_step_tokens / generate_s : 0.0;
  result.prompt_seconds = prompt_s;
  result.generate_seconds = generate_s;
  result.tokens_per_s = prompt_s + generate_s > 0 ? result.generated_tokens / (prompt_s + generate_s) : 0.0;
  const StoreStats st = store->stats();
  result.read_bytes = st.read_bytes - loaded.read_bytes;
  result.write_bytes = st.write_bytes - loaded.write_bytes;
  result.read_busy_seconds = (st.read_busy_ms - loaded.read_busy_ms) / 1e3;
  result.stall_seconds = (st.stall_ms - loaded.stall_ms) / 1e3;
  result.peak_ram_bytes = st.peak_held_bytes + fixed;
  if (mirror) {
    const StoreStats d = mirror->stats();
    result.device_read_bytes = d.read_bytes - device_loaded.read_bytes;
    result.device_write_bytes = d.write_bytes - device_loaded.write_bytes;
    result.device_peak_bytes = d.peak_held_bytes + device_fixed;
    result.device_min_bytes = device_fixed + Decoder::min_store_bytes(units);
  }
  if (trace) {
    (mirror ? static_cast<SegmentStore&>(*mirror) : *store).trace_set(nullptr);
    decoder.trace_set(nullptr);
    trace->finish();
  }
  return result;
}

}  // namespace stratum
