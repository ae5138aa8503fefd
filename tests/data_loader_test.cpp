// DataLoader batch semantics (sequential with wrap, seeded shuffle, loss masks) and LR schedules.
#include "data/data_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "data/token_file.h"
#include "stratum/error.h"
#include "train/lr_schedule.h"

namespace stratum {
namespace {

std::vector<std::int32_t> iota_tokens(int n) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

TEST(DataLoader, SequentialBatchesShiftTargetsAndWrap) {
  DataLoader loader(iota_tokens(10), 2, 2, false, 0);  // B*T = 4
  std::vector<std::int32_t> in(4), tg(4);
  loader.batch(0, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{1, 2, 3, 4}));
  loader.batch(2, in.data(), tg.data());  // tokens [8, 13) mod 10
  EXPECT_EQ(in, (std::vector<std::int32_t>{8, 9, 0, 1}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{9, 0, 1, 2}));
  EXPECT_EQ(loader.batches_per_epoch(), 2);
}

// Note [loss mask]: a token that is no loss target is its id among the inputs and -1 among the
// targets, wherever the batch starts (the wrap included).
TEST(DataLoader, MaskedTokensAreInputsButNotTargets) {
  std::vector<std::int32_t> tokens = iota_tokens(10);
  for (int i : {0, 2, 3}) tokens[static_cast<std::size_t>(i)] = token_no_loss(i);
  DataLoader loader(tokens, 2, 2, false, 0);
  std::vector<std::int32_t> in(4), tg(4);
  loader.batch(0, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{1, -1, -1, 4}));
  loader.batch(2, in.data(), tg.data());  // tokens [8, 13) mod 10
  EXPECT_EQ(in, (std::vector<std::int32_t>{8, 9, 0, 1}));
  EXPECT_EQ(tg, (std::vector<std::int32_t>{9, -1, 1, -1}));
  loader.batch(2, in.data(), nullptr);
  EXPECT_EQ(in, (std::vector<std::int32_t>{8, 9, 0, 1}));
}

TEST(DataLoader, ShuffleVisitsEveryBatchOncePerEpochAndIsSeeded) {
  DataLoader a(iota_tokens(4 * 50 + 1), 1, 4, true, 11), b(iota_tokens(4 * 50 + 1), 1, 4, true, 11),
      c(iota_tokens(4 * 50 + 1), 1, 4, true, 12);
  std::vector<std::int32_t> in(4), tg(4), in2(4), tg2(4);
  std::set<int> starts;
  bool differs = false, in_order = true;
  for (int k = 0; k < 50; ++k) {
    a.batch(k, in.data(), tg.data());
    b.batch(k, in2.data(), tg2.data());
    EXPECT_EQ(in, in2);
    starts.insert(in[0]);
    EXPECT_EQ(in[0] % 4, 0);
    if (in[0] != 4 * k) in_order = false;
    c.batch(k, in2.data(), tg2.data());
    if (in != in2) differs = true;
  }
  EXPECT_EQ(starts.size(), 50u);
  EXPECT_FALSE(in_order);
  EXPECT_TRUE(differs);
  // The next epoch uses a different permutation.
  a.batch(50, in.data(), tg.data());
  a.batch(0, in2.data(), tg2.data());
  std::vector<int> epoch0, epoch1;
  for (int k = 0; k < 50; ++k) {
    a.batch(k, in.data(), tg.data());
    epoch0.push_back(in[0]);
    a.batch(50 + k, in.data(), tg.data());
    epoch1.push_back(in[0]);
  }
  EXPECT_NE(epoch0, epoch1);
}

TEST(DataLoader, RejectsEmptyData) {
  EXPECT_THROW(DataLoader({}, 1, 1, false, 0), Error);
  EXPECT_THROW(DataLoader({5}, 1, 1, false, 0), Error);
}

TEST(LrSchedule, WarmupThenCosineOrConstant) {
  LrSchedule s;
  s.kind = LrScheduleKind::Cosine;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 4;
  s.total_steps = 14;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);
  EXPECT_NEAR(s.lr_at(9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-15);
  EXPECT_NEAR(s.lr_at(14), 0.1, 1e-15);
  s.kind = LrScheduleKind::Constant;
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(13), 1.0);
  EXPECT_EQ(lr_schedule_parse("cosine"), LrScheduleKind::Cosine);
  EXPECT_THROW(lr_schedule_parse("linear"), Error);
}

}  // namespace
}  // namespace stratum
