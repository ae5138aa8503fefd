// Inputs that crashed a parser under fuzzing (fuzz/corpus/*/regress_*) must now give a clean
// stratum::Error: deep JSON nesting in error messages (stack overflow), an n_inner check that
// overflowed int, an infinite layer_norm_epsilon that was accepted, trainer states and checkpoint
// manifests with 0 where the minimum is 1 (the unsigned branch skipped the lower bound), Jinja
// templates nesting parentheses, unary minus or macro calls deeply enough to overflow a 128 KiB stack,
// and one whose integer product overflowed 64 bits.
#include <gtest/gtest.h>

#include <filesystem>

#include "formats/jinja.h"
#include "model/hf_config.h"
#include "formats/safetensors.h"
#include "core/file_util.h"
#include "integration_util.h"
#include "train/checkpoint.h"
#include "stratum/error.h"

namespace stratum {
namespace {

std::vector<std::string> regressions(const std::string& target) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(testing::source_path("fuzz/corpus/" + target)))
    if (e.path().filename().string().rfind("regress_", 0) == 0) out.push_back(e.path().string());
  return out;
}

TEST(FuzzRegression, HfConfigInputsThrowCleanly) {
  const auto files = regressions("hf_config");
  EXPECT_GE(files.size(), 3u);
  for (const auto& f : files) EXPECT_THROW(hf_config_read(f), Error) << f;
}

TEST(FuzzRegression, SafetensorsInputsThrowCleanly) {
  const auto files = regressions("safetensors");
  EXPECT_GE(files.size(), 1u);
  for (const auto& f : files) EXPECT_THROW(SafetensorsFile::open(f), Error) << f;
}

TEST(FuzzRegression, TrainerStatesWithZeroFieldsThrowCleanly) {
  const auto files = regressions("trainer_state");
  EXPECT_GE(files.size(), 5u);
  for (const auto& f : files) EXPECT_THROW(trainer_state_parse(file_read_all(f), f), Error) << f;
}

TEST(FuzzRegression, ManifestsWithStepZeroThrowCleanly) {
  const auto files = regressions("checkpoint_manifest");
  EXPECT_GE(files.size(), 2u);
  for (const auto& f : files) EXPECT_THROW(manifest_parse(file_read_all(f), f), Error) << f;
}

TEST(FuzzRegression, DeepOrOverflowingJinjaTemplatesThrowCleanly) {
  const auto files = regressions("jinja");
  EXPECT_GE(files.size(), 4u);
  const nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::array()}, {"add_generation_prompt", true}};
  for (const auto& f : files) EXPECT_THROW(JinjaTemplate::parse(file_read_all(f), f).render(context), Error) << f;
}

}  // namespace
}  // namespace stratum
