// Inputs that crashed a parser under fuzzing (fuzz/corpus/*/regress_*) must now give a clean
// stratum::Error: deep JSON nesting in error messages (stack overflow), an n_inner check that
// overflowed int, an infinite layer_norm_epsilon that was accepted.
#include <gtest/gtest.h>

#include <filesystem>

#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "integration_util.h"
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
  for (const auto& f : files) EXPECT_THROW(hf_config_read_gpt2(f), Error) << f;
}

TEST(FuzzRegression, SafetensorsInputsThrowCleanly) {
  const auto files = regressions("safetensors");
  EXPECT_GE(files.size(), 1u);
  for (const auto& f : files) EXPECT_THROW(SafetensorsFile::open(f), Error) << f;
}

}  // namespace
}  // namespace stratum
