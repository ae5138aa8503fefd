// core/byte_size.h and formats/json_brief.h: sizes and JSON values as messages show them.
#include "core/byte_size.h"

#include <gtest/gtest.h>

namespace stratum {
namespace {

TEST(ByteSize, EachSizeInAUnitThatShowsIt) {
  EXPECT_EQ(bytes_text(1), "1 bytes");
  EXPECT_EQ(bytes_text(65536), "64.0 KiB");
  EXPECT_EQ(bytes_text(13.4 * 1048576), "13.4 MiB");
  EXPECT_EQ(bytes_text(9.5 * 1073741824.0), "9728.0 MiB");
  EXPECT_EQ(bytes_text(12.5 * 1073741824.0), "12.5 GiB");
}

}  // namespace
}  // namespace stratum

#include "formats/json_brief.h"

namespace stratum {
namespace {

// Item 11 of the adversarial pass: a bad shape was shown as "an array of 2 element(s)".
TEST(JsonBrief, ShortFlatArraysAreShownAsThemselves) {
  EXPECT_EQ(json_brief(nlohmann::json::parse("[2, -1]")), "[2, -1]");
  EXPECT_EQ(json_brief(nlohmann::json::parse("[]")), "[]");
  EXPECT_EQ(json_brief(nlohmann::json::parse("[[1], 2]")), "an array of 2 element(s)");
  EXPECT_EQ(json_brief(nlohmann::json::parse("[1,2,3,4,5,6,7,8,9]")), "an array of 9 element(s)");
  EXPECT_EQ(json_brief(nlohmann::json::parse("{\"a\": 1}")), "an object with 1 key(s)");
  EXPECT_EQ(json_brief(nlohmann::json::parse("\"x\"")), "\"x\"");
}

}  // namespace
}  // namespace stratum
