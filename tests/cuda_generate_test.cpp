// Generation on the CUDA backend (`stratum generate --backend cuda`: weights and KV caches in GPU
// memory, the decoder's ops on the GPU, sampling on the host): greedy decoding gives the CPU's
// tokens for GPT-2, Llama (fp32 and kept-bf16 weights) and batched prompts of different lengths
// (KV cache slots and positions per sequence). The GPU's row dots are the CPU's bits (Note [row dot
// products]); its cached attention sums in another order, so the tokens, not the logits' bits,
// are compared. Skipped without a GPU; the refusals are tested everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cross_backend_util.h"
#include "tiny_run_options.h"
#include "infer/generator.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum::testing {
namespace {

GenerateOptions greedy(const std::string& dir) { return greedy_generate_options(dir); }

std::vector<std::vector<std::int32_t>> tokens(const GenerateOptions& o) { return generated_ids(o); }

TEST(CudaGenerate, GreedyTokensAreTheCpus) {
  STRATUM_REQUIRE_CUDA();
  for (const char* dir : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama", "tests/golden/tiny_llama_bf16"}) {
    for (int batch : {1, 3}) {
      GenerateOptions o = greedy(dir);
      o.batch = batch;
      const auto cpu = tokens(o);
      o.backend = Backend::Cuda;
      const auto gpu = tokens(o);
      EXPECT_EQ(gpu, cpu) << dir << " batch " << batch;
      EXPECT_EQ(tokens(o), gpu) << dir << ": two GPU runs";
    }
  }
}

TEST(CudaGenerate, RefusalsAreOneLine) {
  GenerateOptions o = greedy("tests/golden/tiny_gpt2");
  o.backend = Backend::Cuda;
  auto message = [](const GenerateOptions& opts) {
    try {
      generate_run(opts, [](int, std::int32_t, const std::string&) {});
    } catch (const BugError& e) {
      return std::string("internal error: ") + e.what();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string why;
  if (!backend_available(Backend::Cuda, &why)) {
    EXPECT_EQ(message(o), why);
  }
}

// --gpu-mem-budget (Note [device tier]): the weights and KV caches that do not fit are copied in
// by the decode schedule; the smallest budget and a middle one give the whole-state GPU tokens
// (which are the CPU's), over RAM and over a RAM budget on NVMe.
TEST(CudaGenerate, GpuMemoryBudgetsGiveTheSameTokens) {
  STRATUM_REQUIRE_CUDA();
  TempDir tmp;
  for (const char* dir : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama_bf16"}) {
    GenerateOptions o = greedy(dir);
    o.backend = Backend::Cuda;
    o.gpu_mem_budget_bytes = std::size_t{1} << 30;
    const GenerateResult roomy = generate_run(o, [](int, std::int32_t, const std::string&) {});
    o.gpu_mem_budget_bytes = 0;
    const auto want = tokens(o);
    for (const std::size_t budget : {roomy.device_min_bytes, roomy.device_min_bytes * 3 / 2}) {
      for (const bool host_budget : {false, true}) {
        GenerateOptions d = o;
        d.gpu_mem_budget_bytes = budget;
        if (host_budget) {
          d.mem_budget_bytes = std::size_t{64} << 20;
          d.offload_dir = tmp.path();
        }
        const GenerateResult r = generate_run(d, [](int, std::int32_t, const std::string&) {});
        std::vector<std::vector<std::int32_t>> got;
        for (const GenerateSequence& s : r.sequences) got.push_back(s.tokens);
        EXPECT_EQ(got, want) << dir << " budget " << budget << (host_budget ? " over NVMe" : "");
        EXPECT_GT(r.device_read_bytes, 0u);
        EXPECT_LE(r.device_peak_bytes, budget);
      }
    }
  }
}

}  // namespace
}  // namespace stratum::testing
