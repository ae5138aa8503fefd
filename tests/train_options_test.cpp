// Tests for src/train/train_options.h (Note [option table]): every row survives the trainer
// state's JSON, a changed value is seen as changed, flags and keys are unique, and a value out of
// a row's range is refused from a file.
#include "train/train_options.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>
#include <type_traits>

#include "integration_util.h"
#include "stratum/error.h"
#include "tiny_run_options.h"
#include "train/checkpoint.h"

namespace stratum {
namespace {

// A value of the row's field other than its default, inside the row's range.
void change(const TrainOption& option, TrainSettings& s) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) *p = "/data/other path";
        else if constexpr (std::is_same_v<T, bool>) *p = !*p;
        else if constexpr (std::is_enum_v<T>) *p = static_cast<T>(static_cast<int>(*p) == 0 ? 1 : 0);
        else if constexpr (std::is_same_v<T, double>) *p = *p < option.max / 2 ? *p * 0.5 + option.max / 4 : *p / 2;
        else if constexpr (std::is_same_v<T, std::uint64_t>)
          *p = !option.bytes ? 0xfedcba9876543210ull & 0x7fffffffffffffffull
               : *p == (8ull << 20) ? 4ull << 20 : 8ull << 20;  // sizes: within every size row's range
        else *p = *p + 1 <= option.max ? *p + 1 : *p - 1;
      },
      option.field(s));
}

TrainerState state_with(const TrainSettings& settings) { return testing::trainer_state_minimal(settings); }

TEST(TrainOptions, IntegerRangesSaturateAtTheInt64Limits) {
  for (const TrainOption& option : train_option_table()) {
    if (std::string(option.flag) != "seed") continue;
    EXPECT_EQ(train_option_int_min(option), 0);
    EXPECT_EQ(train_option_int_max(option), std::numeric_limits<std::int64_t>::max());
    return;
  }
  ADD_FAILURE() << "no --seed row";
}

TEST(TrainOptions, FlagsAndKeysAreUnique) {
  std::set<std::string> flags, keys;
  for (const TrainOption& option : train_option_table()) {
    EXPECT_TRUE(flags.insert(option.flag).second) << option.flag;
    EXPECT_TRUE(keys.insert(option.key).second) << option.key;
  }
  EXPECT_GE(flags.size(), 20u);
}

TEST(TrainOptions, EveryRowSurvivesTheTrainerStateAndAChangeIsSeen) {
  for (const TrainOption& option : train_option_table()) {
    SCOPED_TRACE(option.flag);
    const TrainerState base = state_with(TrainSettings{});
    TrainSettings changed_settings;
    change(option, changed_settings);
    const TrainerState changed = state_with(changed_settings);
    EXPECT_FALSE(train_option_equal(option, base, changed)) << train_option_text(option, changed);
    EXPECT_NE(train_option_text(option, base), train_option_text(option, changed));
    const TrainerState back = trainer_state_parse(trainer_state_json(changed), "state");
    for (const TrainOption& other : train_option_table())
      EXPECT_TRUE(train_option_equal(other, back, changed)) << other.flag << ": " << train_option_text(other, back);
  }
}

TEST(TrainOptions, OutOfRangeValuesInAFileAreRefusedNamingTheKey) {
  for (const auto& [key, value] : {std::pair{"batch", "0"}, {"beta1", "1.5"}, {"keep", "0"}, {"grad_clip", "-1"},
                                   {"lr_schedule", "\"linear\""}, {"seed", "\"12\""},
                                   {"backend", "\"tpu\""}, {"mem_budget", "-1"}, {"io_block", "100"}}) {
    std::string text = trainer_state_json(state_with(TrainSettings{}));
    const std::string field = "\"" + std::string(key) + "\": ";
    const std::size_t at = text.find(field);
    ASSERT_NE(at, std::string::npos) << key;
    const std::size_t end = text.find_first_of(",\n", at + field.size());
    text.replace(at + field.size(), end - at - field.size(), value);
    try {
      trainer_state_parse(text, "state");
      ADD_FAILURE() << key << " " << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + key + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// Note [device row chunk]: --row-chunk's default is the backend's, resolved when the run starts
// and recorded resolved, so a checkpoint says the chunk it trained with.
TEST(TrainOptions, RowChunkDefaultsToTheBackendsAndIsRecordedResolved) {
  EXPECT_EQ(TrainSettings{}.row_chunk, 0);
  EXPECT_EQ(row_chunk_default(Backend::Cpu), kRowChunk);
  EXPECT_EQ(row_chunk_default(Backend::Cuda), kRowChunkDevice);
  testing::TempDir dir;
  TrainOptions o = testing::tiny_train_options(false);
  o.steps = 1;
  o.save_dir = dir.path() + "/ck";
  ASSERT_EQ(o.row_chunk, 0);
  const TrainResult r = train_run(o);
  const CheckpointCheck check = checkpoint_verify(r.checkpoint_dir);
  ASSERT_TRUE(check.ok()) << check.problem;
  EXPECT_EQ(check.state.row_chunk, kRowChunk);
}

}  // namespace
}  // namespace stratum
