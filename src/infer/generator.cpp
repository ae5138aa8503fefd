// generate_run and sampling; see generator.h.
#include "infer/generator.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/softmax_xent.h"
#include "model/model_io.h"
#include "store/segment_store.h"
#include "stratum/error.h"
#include "train/executor.h"

namespace stratum {

std::int32_t sample_next_token(const float* logits, int V, double temperature, int top_k, double uniform01) {
  if (temperature <= 0.0) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  std::vector<float> probs(static_cast<std::size_t>(V));
  std::vector<float> filtered(logits, logits + V);
  if (top_k > 0 && top_k < V) {
    std::vector<int> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::fill(filtered.begin(), filtered.end(), -3.0e38f);
    for (int i = 0; i < top_k; ++i) filtered[order[i]] = logits[order[i]];
  }
  softmax_row(probs.data(), filtered.data(), V, static_cast<float>(temperature));
  double cumulative = 0.0;
  int last_nonzero = 0;
  for (int i = 0; i < V; ++i) {
    if (probs[i] <= 0.0f || filtered[i] <= -3.0e38f) continue;
    last_nonzero = i;
    cumulative += probs[i];
    if (uniform01 < cumulative) return i;
  }
  return last_nonzero;
}

GenerateResult generate_run(const GenerateOptions& o, const std::function<void(const std::string&)>& on_text) {
  STRATUM_CHECK(o.max_tokens >= 0, "[generate] --max-tokens must be >= 0, got ", o.max_tokens);
  STRATUM_CHECK(o.temperature >= 0.0, "[generate] --temperature must be >= 0 (0 = greedy), got ", o.temperature);
  STRATUM_CHECK(o.top_k >= 0, "[generate] --top-k must be >= 0 (0 = off), got ", o.top_k);
  const GptConfig cfg = model_read_config(o.model_dir);
  const std::string tokenizer_dir = corpus_find_tokenizer(o.tokenizer_dir, o.model_dir);
  STRATUM_CHECK(!tokenizer_dir.empty(), "[generate] no tokenizer: '", o.model_dir,
                "' has no vocab.json + merges.txt; pass --tokenizer DIR");
  const BpeTokenizer tokenizer = BpeTokenizer::load(tokenizer_dir);
  std::vector<std::int32_t> context = tokenizer.encode(o.prompt);
  if (context.empty()) {
    STRATUM_CHECK(tokenizer.eot_id() >= 0 && tokenizer.eot_id() < cfg.vocab_size,
                  "[generate] the prompt is empty and the tokenizer has no <|endoftext|> token to start from");
    context.push_back(tokenizer.eot_id());
  }
  STRATUM_CHECK(static_cast<int>(context.size()) <= cfg.n_ctx, "[generate] the prompt is ", context.size(),
                " tokens, longer than the model context of ", cfg.n_ctx, " tokens; shorten it");
  for (auto id : context)
    STRATUM_CHECK(id < cfg.vocab_size, "[generate] prompt token id ", id, " is outside the model vocabulary (",
                  cfg.vocab_size, "); the tokenizer does not match the model");

  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  ThreadPool pool(threads);
  blas_set_threads(threads);
  const ParamLayout layout = ParamLayout::of(cfg);
  RamSegmentStore store(layout, Executor::activation_unit_floats(cfg, 1, cfg.n_ctx));
  model_load_weights(o.model_dir, layout, store);
  Executor exec(pool, cfg, store, 1, cfg.n_ctx);

  Rng rng(o.seed);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  GenerateResult result;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.max_tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(context.size()), cfg.n_ctx);
    exec.logits_last(context.data() + context.size() - T, T, logits.data());
    const std::int32_t next = sample_next_token(logits.data(), cfg.vocab_size, o.temperature, o.top_k, rng.uniform());
    if (o.stop_at_eot && next == tokenizer.eot_id()) break;
    context.push_back(next);
    result.tokens.push_back(next);
    on_text(next < tokenizer.vocab_size() ? tokenizer.decode_token(next) : std::string());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.tokens_per_s = s > 0 ? result.tokens.size() / s : 0.0;
  return result;
}

}  // namespace stratum
