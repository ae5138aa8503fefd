// Note [sliding KV cache] (infer/decoder.h): a sliding layer's KV cache keeps its window's rows
// and moves them up as decoding passes its last row. Every logit of a long decode (two
// sequences at different positions, prompt chunks that straddle a move, a slot restarted after
// its rows moved, streamed under the smallest budget) equals decoding against the whole cache,
// bit for bit, for a Mistral (every layer sliding) and a Gemma 2 (a sliding and a full layer);
// generate holds less KV cache and gives the same tokens. Does not time anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "core/thread_pool.h"
#include "infer/decoder.h"
#include "infer/generator.h"
#include "integration_util.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using Json = nlohmann::json;

// The golden model in `golden` with max_position_embeddings `n_ctx`, in tmp.
std::string long_context_copy(const testing::TempDir& tmp, const char* golden, int n_ctx) {
  const std::string dir = tmp.file(std::filesystem::path(golden).filename().string());
  std::filesystem::copy(testing::source_path(golden), dir);
  Json config = Json::parse(file_read_all(dir + "/config.json"));
  config["max_position_embeddings"] = n_ctx;
  file_write_atomic(dir + "/config.json", config.dump(2));
  return dir;
}

struct Decode {
  std::vector<float> logits;  // every step's, in order
  std::size_t kv_bytes = 0;   // the store's KV cache units
  int resume_at_20 = -1;      // resume_point(0, 20) after slot 0 passed its rows
};

// Two sequences decoded with the sliding cache or the whole one (`sliding`), in RAM or streamed
// from `offload` under the smallest budget: 3 prompt chunks of 128 tokens each, 100 more for
// sequence 1 alone, then single tokens to positions 1084 and 1184 with a 64-token chunk among
// them, then sequence 0 restarted at position 0 for a 40-token prompt and 30 tokens.
Decode decode(const std::string& dir, bool sliding, const std::string& offload = "") {
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const int B = 2, ctx = cfg.n_ctx;
  ThreadPool pool(2);
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, B, ctx, sliding));
  const std::unique_ptr<SegmentStore> store =
      testing::store_in_ram_or_under(units, offload.empty() ? -1 : 1, Decoder::min_store_bytes(units), offload);
  model_load_weights(dir, layout, *store);
  Decoder decoder(pool, cfg, *store, B, ctx, nullptr, sliding);
  Decode out;
  for (int u = 0; u < units.count(); ++u)
    if (units.kind(u) == SegmentKind::Activations) out.kv_bytes += units.bytes(u);
  std::vector<float> logits(static_cast<std::size_t>(B) * cfg.vocab_size);
  int past[2] = {0, 0};
  auto token = [&](int b, int pos) { return static_cast<std::int32_t>((37 * pos + 11 * b + pos / 7) % cfg.vocab_size); };
  // One step of the sequences in `slots`, Tn tokens each from their positions.
  auto step = [&](std::vector<int> slots, int Tn) {
    std::vector<std::int32_t> tokens;
    std::vector<int> at;
    for (int s : slots) {
      for (int t = 0; t < Tn; ++t) tokens.push_back(token(s, past[s] + t));
      at.push_back(past[s]);
    }
    decoder.step(tokens.data(), static_cast<int>(slots.size()), Tn, at.data(), logits.data(), slots.data());
    out.logits.insert(out.logits.end(), logits.begin(), logits.begin() + slots.size() * cfg.vocab_size);
    for (int s : slots) past[s] += Tn;
  };
  for (int c = 0; c < 3; ++c) step({0, 1}, 128);
  step({1}, 100);
  while (past[0] < 1084) step({0, 1}, past[0] == 700 ? 64 : 1);
  out.resume_at_20 = decoder.resume_point(0, 20);
  past[0] = 0;
  step({0}, 40);
  for (int t = 0; t < 30; ++t) step({0, 1}, 1);
  return out;
}

void check_sliding_cache(const char* golden) {
  SCOPED_TRACE(golden);
  testing::TempDir tmp;
  const std::string dir = long_context_copy(tmp, golden, 1400);
  const Decode whole = decode(dir, false);
  const Decode slid = decode(dir, true);
  ASSERT_EQ(slid.logits.size(), whole.logits.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < whole.logits.size(); ++i) differ += slid.logits[i] != whole.logits[i];
  EXPECT_EQ(differ, 0u) << "of " << whole.logits.size() << " logits";
  EXPECT_LT(slid.kv_bytes, whole.kv_bytes * 3 / 4);
  EXPECT_EQ(whole.resume_at_20, 20);
  EXPECT_EQ(slid.resume_at_20, 0) << "the rows of position 20's window have moved out";
  const Decode streamed = decode(dir, true, tmp.path());
  EXPECT_TRUE(streamed.logits == whole.logits) << "streamed under the smallest budget";
}

TEST(SlidingCache, MistralDecodesTheWholeCachesBits) { check_sliding_cache("tests/golden/tiny_mistral"); }
TEST(SlidingCache, Gemma2DecodesTheWholeCachesBits) { check_sliding_cache("tests/golden/tiny_gemma2"); }

// generate past a sliding layer's rows (a 600-token prompt, 500 greedy tokens): the tokens of
// decoding against the whole cache.
TEST(SlidingCache, GenerateHoldsTheWindowAndGivesTheSameTokens) {
  testing::TempDir tmp;
  const std::string dir = long_context_copy(tmp, "tests/golden/tiny_mistral", 1400);
  GenerateOptions o;
  o.model_dir = dir;
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 600; ++i) prompt.push_back(static_cast<std::int32_t>((13 * i + i / 5) % 131));
  o.prompt_ids = {prompt};
  o.max_tokens = 500;
  o.temperature = 0.0;
  o.stop_at_eos = false;
  o.threads = 2;
  o.quiet = true;
  const auto none = [](int, std::int32_t, const std::string&) {};
  const GenerateResult r = generate_run(o, none);
  ASSERT_EQ(r.sequences.size(), 1u);
  EXPECT_EQ(r.sequences[0].tokens.size(), 500u);
  // The same decode through the Decoder against the whole cache.
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const int ctx = 1100;
  ThreadPool pool(2);
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, 1, ctx, false));
  RamSegmentStore store(units);
  model_load_weights(dir, layout, store);
  Decoder decoder(pool, cfg, store, 1, ctx, nullptr, false);
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  std::vector<std::int32_t> ids = prompt;
  int past = 0;
  std::vector<std::int32_t> want;
  while (static_cast<int>(want.size()) < 500) {
    const int Tn = std::min(decoder.max_step_tokens(1), static_cast<int>(ids.size()) - past);
    decoder.step(ids.data() + past, 1, Tn, &past, logits.data());
    past += Tn;
    if (past < static_cast<int>(ids.size())) continue;
    const auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    want.push_back(best);
    ids.push_back(best);
  }
  EXPECT_EQ(r.sequences[0].tokens, want);
}

}  // namespace
}  // namespace stratum
