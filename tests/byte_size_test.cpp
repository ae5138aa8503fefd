// core/byte_size.h: sizes in messages never print "0.0 MiB" for a small amount or "0.01 GiB".
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
