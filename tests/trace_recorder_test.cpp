// --trace: the Chrome/Perfetto trace has the four named tracks, block spans on the compute track,
// AdamW spans on the optimizer worker's, and I/O spans that overlap compute under a budget; an
// unwritable trace path fails before training with one clear line.
#include "obs/trace_recorder.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "exec/executor.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "train/trainer.h"

namespace stratum {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(TraceRecorder, WritesNamedTracksAndCompleteEvents) {
  testing::TempDir tmp;
  TraceRecorder trace;
  const auto t0 = TraceRecorder::Clock::now();
  trace.span(TraceRecorder::kCompute, "forward", "layer.0 forward", t0, t0 + std::chrono::milliseconds(2));
  trace.span(TraceRecorder::kRead, "io", "layer.1.params", t0 + std::chrono::milliseconds(1),
             t0 + std::chrono::milliseconds(3));
  trace.write(tmp.file("t.json"));
  const nlohmann::json doc = read_json(tmp.file("t.json"));
  std::map<int, std::string> names;
  std::vector<nlohmann::json> spans;
  for (const auto& e : doc) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X") spans.push_back(e);
  }
  EXPECT_EQ(names.size(), 7u);
  EXPECT_EQ(names[TraceRecorder::kRead], "I/O reads");
  EXPECT_EQ(names[TraceRecorder::kDeviceIn], "device copies in");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0]["name"], "layer.0 forward");
  EXPECT_NEAR(spans[0]["dur"].get<double>(), 2000.0, 1.0);
  EXPECT_NEAR(spans[1]["ts"].get<double>() - spans[0]["ts"].get<double>(), 1000.0, 1.0);
}

// Note [streamed trace]: a streamed trace keeps nothing in memory, reaches its file in whole
// events while the run goes on (a killed run's file opens with the array closed by the reader),
// and is one JSON array once finished.
TEST(TraceRecorder, StreamsWholeEventsToItsFileAndKeepsNothing) {
  testing::TempDir tmp;
  const std::string path = tmp.file("t.json");
  TraceRecorder trace;
  const auto t0 = TraceRecorder::Clock::now();
  trace.span(TraceRecorder::kCompute, "forward", "before streaming", t0, t0 + std::chrono::microseconds(5));
  trace.stream_to(path, "stratum test");
  constexpr int kSpans = 100000;
  for (int i = 0; i < kSpans; ++i)
    trace.span(TraceRecorder::kRead, "io", "layer." + std::to_string(i % 12) + ".params \"q\"", t0,
               t0 + std::chrono::microseconds(i));
  EXPECT_TRUE(trace.events().empty()) << "streamed spans are not kept";
  EXPECT_EQ(trace.event_count(), static_cast<std::size_t>(kSpans + 1));
  // Mid-run (as a killed run leaves it): whole events so far; closing the array makes it JSON.
  const std::string partial = file_read_all(path);
  ASSERT_GT(partial.size(), 1000000u) << "written as the spans came";
  const nlohmann::json cut = nlohmann::json::parse(partial + "\n]");
  EXPECT_GT(cut.size(), 9u);
  EXPECT_LT(cut.size(), static_cast<std::size_t>(kSpans + 10));
  trace.finish();
  trace.finish();  // a second finish does nothing
  const nlohmann::json doc = read_json(path);
  ASSERT_TRUE(doc.is_array());
  std::size_t spans = 0;
  std::string process;
  for (const auto& e : doc) {
    spans += e["ph"] == "X";
    if (e["ph"] == "M" && e["name"] == "process_name") process = e["args"]["name"];
  }
  EXPECT_EQ(spans, static_cast<std::size_t>(kSpans + 1));
  EXPECT_EQ(process, "stratum test");
  EXPECT_EQ(doc.back()["name"], "layer.3.params \"q\"");
  TraceRecorder unwritable;
  EXPECT_THROW(unwritable.stream_to("/nonexistent-dir/t.json", "x"), Error);
}

TEST(TraceRecorder, TrainingUnderABudgetShowsComputeOptimizerAndIoOverlapping) {
  testing::TempDir tmp;
  TrainOptions o;
  o.config.n_layer = 8;
  o.config.n_head = 4;
  o.config.n_embd = 128;
  o.config.n_ctx = 32;
  o.config.vocab_size = 1024;
  o.data_path = testing::write_random_tokens(tmp.file("tokens.bin"), 3000, 1024, 3);
  o.batch = 2;
  o.seq = 32;
  o.steps = 3;
  o.threads = 2;
  o.quiet = true;
  o.mem_budget_bytes = train_min_budget_bytes(o.config, o.batch, o.seq, 2, ActivationPolicy::Recompute, o.grad_clip);
  o.offload_dir = tmp.path();
  o.trace_path = tmp.file("trace.json");
  train_run(o);
  const nlohmann::json doc = read_json(o.trace_path);
  std::map<int, std::vector<std::pair<double, double>>> by_track;
  std::map<std::string, int> names;
  std::set<int> adamw_tracks;
  for (const auto& e : doc) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GE(ts, 0.0);
    EXPECT_GE(dur, 0.0);
    by_track[e["tid"].get<int>()].push_back({ts, ts + dur});
    ++names[e["name"].get<std::string>()];
    if (e["name"] == "layer.3 AdamW") adamw_tracks.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(names["layer.0 forward"], 3);
  EXPECT_EQ(names["layer.7 backward"], 3);
  EXPECT_EQ(names["wte.0 head log-sum-exp"], 3);
  EXPECT_EQ(names["wte.1 head backward"], 3);
  EXPECT_EQ(names["layer.3 AdamW"], 3);
  for (int track : {TraceRecorder::kCompute, TraceRecorder::kRead, TraceRecorder::kWrite})
    EXPECT_FALSE(by_track[track].empty()) << "track " << track;
  // The updates run on the worker's track where a CPU is spare, else on the training thread's
  // (Note [update thread] in exec/executor.h).
  const int updates = optimizer_worker_wanted(o.threads) ? TraceRecorder::kOptimizer : TraceRecorder::kCompute;
  EXPECT_EQ(adamw_tracks, std::set<int>{updates});
  EXPECT_EQ(by_track[TraceRecorder::kOptimizer].empty(), updates != TraceRecorder::kOptimizer);
  // Some read is in flight while a block computes: the overlap the trace is for.
  int overlaps = 0;
  for (const auto& r : by_track[TraceRecorder::kRead])
    for (const auto& c : by_track[TraceRecorder::kCompute]) overlaps += r.first < c.second && c.first < r.second;
  EXPECT_GT(overlaps, 0);
}

// Note [device timeline] (store/queue_span.h): a run on a device tier traces its copies in and
// out on their own tracks (here the CPU backend computing through the tier, as the tests'
// mirror store does: its queues run each mark at once). The tier was never given the trace.
TEST(TraceRecorder, TrainingOnADeviceTierShowsItsCopies) {
  testing::TempDir tmp;
  TrainOptions o;
  o.config.n_layer = 2;
  o.config.n_head = 2;
  o.config.n_embd = 32;
  o.config.n_ctx = 16;
  o.config.vocab_size = 256;
  o.data_path = testing::write_random_tokens(tmp.file("tokens.bin"), 2000, 256, 4);
  o.batch = 2;
  o.seq = 16;
  o.steps = 2;
  o.threads = 1;
  o.quiet = true;
  o.mirror_store = true;
  o.gpu_mem_budget_bytes = std::size_t{1} << 30;
  o.gpu_mem_budget_bytes = train_run(o).min_budget_bytes;
  o.trace_path = tmp.file("trace.json");
  train_run(o);
  std::map<int, int> spans;
  for (const auto& e : read_json(o.trace_path))
    if (e["ph"] == "X") ++spans[e["tid"].get<int>()];
  EXPECT_GT(spans[TraceRecorder::kDeviceIn], 0);
  EXPECT_GT(spans[TraceRecorder::kDeviceOut], 0);
  EXPECT_EQ(spans[TraceRecorder::kDevice], 0) << "the CPU computes in host memory: no device timeline";
}

TEST(TraceRecorder, UnwritablePathFailsBeforeTraining) {
  const auto r = testing::run_stratum("train --layers 1 --heads 1 --embd 8 --ctx 8 --vocab 128 --data " +
                                      testing::source_path("tests/golden/tiny_gpt2/tokens.bin") +
                                      " --steps 1 --seq 8 --batch 1 --quiet --trace /nonexistent-dir/t.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("/nonexistent-dir/t.json"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("trained"), std::string::npos) << r.errors;
}

}  // namespace
}  // namespace stratum
