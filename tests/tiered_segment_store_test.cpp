// TieredSegmentStore: data survives eviction and reload bit for bit; units never written read as
// zeros; clean and dead units are not written back; the RAM budget is never exceeded at any
// moment (checked after every operation of a long random schedule walk, from two threads);
// bad directories, too little disk space and I/O faults give clear errors.
#include "store/tiered_segment_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

GptConfig small_config() {
  GptConfig cfg;
  cfg.n_layer = 4;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.n_ctx = 16;
  cfg.vocab_size = 300;
  return cfg;
}

struct Fixture {
  GptConfig cfg = small_config();
  ParamLayout layout = ParamLayout::gpt2(cfg);
  UnitTable units{layout, 2 * 16 * 64};
  testing::TempDir dir;

  std::size_t largest_unit() const {
    std::size_t m = 0;
    for (int u = 0; u < units.count(); ++u) m = std::max(m, units.bytes(u));
    return m;
  }
  TieredStoreOptions options(std::size_t budget, IoBackend backend = IoBackend::Auto) const {
    TieredStoreOptions o;
    o.budget_bytes = budget;
    o.offload_dir = dir.path();
    o.prefetch_depth = 2;
    o.io.backend = backend;
    return o;
  }
};

float pattern(int unit, std::size_t i) { return static_cast<float>(unit * 1000003 + static_cast<long>(i % 9973)); }

void fill(SegmentStore& store, int unit) {
  float* p = store.acquire_view(unit, Access::Overwrite).f32();
  const std::size_t n = store.units().bytes(unit) / sizeof(float);
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(unit, i);
  store.release_unit(unit);
}

bool check(SegmentStore& store, int unit) {
  const float* p = store.acquire_view(unit, Access::Read).f32();
  const std::size_t n = store.units().bytes(unit) / sizeof(float);
  bool ok = true;
  for (std::size_t i = 0; i < n && ok; ++i) ok = p[i] == pattern(unit, i);
  store.release_unit(unit);
  return ok;
}

// A refresh of the prefetch window (the optimizer worker calls one after each chunk) comes after
// the running group has made its uses: a unit that group overwrote, then lost to an eviction (it
// was written back), is not taken for dead because the group lists it with Overwrite: the next
// group reads what the group wrote. (Before, the window gave it a fresh buffer and the next read
// saw garbage: found as other bits in pipelined training under load.)
TEST(TieredStore, ARefreshAfterTheRunningGroupKeepsWhatItWrote) {
  Fixture f;
  const int a = f.units.index(f.layout.layer_segment(0), SegmentKind::Grads);
  const int b = f.units.index(f.layout.layer_segment(1), SegmentKind::Params);
  StepSchedule schedule(f.units.count());
  schedule.group_add({{a, Access::Overwrite}});  // 0: writes a
  schedule.group_add({{b, Access::Read}});       // 1: needs the room
  schedule.group_add({{a, Access::Read}});       // 2: reads what group 0 wrote
  TieredStoreOptions o = f.options(std::max(f.units.bytes(a), f.units.bytes(b)));
  o.prefetch_depth = 0;
  TieredSegmentStore store(f.units, o);
  store.schedule_set(&schedule);
  fill(store, b);
  store.schedule_at(0);
  fill(store, a);                // group 0 writes a
  EXPECT_TRUE(check(store, b));  // the worker, still at group 0, needs the room: a is written back
  store.schedule_refresh();      // its refresh: group 0's Overwrite use of a is already done
  store.schedule_at(2);
  EXPECT_TRUE(check(store, a)) << "group 2 reads what group 0 wrote";
  store.schedule_set(nullptr);
}

// Note [buffer pool]: evicted units' buffers serve the next units whatever their sizes (remapped),
// so streaming units of mixed sizes through the budget takes a handful of buffers from the
// system, not one per load (the pool served exact sizes only: a miss freed pool buffers and
// allocated a fresh one, paying page faults and a kernel zero fill on every read).
// Note [prefetch on write completion]: the window's read of b cannot start while a fills the
// budget; once a is released it is written behind, and the finished write alone (no further call
// into the store) starts b's read. Before, b waited for the next schedule_at or acquire.
TEST(TieredStore, AFinishedWriteBackStartsTheWindowsNextRead) {
  Fixture f;
  const int a = f.units.index(1, SegmentKind::Params), b = f.units.index(2, SegmentKind::Params);
  ASSERT_EQ(f.units.bytes(a), f.units.bytes(b));
  StepSchedule schedule(f.units.count());
  schedule.group_add({{a, Access::Update}});  // 0
  schedule.group_add({{b, Access::Read}});    // 1: in the window of group 0
  schedule.group_add({{b, Access::Read}});    // 2
  schedule.group_add({{a, Access::Read}});    // 3: far enough for a's write-behind
  TieredStoreOptions o = f.options(f.units.bytes(a));  // room for one of them
  o.prefetch_depth = 1;
  TieredSegmentStore store(f.units, o);
  // Filled before the schedule is set: filled after it, a's fill counts as group 0's use, so its
  // release writes a behind (next use group 3), and a write finishing before schedule_at(0) left
  // a absent and read back there (a race that failed on a loaded CI machine).
  fill(store, b);
  fill(store, a);  // evicts b: written, so b is on disk
  store.schedule_set(&schedule);
  const std::uint64_t read0 = store.stats().read_bytes;
  store.schedule_at(0);  // b's read would need a's room: not started
  EXPECT_EQ(store.stats().read_bytes, read0);
  float* p = store.acquire_view(a, Access::Update).f32();
  p[0] += 1.0f;
  store.release_unit(a);  // a is written behind; nothing else calls the store from here
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store.stats().read_bytes == read0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(store.stats().read_bytes, read0 + f.units.bytes(b)) << "b's read did not start when a's write finished";
  store.schedule_at(1);
  EXPECT_TRUE(check(store, b));
  store.schedule_set(nullptr);
}

// Note [discarded holds]: a hold that began with the file's data drops its changes instead of
// writing them, and the unit says it is stale until the next hold (which redoes them) ends; a
// hold that began dirty keeps its changes. Reading a stale unit is a bug.
TEST(TieredStore, ADiscardedHoldDropsItsChangesAndLeavesTheUnitStale) {
  Fixture f;
  const int a = f.units.index(1, SegmentKind::Params), b = f.units.index(2, SegmentKind::Params);
  StepSchedule schedule(f.units.count());
  schedule.group_add({{a, Access::Update}});
  schedule.group_add({{b, Access::Update}});
  TieredSegmentStore store(f.units, f.options(f.units.bytes(a)));  // room for one
  store.schedule_set(&schedule);
  fill(store, a);
  fill(store, b);  // a is written and evicted
  const std::uint64_t written = store.stats().write_bytes;
  float* p = store.acquire_view(a, Access::Update).f32();
  ASSERT_EQ(p[0], pattern(a, 0));
  p[0] = -1.0f;
  store.release_unit_discard(a);
  EXPECT_TRUE(store.unit_stale(a));
  EXPECT_EQ(store.stats().discarded_holds, 1u);
  EXPECT_THROW(store.acquire_unit(a, Access::Read), BugError);
  EXPECT_TRUE(check(store, b));  // b stays as written
  p = store.acquire_view(a, Access::Update).f32();
  EXPECT_EQ(p[0], pattern(a, 0)) << "the file's data, not the dropped change";
  p[0] = 5.0f;
  store.release_unit(a);
  EXPECT_FALSE(store.unit_stale(a));
  p = store.acquire_view(a, Access::Update).f32();  // dirty when acquired: the change is kept
  p[1] = 7.0f;
  store.release_unit_discard(a);
  EXPECT_FALSE(store.unit_stale(a));
  EXPECT_EQ(store.stats().discarded_holds, 1u);
  EXPECT_TRUE(check(store, b));  // evicts a: written
  EXPECT_GT(store.stats().write_bytes, written);
  p = store.acquire_view(a, Access::Read).f32();
  EXPECT_EQ(p[0], 5.0f);
  EXPECT_EQ(p[1], 7.0f);
  store.release_unit(a);
  store.schedule_set(nullptr);
}

TEST(TieredStore, BuffersOfEvictedUnitsServeUnitsOfOtherSizes) {
  GptConfig cfg = small_config();
  cfg.n_layer = 2;
  cfg.n_embd = 256;
  cfg.n_head = 4;
  cfg.vocab_size = 8192;  // vocabulary blocks of 2 MiB beside layers of 3 MiB
  const ParamLayout layout = ParamLayout::gpt2(cfg);
  const UnitTable units(layout, 2 * 16 * 256);
  testing::TempDir dir;
  std::vector<int> large;  // units of 1 MiB and more (mmap'd buffers), of several sizes
  std::size_t largest = 0;  // as held (Note [whole huge pages])
  for (int u = 0; u < units.count(); ++u) {
    if (units.bytes(u) < (std::size_t{1} << 20)) continue;
    large.push_back(u);
    largest = std::max(largest, units.held_bytes(u));
  }
  std::set<std::size_t> sizes;
  for (int u : large) sizes.insert(units.bytes(u));
  ASSERT_GE(sizes.size(), 2u) << "the test needs units of different sizes";
  TieredStoreOptions o;
  o.budget_bytes = 3 * largest;
  o.offload_dir = dir.path();
  o.prefetch_depth = 0;
  TieredSegmentStore store(units, o);
  for (int u : large) fill(store, u);
  long loads = 0;
  for (int round = 0; round < 6; ++round)
    for (std::size_t i = 0; i < large.size(); ++i) {
      const int u = large[(i * 7 + static_cast<std::size_t>(round)) % large.size()];
      EXPECT_TRUE(check(store, u)) << units.name(u);
      ++loads;
    }
  const StoreStats s = store.stats();
  EXPECT_GT(s.read_bytes, 0u);
  EXPECT_LE(s.peak_held_bytes, s.budget_bytes);
  // Once the budget's pages are made, units of any size reuse them (Note [moving pages]): with
  // units padded to whole blocks but no pages moved, this walk took 13x the budget in fresh pages.
  EXPECT_LE(s.made_bytes, s.budget_bytes) << loads << " loads of " << large.size() << " units of " << sizes.size()
                                          << " sizes, " << s.read_bytes << " bytes read";
}

class TieredStoreBackends : public ::testing::TestWithParam<IoBackend> {};

TEST_P(TieredStoreBackends, EvictedUnitsComeBackBitIdentical) {
  Fixture f;
  TieredSegmentStore store(f.units, f.options(3 * f.largest_unit(), GetParam()));
  for (int u = 0; u < f.units.count(); ++u) fill(store, u);
  for (int round = 0; round < 2; ++round)
    for (int u = f.units.count() - 1; u >= 0; --u) EXPECT_TRUE(check(store, u)) << f.units.name(u);
  const StoreStats s = store.stats();
  EXPECT_GT(s.write_bytes, 0u);
  EXPECT_GT(s.read_bytes, 0u);
  EXPECT_LE(s.peak_held_bytes, s.budget_bytes);
}

TEST_P(TieredStoreBackends, NeverWrittenReadsAsZeros) {
  Fixture f;
  TieredSegmentStore store(f.units, f.options(2 * f.largest_unit(), GetParam()));
  for (int u = 0; u < f.units.count(); ++u) {  // recycled buffers must be zeroed too
    float* p = store.acquire_view(u, Access::Read).f32();
    const std::size_t n = f.units.bytes(u) / sizeof(float);
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < n; ++i) nonzero += p[i] != 0.0f;
    store.release_unit(u);
    EXPECT_EQ(nonzero, 0u) << f.units.name(u);
    fill(store, u);  // dirty it, so the next unit may land in a recycled buffer
  }
}

INSTANTIATE_TEST_SUITE_P(Io, TieredStoreBackends, ::testing::Values(IoBackend::Threads, IoBackend::Uring),
                         [](const auto& info) { return std::string(io_backend_name(info.param)); });

TEST(TieredStore, CleanUnitsAreNotWrittenBackAndDeadUnitsAreDropped) {
  Fixture f;
  const int a = f.units.index(1, SegmentKind::Params), b = f.units.index(2, SegmentKind::Params);
  const int g = f.units.index(1, SegmentKind::Grads);
  // Budget for exactly one layer unit: every acquire evicts the other.
  TieredSegmentStore store(f.units, f.options(f.units.bytes(a)));
  StepSchedule schedule(f.units.count());
  schedule.group_add({{a, Access::Read}});
  schedule.group_add({{b, Access::Read}});
  schedule.group_add({{g, Access::Overwrite}});  // g's next use overwrites it: dead after use
  store.schedule_set(&schedule);
  fill(store, a);
  fill(store, b);  // evicts a (dirty, live): one write
  const std::uint64_t w0 = store.stats().write_bytes;
  EXPECT_EQ(w0, f.units.bytes(a));
  for (int i = 0; i < 3; ++i) {  // read-only ping-pong: b written once when first evicted, then never
    EXPECT_TRUE(check(store, a));
    EXPECT_TRUE(check(store, b));
  }
  EXPECT_EQ(store.stats().write_bytes, w0 + f.units.bytes(b));
  store.schedule_at(2);
  float* p = store.acquire_view(g, Access::Overwrite).f32();
  p[0] = 1.0f;
  store.release_unit(g);
  const std::uint64_t w1 = store.stats().write_bytes;
  EXPECT_TRUE(check(store, a));  // evicts g: dead (next use overwrites), so not written
  EXPECT_EQ(store.stats().write_bytes, w1);
  store.schedule_set(nullptr);
}

// Invariant 2, instrumented: a long random walk over a real step schedule, from the training
// thread and a second thread at once, checking the held bytes after every operation.
TEST(TieredStore, BudgetNeverExceededAtAnyMoment) {
  Fixture f;
  const std::size_t budget = 4 * f.largest_unit();
  TieredSegmentStore store(f.units, f.options(budget));
  StepSchedule schedule(f.units.count());
  for (int u = 0; u < f.units.count(); ++u) schedule.group_add({{u, u % 3 == 0 ? Access::Read : Access::Update}});
  store.schedule_set(&schedule);
  std::atomic<bool> over{false};
  auto walk = [&](unsigned seed, bool move_schedule) {
    std::mt19937 gen(seed);
    for (int i = 0; i < 400; ++i) {
      const int u = static_cast<int>(gen() % f.units.count());
      if (move_schedule) store.schedule_at(u);
      float* p = store.acquire_view(u, gen() % 2 ? Access::Update : Access::Read).f32();
      if (store.stats().held_bytes > budget) over = true;
      // Both threads may hold the same unit at once, so they only read it (the executor never
      // has two writers on one unit; a test write here would be a data race of its own).
      volatile float sink = p[0];
      (void)sink;
      store.release_unit(u);
      const StoreStats s = store.stats();
      if (s.held_bytes > budget || s.peak_held_bytes > budget) over = true;
    }
  };
  std::thread other(walk, 2u, false);
  walk(1u, true);
  other.join();
  EXPECT_FALSE(over.load());
  EXPECT_LE(store.stats().peak_held_bytes, budget);
  store.schedule_set(nullptr);
}

void expect_error(const std::function<void()>& fn, std::initializer_list<const char*> words) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* w : words) EXPECT_NE(m.find(w), std::string::npos) << "missing '" << w << "' in: " << m;
  }
}

TEST(TieredStore, ClearErrorsForBadDirectoryAndTooLittleSpace) {
  Fixture f;
  TieredStoreOptions o = f.options(2 * f.largest_unit());
  o.offload_dir = f.dir.file("missing");
  expect_error([&] { TieredSegmentStore s(f.units, o); }, {"missing", "does not exist"});
  file_write_atomic(f.dir.file("plain"), std::string("x"));
  o.offload_dir = f.dir.file("plain");
  expect_error([&] { TieredSegmentStore s(f.units, o); }, {"plain", "not a directory"});
  o = f.options(2 * f.largest_unit());
  o.free_bytes_override = 4096;
  expect_error([&] { TieredSegmentStore s(f.units, o); }, {"free but this run needs at least", "KiB"});
  // A second store on the same directory is refused while the first one lives.
  TieredSegmentStore first(f.units, f.options(2 * f.largest_unit()));
  expect_error([&] { TieredSegmentStore s(f.units, f.options(2 * f.largest_unit())); }, {"another stratum run"});
}

// Note [zero sharding]: the units a rank never acquires (another rank's moments) have no files,
// count for neither the disk check nor whether the store streams, and acquiring one is a bug.
TEST(TieredStore, UnusedUnitsHaveNoFilesAndDoNotCount) {
  Fixture f;
  std::vector<bool> unused(static_cast<std::size_t>(f.units.count()), false);
  std::set<std::string> unused_files;
  int an_unused = -1;
  for (int u = 0; u < f.units.count(); ++u) {
    const SegmentKind kind = f.units.kind(u);
    if ((kind == SegmentKind::AdamM || kind == SegmentKind::AdamV) &&
        f.layout.segments()[f.units.segment(u)].role == SegmentRole::Layer) {
      unused[static_cast<std::size_t>(u)] = true;
      unused_files.insert(f.units.file_name(f.units.file(u)));
      an_unused = u;
    }
  }
  ASSERT_GE(an_unused, 0);
  const std::size_t used = f.units.used_bytes(unused);
  ASSERT_LT(used, f.units.total_bytes());
  EXPECT_EQ(f.units.used_file_bytes(unused), used);
  EXPECT_EQ(f.units.used_file_bytes({}), f.units.total_bytes());
  TieredStoreOptions o = f.options(used);  // room for every used unit, not for every unit
  o.free_bytes_override = f.units.used_file_bytes(unused);
  o.unused = unused;
  {
    TieredSegmentStore store(f.units, o);
    std::set<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(f.dir.path() + "/stratum-offload"))
      files.insert(entry.path().filename().string());
    EXPECT_EQ(files.size(), static_cast<std::size_t>(f.units.file_count()) - unused_files.size());
    for (const std::string& name : unused_files) EXPECT_EQ(files.count(name), 0u) << name;
    for (int u = 0; u < f.units.count(); ++u)
      if (!unused[static_cast<std::size_t>(u)]) fill(store, u);
    for (int u = 0; u < f.units.count(); ++u) {
      if (!unused[static_cast<std::size_t>(u)]) {
        EXPECT_TRUE(check(store, u)) << u;
      }
    }
    EXPECT_EQ(store.stats().write_bytes, 0u) << "everything it uses fits: nothing streams";
    EXPECT_EQ(store.stats().read_bytes, 0u);
    EXPECT_THROW(store.acquire_unit(an_unused, Access::Read), BugError);
  }
  o.unused.clear();  // every unit's files: more than the disk has
  expect_error([&] { TieredSegmentStore s(f.units, o); }, {"free but this run needs at least"});
}

TEST(TieredStore, IoFaultsSurfaceAsClearErrors) {
  struct Case {
    const char* spec;
    std::initializer_list<const char*> words;
  };
  const Case cases[] = {{"enospc@0", {"no space left", ".bin"}},
                        {"eio-write@0", {"I/O error", ".bin"}},
                        {"eio-read@0", {"I/O error", ".bin"}},
                        {"short-read@0", {"short read", ".bin"}},
                        {"flip@0", {"checksum mismatch", ".bin", "offset"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Fixture f;
    TieredStoreOptions o = f.options(f.largest_unit());
    o.io.fault = IoFaultPlan::parse(c.spec);
    TieredSegmentStore store(f.units, o);
    const int a = f.units.index(1, SegmentKind::Params), b = f.units.index(2, SegmentKind::Params);
    expect_error(
        [&] {
          fill(store, a);
          fill(store, b);  // evicts a: write
          check(store, a);  // evicts b, reads a back
        },
        c.words);
  }
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// The path taken where the file system refuses O_DIRECT (tmpfs before Linux 6.6): buffered I/O
// with the thread backend, said in describe(); data still comes back bit-identical.
TEST(TieredStore, BufferedFallbackRoundTripsAndSaysSo) {
  Fixture f;
  TieredStoreOptions o = f.options(3 * f.largest_unit());
  o.direct_io = false;
  TieredSegmentStore store(f.units, o);
  EXPECT_NE(store.describe().find("threads, buffered"), std::string::npos) << store.describe();
  EXPECT_NE(store.describe().find("refuses O_DIRECT"), std::string::npos) << store.describe();
  for (int u = 0; u < f.units.count(); ++u) fill(store, u);
  for (int u = 0; u < f.units.count(); ++u) EXPECT_TRUE(check(store, u)) << f.units.name(u);
  EXPECT_GT(store.stats().read_bytes, 0u);
}

}  // namespace
}  // namespace stratum
