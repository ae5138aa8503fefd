// TraceRecorder; see trace_recorder.h. Writes Chrome's Trace Event Format (JSON object with
// "traceEvents"; complete events "X" with microsecond ts/dur, metadata "M" naming the tracks),
// which chrome://tracing and ui.perfetto.dev open.
#include "obs/trace_recorder.h"

#include <nlohmann/json.hpp>

#include "core/file_util.h"

namespace stratum {

void TraceRecorder::span(Track track, const char* category, std::string name, Clock::time_point start,
                         Clock::time_point end, int tag) {
  const double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back({track, category, std::move(name), ts, dur < 0 ? 0.0 : dur, tag});
}

std::size_t TraceRecorder::event_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::vector<TraceRecorder::Event> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void TraceRecorder::write(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  const std::pair<Track, const char*> tracks[] = {
      {kCompute, "compute (training thread)"}, {kOptimizer, "optimizer worker"}, {kRead, "I/O reads"}, {kWrite, "I/O writes"}};
  for (const auto& [track, name] : tracks) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", static_cast<int>(track)},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", static_cast<int>(track)},
                      {"args", {{"sort_index", static_cast<int>(track)}}}});
  }
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "stratum train"}}}});
  std::size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped = dropped_;
    for (const Event& e : events_)
      events.push_back({{"ph", "X"}, {"name", e.name}, {"cat", e.category}, {"pid", 1},
                        {"tid", static_cast<int>(e.track)}, {"ts", e.ts_us}, {"dur", e.dur_us}});
  }
  const nlohmann::json doc = {{"traceEvents", std::move(events)},
                              {"displayTimeUnit", "ms"},
                              {"otherData", {{"dropped_events", dropped}}}};
  file_write_atomic(path, doc.dump());
}

}  // namespace stratum
