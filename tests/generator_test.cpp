// Token sampling rules (greedy, temperature, top-k, top-p) and generation with the KV-cached
// decoder against the PyTorch golden Llama: in RAM, streamed, batched; bad input.
#include "infer/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/bf16.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "infer/decoder.h"
#include "integration_util.h"
#include "weights/model_io.h"
#include "store/tiered_segment_store.h"
#include "stratum/error.h"

namespace stratum {
namespace {

// Sampling runs on host memory with the CPU backend's ops.
// Two threads, as greedy_options' runs: the decoder's attention scratch is per thread, so the
// budgets computed here must use the runs' count.
const Ops& host_ops() {
  static ThreadPool pool(2);
  static const std::unique_ptr<Ops> ops = ops_make(pool);
  return *ops;
}

TEST(Sampling, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 0.0, 0, 0.99), 1);
}

TEST(Sampling, TopOneEqualsGreedy) {
  const std::vector<float> logits = {0.1f, 2.0f, 5.0f, 1.0f};
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 1, u), 2);
}

TEST(Sampling, UniformDrawMapsToCumulativeProbabilities) {
  // Equal logits: probabilities 1/4 each, so u in [0.5, 0.75) picks id 2.
  const std::vector<float> logits(4, 1.0f);
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, 0.1), 0);
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, 0.6), 2);
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, 0.99), 3);
}

TEST(Sampling, TopKExcludesTheRest) {
  const std::vector<float> logits = {5.0f, 4.9f, -2.0f, 4.8f};
  // top-2 keeps ids 0 and 1 only, whatever the draw.
  for (double u = 0.0; u < 1.0; u += 0.05) {
    const int id = sample_next_token(host_ops(), logits.data(), 4, 1.0, 2, u);
    EXPECT_TRUE(id == 0 || id == 1) << u;
  }
}

TEST(Sampling, LowTemperatureApproachesGreedy) {
  const std::vector<float> logits = {1.0f, 1.5f, 0.5f};
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 3, 0.01, 0, 0.5), 1);
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// A temperature so small that logits / temperature overflows a float: the T -> 0 limit (the
// largest logit; an even draw among tied ones), with top-k and top-p too; not "nothing sampled".
TEST(Sampling, TemperatureBelowFloatRangeIsTheLimitNotNan) {
  const std::vector<float> logits = {90.0f, -5.0f, 95.0f, 95.0f, 94.0f};
  for (double t : {1e-40, 1e-300, 1e-38})
    for (double u : {0.0, 0.3, 0.49, 0.5, 0.999})
      for (int k : {0, 3})
        for (double p : {1.0, 0.5}) {
          const int id = sample_next_token(host_ops(), logits.data(), 5, t, k, u, p);
          // top-p 0.5 keeps the lower of two tied ids, as the nucleus does at any temperature
          EXPECT_EQ(id, u < 0.5 || p == 0.5 ? 2 : 3) << t << " " << u << " " << k << " " << p;
        }
  // The same tie rule at a small temperature that does not overflow: top-p 0.5 keeps id 2.
  for (double u : {0.0, 0.7}) EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 5, 1e-3, 0, u, 0.5), 2);
  const std::vector<float> one = {1.0f, 3.0f, 2.0f};
  EXPECT_EQ(sample_next_token(host_ops(), one.data(), 3, 1e-45, 0, 0.99), 1);
}

// Each (seed, prompt) pair has its own stream: seed 2's first prompt is not seed 1's second.
TEST(Sampling, PromptStreamsOfNeighbouringSeedsDiffer) {
  EXPECT_EQ(sample_stream_seed(7, 3), sample_stream_seed(7, 3));
  std::vector<std::uint64_t> seen;
  for (std::uint64_t seed = 0; seed < 16; ++seed)
    for (std::uint64_t prompt = 0; prompt < 16; ++prompt) seen.push_back(sample_stream_seed(seed, prompt));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // softmax of {2, 1, 0, -1}: 0.644, 0.237, 0.087, 0.032. top-p 0.6 keeps id 0 only; 0.85 ids 0-1.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  for (double u = 0.0; u < 1.0; u += 0.05) EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, u, 0.6), 0) << u;
  for (double u = 0.0; u < 1.0; u += 0.05) {
    const int id = sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, u, 0.85);
    EXPECT_TRUE(id == 0 || id == 1) << u;
  }
  EXPECT_EQ(sample_next_token(host_ops(), logits.data(), 4, 1.0, 0, 0.99, 1.0), 3) << "top-p 1 keeps everything";
}

const std::string kLlama = "tests/golden/tiny_llama";

std::vector<std::int32_t> golden_ids(const std::string& name) {
  const SafetensorsFile ref = SafetensorsFile::open(testing::source_path(kLlama) + "/reference.safetensors");
  const SafetensorsTensorInfo* t = ref.find(name);
  std::vector<std::int32_t> out(static_cast<std::size_t>(t->numel()));
  ref.read_raw(*t, out.data());
  return out;
}

GenerateOptions greedy_options() {
  GenerateOptions o;
  o.model_dir = testing::source_path(kLlama);
  o.prompt_ids = {golden_ids("generate_prompt")};
  o.max_tokens = 12;
  o.temperature = 0.0;
  o.stop_at_eos = false;
  o.threads = 2;
  o.quiet = true;
  return o;
}

// Every logit of a batch of two decoding the model in `dir` (a 5-token prompt step, then 6
// single-token steps, each sequence its own tokens), its weights in a RAM store or streamed from
// `offload` under the smallest budget, kept in bf16 or fp32; `prepare` may change the loaded
// weights first.
std::vector<float> batch_logits(const std::string& dir, bool bf16, bool streamed, const std::string& offload,
                                const std::function<void(const UnitTable&, SegmentStore&)>& prepare = {}) {
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const int B = 2, ctx = 12;
  ThreadPool pool(2);
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, B, ctx), bf16);
  const std::unique_ptr<SegmentStore> store =
      testing::store_in_ram_or_under(units, streamed ? 1 : -1, Decoder::min_store_bytes(units), offload);
  model_load_weights(dir, layout, *store);
  if (prepare) prepare(units, *store);
  Decoder decoder(pool, cfg, *store, B, ctx);
  std::vector<float> all, logits(static_cast<std::size_t>(B) * cfg.vocab_size);
  std::vector<std::int32_t> tokens = {3, 17, 42, 5, 9, 100, 2, 77, 64, 1};
  int past[2] = {0, 0};
  decoder.step(tokens.data(), B, 5, past, logits.data());
  all.insert(all.end(), logits.begin(), logits.end());
  for (int t = 0; t < 6; ++t) {
    past[0] = past[1] = 5 + t;
    std::int32_t next[2] = {static_cast<std::int32_t>((7 * t + 1) % cfg.vocab_size),
                            static_cast<std::int32_t>((11 * t + 5) % cfg.vocab_size)};
    decoder.step(next, B, 1, past, logits.data());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  if (streamed) {
    EXPECT_GT(store->stats().read_bytes, 0u) << "the smallest budget must stream";
  }
  return all;
}

// generate_run on `dir` with --precision bf16 keeps the weights bf16 in under 3/4 of the fp32
// run's weight bytes; returns the bf16 run (greedy).
GenerateResult expect_precision_bf16_halves_the_weights(const std::string& dir) {
  const auto none = [](int, std::int32_t, const std::string&) {};
  GenerateOptions o = greedy_options();
  o.model_dir = dir;
  const GenerateResult fp32 = generate_run(o, none);
  o.precision = Precision::Bf16;
  GenerateResult bf16 = generate_run(o, none);
  EXPECT_TRUE(bf16.weights_bf16);
  EXPECT_FALSE(fp32.weights_bf16);
  EXPECT_LT(bf16.weight_bytes, fp32.weight_bytes * 3 / 4);
  return bf16;
}

// The KV-cached decoder's greedy tokens equal PyTorch's full-recompute ones, in RAM, streamed
// under the smallest budget, and as one sequence of a lockstep batch with other prompt lengths.
TEST(Generate, LlamaGreedyMatchesPyTorchInRamStreamedAndBatched) {
  const std::vector<std::int32_t> want = golden_ids("generate_ids");
  const auto none = [](int, std::int32_t, const std::string&) {};
  GenerateOptions o = greedy_options();
  const GenerateResult ram = generate_run(o, none);
  ASSERT_EQ(ram.sequences.size(), 1u);
  EXPECT_EQ(ram.sequences[0].tokens, want);
  EXPECT_EQ(ram.prompt_tokens, 5);
  EXPECT_EQ(ram.generated_tokens, 12);

  testing::TempDir tmp;
  const GptConfig cfg = model_read_config(o.model_dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, 1, 17));
  o.mem_budget_bytes = Decoder::fixed_bytes_for(host_ops(), cfg, 1, 17) + Decoder::min_store_bytes(units);
  o.offload_dir = tmp.path();
  o.prefetch = 1;
  const GenerateResult streamed = generate_run(o, none);
  EXPECT_EQ(streamed.sequences[0].tokens, want);
  EXPECT_GT(streamed.read_bytes, 0u) << "the budget must force streaming";
  EXPECT_LE(streamed.peak_ram_bytes, o.mem_budget_bytes);

  o = greedy_options();
  o.prompt_ids = {{7, 3}, golden_ids("generate_prompt"), {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  o.batch = 3;
  std::vector<int> order;
  const GenerateResult batched = generate_run(o, [&](int seq, std::int32_t, const std::string&) { order.push_back(seq); });
  ASSERT_EQ(batched.sequences.size(), 3u);
  EXPECT_EQ(batched.sequences[1].tokens, want);
  EXPECT_EQ(batched.generated_tokens, 36);
  EXPECT_EQ(order.size(), 36u);
  // Each sequence alone gives the same tokens as in the batch.
  for (std::size_t i : {0u, 2u}) {
    GenerateOptions one = greedy_options();
    one.prompt_ids = {o.prompt_ids[i]};
    EXPECT_EQ(generate_run(one, none).sequences[0].tokens, batched.sequences[i].tokens) << i;
  }

  // The batch under its smallest budget: weights and KV caches (Note [KV cache units]) stream,
  // the caches spilling to the offload dir between steps; the tokens stay the same.
  const int ctx = 9 + 12;
  const UnitTable batch_units(layout, Decoder::kv_unit_floats(cfg, 3, ctx));
  o.mem_budget_bytes = Decoder::fixed_bytes_for(host_ops(), cfg, 3, ctx) + Decoder::min_store_bytes(batch_units);
  o.offload_dir = tmp.path();
  o.prefetch = 2;
  const GenerateResult spilled = generate_run(o, none);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(spilled.sequences[i].tokens, batched.sequences[i].tokens) << i;
  EXPECT_GT(spilled.write_bytes, 0u) << "the smallest budget must spill KV caches";
  EXPECT_GT(spilled.read_bytes, streamed.read_bytes);
  EXPECT_LE(spilled.peak_ram_bytes, o.mem_budget_bytes);
}

// The tiny Qwen2 (q, k and v biases) and Qwen3 (per-head q and k norms, Note [qk norm]) decode
// PyTorch's greedy tokens through the KV cache, in RAM and streamed under the smallest budget;
// kept in bf16 (--precision bf16: the biases or q and k norms widened beside the norm weights)
// the logits are the same bits in RAM and streamed, near the fp32 ones.
void check_qwen_greedy(const char* golden) {
  SCOPED_TRACE(golden);
  const std::string dir = testing::source_path(golden);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  auto ids = [&](const char* name) {
    const SafetensorsTensorInfo* t = ref.find(name);
    std::vector<std::int32_t> out(static_cast<std::size_t>(t->numel()));
    ref.read_raw(*t, out.data());
    return out;
  };
  const auto none = [](int, std::int32_t, const std::string&) {};
  GenerateOptions o = greedy_options();
  o.model_dir = dir;
  o.prompt_ids = {ids("generate_prompt")};
  EXPECT_EQ(generate_run(o, none).sequences[0].tokens, ids("generate_ids"));
  testing::TempDir tmp;
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);  // the unit table keeps a reference to it
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, 1, 17));
  o.mem_budget_bytes = Decoder::fixed_bytes_for(host_ops(), cfg, 1, 17) + Decoder::min_store_bytes(units);
  o.offload_dir = tmp.path();
  o.prefetch = 1;
  const GenerateResult streamed = generate_run(o, none);
  EXPECT_EQ(streamed.sequences[0].tokens, ids("generate_ids"));
  EXPECT_GT(streamed.read_bytes, 0u);

  const std::vector<float> fp32 = batch_logits(dir, false, false, "");
  const std::vector<float> kept = batch_logits(dir, true, false, "");
  const std::vector<float> kept_streamed = batch_logits(dir, true, true, tmp.path());
  ASSERT_EQ(kept.size(), fp32.size());
  EXPECT_EQ(std::memcmp(kept.data(), kept_streamed.data(), kept.size() * sizeof(float)), 0);
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(kept[i]) - fp32[i]));
    moved = std::max(moved, std::abs(static_cast<double>(kept[i]) - fp32[i]) > 0 ? 1.0 : 0.0);
  }
  EXPECT_LT(worst, 0.25) << "bf16 weights round, they do not change the model";
  EXPECT_EQ(moved, 1.0) << "the weights really were kept in bf16";
}

TEST(Generate, Qwen2GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_qwen2"); }
TEST(Generate, Qwen3GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_qwen3"); }
TEST(Generate, Phi3GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_phi3"); }
TEST(Generate, Phi35GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_phi35"); }
TEST(Generate, Phi4MiniGreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_phi4mini"); }
// 17 positions over the tiny Mistral's window of 6 (Note [mistral window]): the KV cache's rows
// before a query's window are skipped.
TEST(Generate, MistralGreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_mistral"); }
TEST(Generate, GemmaGreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_gemma"); }
TEST(Generate, Gemma3GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_gemma3"); }
TEST(Generate, Gemma2GreedyMatchesPyTorchInRamStreamedAndInBf16) { check_qwen_greedy("tests/golden/tiny_gemma2"); }

// Note [bf16 weights]: the bf16 golden Llama kept in bf16 gives the bits of its fp32 widening:
// every logit of a batch of two (prompt steps, then decode steps), in RAM and streamed under the
// smallest bf16 budget, which is below the fp32 one; generate_run keeps it bf16 and says so.
TEST(Generate, Bf16WeightsKeptAsStoredGiveTheWidenedBits) {
  const std::string dir = testing::source_path("tests/golden/tiny_llama_bf16");
  ASSERT_TRUE(model_weights_bf16(dir));
  EXPECT_FALSE(model_weights_bf16(testing::source_path(kLlama)));
  const GptConfig cfg = model_read_config(dir);
  const ParamLayout layout = ParamLayout::of(cfg);
  const int B = 2, ctx = 12;
  testing::TempDir tmp;
  auto logits_of = [&](bool bf16, bool streamed) { return batch_logits(dir, bf16, streamed, tmp.path()); };
  const std::vector<float> widened = logits_of(false, false);
  for (bool streamed : {false, true}) {
    const std::vector<float> kept = logits_of(true, streamed);
    ASSERT_EQ(kept.size(), widened.size());
    EXPECT_EQ(std::memcmp(kept.data(), widened.data(), kept.size() * sizeof(float)), 0)
        << (streamed ? "streamed" : "in RAM") << ": bf16 weights must give the fp32 widening's logits";
  }
  const UnitTable f32_units(layout, Decoder::kv_unit_floats(cfg, B, ctx), false);
  const UnitTable bf16_units(layout, Decoder::kv_unit_floats(cfg, B, ctx), true);
  EXPECT_LT(Decoder::min_store_bytes(bf16_units), Decoder::min_store_bytes(f32_units));

  GenerateOptions o = greedy_options();
  o.model_dir = dir;
  const auto none = [](int, std::int32_t, const std::string&) {};
  const GenerateResult kept = generate_run(o, none);
  EXPECT_TRUE(kept.weights_bf16);
  o.keep_bf16 = false;
  const GenerateResult wide = generate_run(o, none);
  EXPECT_FALSE(wide.weights_bf16);
  EXPECT_EQ(kept.sequences[0].tokens, wide.sequences[0].tokens);
  EXPECT_LT(kept.weight_bytes, wide.weight_bytes * 3 / 4);
}

// generate --precision bf16: the fp32 Llama rounded to bf16 on load (nearest even) holds the very
// weights of its bf16 golden copy (rounded by PyTorch), so every logit of a batch of two (a prompt
// step, then decode steps) and the greedy tokens are the bf16 copy's bits; half the weight bytes.
TEST(Generate, PrecisionBf16RoundsALlamaOnLoadToTheBf16CopysBits) {
  const std::string fp32_dir = testing::source_path(kLlama);
  const std::string bf16_dir = testing::source_path("tests/golden/tiny_llama_bf16");
  const std::vector<float> rounded = batch_logits(fp32_dir, /*bf16=*/true, /*streamed=*/false, "");
  const std::vector<float> stored = batch_logits(bf16_dir, /*bf16=*/true, /*streamed=*/false, "");
  ASSERT_EQ(rounded.size(), stored.size());
  EXPECT_EQ(std::memcmp(rounded.data(), stored.data(), rounded.size() * sizeof(float)), 0);

  const GenerateResult bf16 = expect_precision_bf16_halves_the_weights(fp32_dir);
  GenerateOptions o = greedy_options();
  o.model_dir = bf16_dir;
  o.precision = Precision::Bf16;
  EXPECT_EQ(generate_run(o, [](int, std::int32_t, const std::string&) {}).sequences[0].tokens,
            bf16.sequences[0].tokens);
}

// GPT-2 decodes bf16 weights too (Note [bf16 weights]): the fp32 golden GPT-2 rounded to bf16 on
// load gives, at every logit of a batch of two (a prompt step, then decode steps), in RAM and
// streamed under the smallest bf16 budget, the bits of decoding fp32 weights holding the same
// rounded values: the Conv1D products (rowdot_kn_bf16), the widened norms, biases and position
// rows and the head's widened ln_f change nothing but the bytes. generate_run keeps it bf16 at
// half the weight bytes.
TEST(Generate, PrecisionBf16DecodesGpt2WithTheBitsOfItsRoundedWeights) {
  const std::string dir = testing::source_path("tests/golden/tiny_gpt2");
  const GptConfig cfg = model_read_config(dir);
  ASSERT_FALSE(cfg.llama());
  testing::TempDir tmp;
  // The fp32 store gets the same rounding, kept in fp32; a bf16 store rounds on load (nearest even).
  const auto round_in_place = [](const UnitTable& units, SegmentStore& store) {
    for (int u = 0; u < units.count(); ++u) {
      if (units.kind(u) != SegmentKind::Params) continue;
      float* w = static_cast<float*>(store.acquire_unit(u, Access::Update));
      for (std::size_t i = 0; i < units.bytes(u) / sizeof(float); ++i) w[i] = bf16_to_f32(f32_to_bf16(w[i]));
      store.release_unit(u);
    }
  };
  auto logits_of = [&](bool bf16, bool streamed) {
    if (bf16) return batch_logits(dir, true, streamed, tmp.path());
    return batch_logits(dir, false, streamed, tmp.path(), round_in_place);
  };
  const std::vector<float> rounded = logits_of(false, false);
  for (bool streamed : {false, true}) {
    const std::vector<float> kept = logits_of(true, streamed);
    ASSERT_EQ(kept.size(), rounded.size());
    EXPECT_EQ(std::memcmp(kept.data(), rounded.data(), kept.size() * sizeof(float)), 0)
        << (streamed ? "streamed" : "in RAM") << ": bf16 GPT-2 weights must give their fp32 widening's logits";
  }

  EXPECT_FALSE(expect_precision_bf16_halves_the_weights(dir).sequences[0].tokens.empty());
}

TEST(Generate, BadInputIsRefusedWithAClearError) {
  const auto none = [](int, std::int32_t, const std::string&) {};
  auto error_of = [&](const GenerateOptions& o) {
    try {
      generate_run(o, none);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  GenerateOptions o = greedy_options();
  o.prompt_ids = {std::vector<std::int32_t>(64, 1)};
  EXPECT_NE(error_of(o).find("prompt 1 is 64 tokens"), std::string::npos) << error_of(o);
  EXPECT_NE(error_of(o).find("model context n_ctx=64 allows"), std::string::npos) << error_of(o);
  o.prompt_ids = {{1, 131}};
  EXPECT_NE(error_of(o).find("token id 131 is outside"), std::string::npos) << error_of(o);
  o = greedy_options();
  o.top_p = 0.0;
  EXPECT_NE(error_of(o).find("--top-p"), std::string::npos);
  o = greedy_options();
  o.prompt_ids.clear();
  o.prompts = {"hello"};
  EXPECT_NE(error_of(o).find("no tokenizer"), std::string::npos) << error_of(o);
  testing::TempDir tmp;
  o = greedy_options();
  o.mem_budget_bytes = 1 << 20;
  o.offload_dir = tmp.path();
  EXPECT_NE(error_of(o).find("is below the minimum"), std::string::npos) << error_of(o);
}

}  // namespace
}  // namespace stratum
