// Token sampling rules: greedy, temperature, top-k.
#include "infer/generator.h"

#include <gtest/gtest.h>

#include <vector>

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
