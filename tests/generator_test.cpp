// Token sampling rules (greedy, temperature, top-k, top-p) and generation with the KV-cached
// decoder against the PyTorch golden Llama: in RAM, streamed, batched; bad input.
#include "infer/generator.h"

#include <gtest/gtest.h>

#include <vector>

#include "formats/safetensors.h"
#include "infer/decoder.h"
#include "integration_util.h"
#include "model/model_io.h"
#include "stratum/error.h"

namespace stratum {
namespace {

TEST(Sampling, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sample_next_token(logits.data(), 4, 0.0, 0, 0.99), 1);
}

TEST(Sampling, TopOneEqualsGreedy) {
  const std::vector<float> logits = {0.1f, 2.0f, 5.0f, 1.0f};
  for (double u : {0.0, 0.3, 0.999}) EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 1, u), 2);
}

TEST(Sampling, UniformDrawMapsToCumulativeProbabilities) {
  // Equal logits: probabilities 1/4 each, so u in [0.5, 0.75) picks id 2.
  const std::vector<float> logits(4, 1.0f);
  EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 0, 0.1), 0);
  EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 0, 0.6), 2);
  EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 0, 0.99), 3);
}

TEST(Sampling, TopKExcludesTheRest) {
  const std::vector<float> logits = {5.0f, 4.9f, -2.0f, 4.8f};
  // top-2 keeps ids 0 and 1 only, whatever the draw.
  for (double u = 0.0; u < 1.0; u += 0.05) {
    const int id = sample_next_token(logits.data(), 4, 1.0, 2, u);
    EXPECT_TRUE(id == 0 || id == 1) << u;
  }
}

TEST(Sampling, LowTemperatureApproachesGreedy) {
  const std::vector<float> logits = {1.0f, 1.5f, 0.5f};
  EXPECT_EQ(sample_next_token(logits.data(), 3, 0.01, 0, 0.5), 1);
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // softmax of {2, 1, 0, -1}: 0.644, 0.237, 0.087, 0.032. top-p 0.6 keeps id 0 only; 0.85 ids 0-1.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  for (double u = 0.0; u < 1.0; u += 0.05) EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 0, u, 0.6), 0) << u;
  for (double u = 0.0; u < 1.0; u += 0.05) {
    const int id = sample_next_token(logits.data(), 4, 1.0, 0, u, 0.85);
    EXPECT_TRUE(id == 0 || id == 1) << u;
  }
  EXPECT_EQ(sample_next_token(logits.data(), 4, 1.0, 0, 0.99, 1.0), 3) << "top-p 1 keeps everything";
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
  const UnitTable units(layout, Decoder::kv_unit_floats(cfg, 1, 17), true);
  o.mem_budget_bytes = Decoder::fixed_bytes_for(cfg, 1, 17) + Decoder::min_store_bytes(units);
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
  const UnitTable batch_units(layout, Decoder::kv_unit_floats(cfg, 3, ctx), true);
  o.mem_budget_bytes = Decoder::fixed_bytes_for(cfg, 3, ctx) + Decoder::min_store_bytes(batch_units);
  o.offload_dir = tmp.path();
  o.prefetch = 2;
  const GenerateResult spilled = generate_run(o, none);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(spilled.sequences[i].tokens, batched.sequences[i].tokens) << i;
  EXPECT_GT(spilled.write_bytes, 0u) << "the smallest budget must spill KV caches";
  EXPECT_GT(spilled.read_bytes, streamed.read_bytes);
  EXPECT_LE(spilled.peak_ram_bytes, o.mem_budget_bytes);
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
  EXPECT_NE(error_of(o).find("model context of 64"), std::string::npos) << error_of(o);
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
