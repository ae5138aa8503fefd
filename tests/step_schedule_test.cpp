// Note [one schedule]: the step schedule is the single source of a step's order. The executor
// runs it (every unit it touches is listed by the group it is in), the eviction policy the store
// and the planner share reads it, and the minimum budget derived from it is enough to train in
// every optimizer mode with the same bits as in RAM.
#include "store/step_schedule.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <thread>

#include "data/token_file.h"
#include "exec/executor.h"
#include "integration_util.h"
#include "kernels/cpu/matmul.h"
#include "store/eviction_policy.h"
#include "store/tiered_segment_store.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using testing::source_path;

// Four units over four groups (the policy reads only the schedule, not the units' sizes).
StepSchedule four_group_schedule() {
  StepSchedule s(4);
  s.group_add({{0, Access::Read}, {1, Access::Overwrite}});  // 0
  s.group_add({{2, Access::Read}});                          // 1
  s.group_add({{1, Access::Read}, {3, Access::Update}});     // 2
  s.group_add({{0, Access::Read}});                          // 3
  return s;
}

TEST(EvictionPolicy, DistancesCountFromTheNextGroupOnceTheRunningGroupUsedAUnit) {
  const StepSchedule schedule = four_group_schedule();
  EvictionPolicy policy(4);
  EXPECT_EQ(policy.distance(0), StepSchedule::kNever) << "no schedule: no known future";
  EXPECT_FALSE(policy.dead(1));
  policy.schedule_set(&schedule);
  policy.at(0);
  EXPECT_EQ(policy.distance(0), 0);
  EXPECT_EQ(policy.distance(2), 1);
  EXPECT_EQ(policy.next_access(1), Access::Overwrite);
  EXPECT_TRUE(policy.dead(1)) << "its next use overwrites it";
  policy.used(1);  // group 0 overwrote unit 1 and released it: group 2 reads what it holds
  EXPECT_EQ(policy.distance(1), 2);
  EXPECT_FALSE(policy.dead(1)) << "a just-written unit is not dead because the running group overwrote it";
  policy.used(0);
  EXPECT_EQ(policy.distance(0), 3) << "group 0 used it; group 3 is next";
  // Farthest next use first (unit 0 at 3; units 1 and 3 at 2: the first wins a tie); units needed
  // sooner than the bound are never taken.
  auto all = [](int) { return true; };
  EXPECT_EQ(policy.victim(-1, all), 0);
  EXPECT_EQ(policy.victim(-1, [](int u) { return u != 0; }), 1);
  EXPECT_EQ(policy.victim(2, all), 0);
  EXPECT_EQ(policy.victim(3, all), -1);
  policy.at(1);  // a new group: what group 0 used counts from here again
  EXPECT_EQ(policy.distance(0), 2);
  policy.at(3);
  policy.used(0);
  EXPECT_EQ(policy.distance(0), 1) << "wraps into the next step: its group 0 comes next";
  // Write-behind: a dirty unit released beyond the prefetch window.
  policy.at(0);
  policy.used(1);
  EXPECT_TRUE(policy.write_behind(1, 0));
  EXPECT_FALSE(policy.write_behind(1, 1));
}

// Note [done ahead]: a consumer ahead of the position (the optimizer worker under exact
// clipping) marks the uses it made; until the position passes that group, its units count from
// the group after it, so updated moments are far and updated parameters near.
TEST(EvictionPolicy, UsesMadeAheadOfThePositionCountFromTheGroupAfterThem) {
  StepSchedule s(3);
  s.group_add({{0, Access::Read}});                            // 0: the position
  s.group_add({{1, Access::Update}, {2, Access::Update}});     // 1: an update (params 1, moment 2)
  s.group_add({{1, Access::Read}});                            // 2: the forward reads the params
  s.group_add({{0, Access::Read}});                            // 3
  s.group_add({{0, Access::Read}});                            // 4
  EvictionPolicy policy(3);
  policy.schedule_set(&s);
  policy.at(0);
  EXPECT_EQ(policy.distance(1), 1);
  EXPECT_EQ(policy.distance(2), 1) << "before the mark the moment looks as near as the params";
  policy.done_ahead(1, 1);
  policy.done_ahead(2, 1);
  EXPECT_TRUE(policy.done_ahead_in(2, 1));
  EXPECT_FALSE(policy.done_ahead_in(2, 2));
  EXPECT_EQ(policy.distance(1), 2) << "the forward at group 2";
  EXPECT_EQ(policy.distance(2), 6) << "the next step's group 1";
  EXPECT_EQ(policy.victim(-1, [](int u) { return u != 0; }), 2);
  EXPECT_TRUE(policy.write_behind(2, 1));
  EXPECT_FALSE(policy.write_behind(1, 1));
  EXPECT_FALSE(policy.dead(2));
  policy.at(1);  // at the marked group: still made
  EXPECT_EQ(policy.distance(1), 1);
  EXPECT_EQ(policy.distance(2), 5);
  policy.at(2);  // passed: forgotten, the plain rule gives the same next uses
  EXPECT_FALSE(policy.done_ahead_in(2, 1));
  EXPECT_EQ(policy.distance(1), 0);
  EXPECT_EQ(policy.distance(2), 4);
  policy.done_ahead(2, 1);  // marked again past the position, the way round the schedule...
  policy.at(4);
  policy.at(0);  // ...and passed when the position wraps over it
  EXPECT_TRUE(policy.done_ahead_in(2, 1));
  policy.at(2);
  EXPECT_FALSE(policy.done_ahead_in(2, 1));
  policy.done_ahead(2, 3);
  policy.schedule_set(&s);  // a new schedule forgets every mark
  EXPECT_FALSE(policy.done_ahead_in(2, 3));
}

// Note [owed uses]: with --grad-clip 0 the optimizer worker runs behind the position. A unit pinned
// for a use the position has passed counts as needed next (distance 1), so the backward's room
// goes to units needed later instead of to the worker's chunks; a pin whose use is still ahead
// changes no distance; pinned units are never dead; unpinned, the plain rule again.
TEST(EvictionPolicy, UnitsOwedToAConsumerBehindThePositionCountAsNeededNext) {
  StepSchedule s(4);
  s.group_add({{0, Access::Update}, {1, Access::Read}});  // 0: layer 1's update (params 0, grads 1)
  s.group_add({{2, Access::Read}});                       // 1: the position: layer 0's backward
  s.group_add({{2, Access::Read}});                       // 2
  s.group_add({{3, Access::Read}});                       // 3
  s.group_add({{1, Access::Overwrite}});                  // 4: the next step's backward writes grads
  s.group_add({{0, Access::Read}});                       // 5: the next forward reads params
  EvictionPolicy policy(4);
  policy.schedule_set(&s);
  policy.at(1);
  auto all = [](int) { return true; };
  EXPECT_EQ(policy.distance(0), 4);
  EXPECT_TRUE(policy.dead(1)) << "unpinned, the gradients' next use overwrites them";
  EXPECT_EQ(policy.victim(-1, all), 0) << "the plain rule evicts the worker's params first";
  policy.pin(0, 0, +1);
  policy.pin(1, 0, +1);
  EXPECT_EQ(policy.distance(0), 1) << "owed to the worker behind the position: needed next";
  EXPECT_EQ(policy.distance(1), 1);
  EXPECT_FALSE(policy.dead(1)) << "the worker still reads the gradients";
  EXPECT_EQ(policy.victim(-1, all), 3) << "the unit needed at group 3 goes before the owed ones";
  policy.pin(0, 0, +1);  // pinned twice (two consumers): one unpin keeps it owed
  policy.pin(0, 0, -1);
  EXPECT_EQ(policy.distance(0), 1);
  policy.pin(0, 0, -1);
  policy.pin(1, 0, -1);
  EXPECT_EQ(policy.distance(0), 4) << "made: the next forward again";
  EXPECT_TRUE(policy.dead(1));
  // A pin whose use is still ahead of the position (under exact clipping the worker runs ahead):
  // the distance to that use, unchanged.
  policy.at(5);
  policy.pin(1, 0, +1);
  EXPECT_EQ(policy.distance(1), 1) << "group 0 is next after group 5";
  policy.pin(3, 3, +1);
  EXPECT_EQ(policy.distance(3), 4);
}

TEST(StepSchedule, MinimumBytesAreTheLargestHoldPlusAnUpdateBesideTheWorkersGroups) {
  const GptConfig cfg = model_read_config(source_path("tests/golden/tiny_gpt2"));
  const ParamLayout layout = ParamLayout::of(cfg);
  const UnitTable units(layout, 4096);
  StepSchedule s(units.count());
  const int l0 = layout.layer_segment(0), l1 = layout.layer_segment(1);
  auto bytes = [&](int u) { return units.bytes(u); };
  const int p0 = units.index(l0, SegmentKind::Params), a0 = units.index(l0, SegmentKind::Activations);
  const int p1 = units.index(l1, SegmentKind::Params);
  auto opt = [&](int seg) {
    std::vector<UnitUse> uses;
    for (int c = 0; c < units.chunk_count(seg, SegmentKind::Params); ++c)
      for (SegmentKind k : {SegmentKind::Params, SegmentKind::Grads, SegmentKind::AdamM, SegmentKind::AdamV})
        uses.push_back({units.index(seg, k, c), k == SegmentKind::Grads ? Access::Read : Access::Update});
    return uses;
  };
  s.group_add({{p0, Access::Read}, {a0, Access::Read}, {p0, Access::Read}}, GroupWork::LayerForward);  // p0 once
  s.group_add(opt(l1), GroupWork::Optimizer, l1);
  s.group_add({{p1, Access::Read}}, GroupWork::LayerForward);
  s.group_add(opt(l0), GroupWork::Optimizer, l0);
  std::size_t update = 0;
  for (int seg : {l0, l1})
    for (int c = 0; c < units.chunk_count(seg, SegmentKind::Params); ++c) {
      std::size_t chunk = 0;
      for (SegmentKind k : {SegmentKind::Params, SegmentKind::Grads, SegmentKind::AdamM, SegmentKind::AdamV})
        chunk += bytes(units.index(seg, k, c));
      update = std::max(update, chunk);
    }
  const std::size_t first = bytes(p0) + bytes(a0);
  EXPECT_EQ(schedule_min_bytes(s, units, false), std::max(first, update));
  // With a worker, the update runs beside group 2 only (between the first and last update).
  EXPECT_EQ(schedule_min_bytes(s, units, true), std::max({first, update, bytes(p1) + update}));
}

// A store that checks every acquire against the schedule group the executor said it is running.
class ScheduleCheckingStore final : public SegmentStore {
 public:
  explicit ScheduleCheckingStore(const UnitTable& units) : SegmentStore(units), inner_(units) {}
  void* acquire_unit(int unit, Access access) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::this_thread::get_id() == training_) {
      EXPECT_NE(schedule_, nullptr);
      bool listed = false;
      if (schedule_ != nullptr)
        for (const UnitUse& use : schedule_->group(now_)) listed = listed || (use.unit == unit && use.access == access);
      EXPECT_TRUE(listed) << units().name(unit) << " acquired in group " << now_ << ", which does not list it";
    } else {  // the optimizer worker: some Optimizer group lists it
      bool listed = false;
      for (int g = 0; g < schedule_->group_count(); ++g)
        if (schedule_->group_work(g) == GroupWork::Optimizer)
          for (const UnitUse& use : schedule_->group(g)) listed = listed || (use.unit == unit && use.access == access);
      EXPECT_TRUE(listed) << units().name(unit) << " acquired by the worker outside every update group";
      ++worker_acquires_;
    }
    return inner_.acquire_unit(unit, access);
  }
  void release_unit(int unit) override { inner_.release_unit(unit); }
  void schedule_set(const StepSchedule* schedule) override {
    std::lock_guard<std::mutex> lock(mutex_);
    schedule_ = schedule;
  }
  void schedule_at(int group) override {
    std::lock_guard<std::mutex> lock(mutex_);
    now_ = group;
    visits_.push_back(group);
  }
  StoreStats stats() const override { return inner_.stats(); }
  void stats_reset_peak() override {}
  std::vector<int> visits_take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(visits_, {});
  }
  int worker_acquires() const { return worker_acquires_; }
  RamSegmentStore& inner() { return inner_; }

 private:
  RamSegmentStore inner_;
  std::mutex mutex_;
  const StepSchedule* schedule_ = nullptr;
  int now_ = 0;
  std::vector<int> visits_;
  std::thread::id training_ = std::this_thread::get_id();
  int worker_acquires_ = 0;
};

struct TinyRun {
  std::string dir;
  GptConfig cfg;
  ParamLayout layout;
  std::vector<std::int32_t> tokens;
  static constexpr int B = 2, T = 16;
  explicit TinyRun(const std::string& golden)
      : dir(source_path(golden)), cfg(model_read_config(dir)), layout(ParamLayout::of(cfg)),
        tokens(token_file_read(dir + "/tokens.bin").tokens) {}
  const std::int32_t* inputs(int step) const { return tokens.data() + step; }
  const std::int32_t* targets(int step) const { return tokens.data() + step + 1; }
};

TEST(ScheduleRun, EveryUnitTheExecutorTouchesIsListedByTheGroupItRuns) {
  blas_set_threads(1);
  for (const char* golden : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama"}) {
    const TinyRun t(golden);
    for (OptimizerMode mode : {OptimizerMode::Inline, OptimizerMode::Overlapped, OptimizerMode::Pipelined}) {
      for (const bool worker : {true, false}) {
        if (mode == OptimizerMode::Inline && worker) continue;
        SCOPED_TRACE(std::string(golden) + " " + optimizer_mode_name(mode) + (worker ? " on the worker" : ""));
        const UnitTable units(t.layout, Executor::activation_unit_floats(t.cfg, t.B, t.T));
        ScheduleCheckingStore store(units);
        model_load_weights(t.dir, t.layout, store.inner());
        ThreadPool pool(2);
        Executor exec(pool, t.cfg, units, t.B, t.T, ActivationPolicy::Recompute, mode);
        if (mode != OptimizerMode::Inline) exec.optimizer_worker_set(worker);  // Note [update thread]
        exec.attach(store);
        std::vector<int> every(static_cast<std::size_t>(exec.schedule().group_count())), always;
        std::iota(every.begin(), every.end(), 0);
        for (int g : every)
          if (!exec.schedule().group_optional(g)) always.push_back(g);
        EXPECT_EQ(always.size() < every.size(), mode == OptimizerMode::Pipelined) << "Note [embedding rows ahead]";
        const double clip = mode == OptimizerMode::Overlapped ? 0.0 : 1.0;
        for (int step = 0; step < 3; ++step) {
          const Executor::InputsAhead ahead = [&](int k, std::int32_t* next, std::size_t) {
            std::copy(t.inputs(step + k), t.inputs(step + k) + t.B * t.T, next);
            return true;
          };
          exec.train_step(t.inputs(step), t.targets(step), t.B, t.T, AdamWHyper{1e-3, 0.9, 0.95, 1e-8, step + 1}, 0.1,
                          clip, ahead);
          // The first step has no rows ahead: it runs the optional groups too (Note [optional groups]).
          EXPECT_EQ(store.visits_take(), step == 0 ? every : always)
              << "a training step runs its groups once, in order";
          if (mode == OptimizerMode::Pipelined && step == 1) {
            exec.sync();
            // Without a worker, sync runs the updates the next forward would, each at its group.
            std::vector<int> updates;
            if (!worker)
              for (int g : always)
                if (exec.schedule().group_work(g) == GroupWork::Optimizer) updates.push_back(g);
            EXPECT_EQ(store.visits_take(), updates);
          }
        }
        exec.loss(t.inputs(0), t.targets(0), t.B, t.T);
        std::vector<float> logits(static_cast<std::size_t>(t.cfg.vocab_size));
        exec.logits_last(t.inputs(0), t.T, logits.data());
        exec.sync();
        EXPECT_EQ(store.worker_acquires() > 0, worker);
      }
    }
  }
}

// The budget derived from the schedule runs a tiered store at exactly that size, in every mode
// and at prefetch depths 0 and 3, with the bits of the same mode in RAM.
TEST(ScheduleRun, MinimumBudgetTrainsInEveryModeWithTheBitsOfRam) {
  blas_set_threads(1);
  for (const char* golden : {"tests/golden/tiny_gpt2", "tests/golden/tiny_llama"}) {
    const TinyRun t(golden);
    const UnitTable units(t.layout, Executor::activation_unit_floats(t.cfg, t.B, t.T));
    for (OptimizerMode mode : {OptimizerMode::Inline, OptimizerMode::Overlapped, OptimizerMode::Pipelined}) {
      for (const bool worker : {true, false}) {
        if (mode == OptimizerMode::Inline && worker) continue;
        const double clip = mode == OptimizerMode::Overlapped ? 0.0 : 1.0;
        auto run = [&](int depth) {  // depth -1: in RAM
          SCOPED_TRACE(std::string(golden) + " " + optimizer_mode_name(mode) + " prefetch " + std::to_string(depth) +
                       (worker ? " on the worker" : ""));
          testing::TempDir tmp;
          std::unique_ptr<SegmentStore> store;  // outlives the executor
          ThreadPool pool(2);
          Executor exec(pool, t.cfg, units, t.B, t.T, ActivationPolicy::Recompute, mode);
          if (mode != OptimizerMode::Inline) exec.optimizer_worker_set(worker);  // Note [update thread]
          store = testing::store_in_ram_or_under(units, depth, exec.min_store_bytes(), tmp.path());
          model_load_weights(t.dir, t.layout, *store);
          exec.attach(*store);
          for (int step = 0; step < 3; ++step)
            exec.train_step(t.inputs(step), t.targets(step), t.B, t.T, AdamWHyper{1e-3, 0.9, 0.95, 1e-8, step + 1}, 0.1,
                            clip);
          exec.sync();
          const std::uint64_t hash = model_params_hash(t.layout, *store);
          if (depth >= 0) {
            EXPECT_LE(store->stats().peak_held_bytes, exec.min_store_bytes());
            EXPECT_GT(store->stats().read_bytes, 0u) << "the minimum streams";
          }
          return hash;
        };
        const std::uint64_t ram = run(-1);
        EXPECT_EQ(run(0), ram) << golden << " " << optimizer_mode_name(mode) << (worker ? " on the worker" : "");
        EXPECT_EQ(run(3), ram) << golden << " " << optimizer_mode_name(mode) << (worker ? " on the worker" : "");
      }
    }
  }
}

}  // namespace
}  // namespace stratum
