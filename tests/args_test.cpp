// Flag parsing: values, switches, sizes, positional arguments and every error path.
#include "cli/args.h"

#include <gtest/gtest.h>

#include "stratum/error.h"

namespace stratum {
namespace {

const std::vector<FlagSpec> kSpecs = {{"steps", "N", ""}, {"lr", "X", ""}, {"quiet", "", ""}, {"budget", "SIZE", ""}};

TEST(Args, ParsesValuesSwitchesAndSizes) {
  Args a("train", {"--steps", "12", "--lr=3e-4", "--quiet", "--budget", "1.5G"}, kSpecs);
  EXPECT_EQ(a.integer("steps", 0, 0, 100), 12);
  EXPECT_DOUBLE_EQ(a.number("lr", 0), 3e-4);
  EXPECT_TRUE(a.flag("quiet"));
  EXPECT_EQ(a.size_bytes("budget", 0), 3ull << 29);
  EXPECT_EQ(a.integer("missing", 7, 0, 10), 7);
  EXPECT_FALSE(a.help_requested());
  EXPECT_TRUE(Args("train", {"-h"}, kSpecs).help_requested());
  EXPECT_EQ(Args("info", {"a", "b"}, {}, 2).positional().size(), 2u);
}

TEST(Args, RejectsBadInput) {
  const std::vector<std::vector<std::string>> bad = {
      {"--nope", "1"}, {"--steps"}, {"--steps", "1", "--steps", "2"}, {"--quiet=1"}, {"stray"},
  };
  for (const auto& argv : bad) EXPECT_THROW(Args("train", argv, kSpecs), Error) << argv[0];
  EXPECT_THROW(Args("train", {"--steps", "x"}, kSpecs).integer("steps", 0, 0, 10), Error);
  EXPECT_THROW(Args("train", {"--steps", "11"}, kSpecs).integer("steps", 0, 0, 10), Error);
  EXPECT_THROW(Args("train", {"--steps", "1e3"}, kSpecs).integer("steps", 0, 0, 10000), Error);
  EXPECT_THROW(Args("train", {"--lr", "nan"}, kSpecs).number("lr", 0), Error);
  EXPECT_THROW(Args("train", {"--lr", ""}, kSpecs).number("lr", 0), Error);
  EXPECT_THROW(Args("train", {"--budget", "12Q"}, kSpecs).size_bytes("budget", 0), Error);
  EXPECT_THROW(Args("train", {"--budget", "-1G"}, kSpecs).size_bytes("budget", 0), Error);
}

// An empty value is an error, never "absent": --save "" trained and saved nothing, --model ""
// trained a fresh default model, --log ""/--trace "" were ignored.
TEST(Args, AnEmptyValueIsAnError) {
  for (const auto& argv : std::vector<std::vector<std::string>>{{"--budget", ""}, {"--budget="}, {"--steps", ""}}) {
    try {
      Args("train", argv, kSpecs);
      ADD_FAILURE() << argv[0] << " with an empty value was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is given an empty value"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace stratum
