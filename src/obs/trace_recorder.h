// Chrome / Perfetto trace of a run (`stratum train --trace FILE.json`): complete events ("ph":"X")
// on named tracks (compute, optimizer, read I/O, write I/O), so a user sees what overlaps what.
// Thread-safe; keeps at most kMaxEvents events (later ones are counted as dropped and the count
// is written into the file's metadata). Does not sample or aggregate.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace stratum {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxEvents = 2'000'000;
  enum Track : int { kCompute = 1, kOptimizer = 2, kRead = 3, kWrite = 4 };

  TraceRecorder() : origin_(Clock::now()) {}
  // One span [start, end) named `name` (category `category`: "forward", "io", "stall", ...).
  // tag: what the span computes, for programs that read the spans back (the executor tags its
  // compute with the schedule group's GroupWork, which the planner times; -1 = untagged). The
  // name is for people only.
  void span(Track track, const char* category, std::string name, Clock::time_point start, Clock::time_point end,
            int tag = -1);
  // Writes the JSON trace atomically (file_write_atomic); throws Error naming the path.
  void write(const std::string& path) const;
  std::size_t event_count() const;

  struct Event {
    Track track;
    const char* category;
    std::string name;
    double ts_us, dur_us;
    int tag = -1;
  };
  // The spans recorded so far (the planner times the executor's phases with them).
  std::vector<Event> events() const;

 private:
  const Clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::size_t dropped_ = 0;
};

// Records [construction, destruction) as one span when the recorder is not null.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* recorder, TraceRecorder::Track track, const char* category, std::string name,
            int tag = -1)
      : recorder_(recorder), track_(track), category_(category), name_(std::move(name)), tag_(tag),
        start_(recorder ? TraceRecorder::Clock::now() : TraceRecorder::Clock::time_point{}) {}
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  ~TraceSpan() {
    if (recorder_ != nullptr)
      recorder_->span(track_, category_, std::move(name_), start_, TraceRecorder::Clock::now(), tag_);
  }

 private:
  TraceRecorder* recorder_;
  TraceRecorder::Track track_;
  const char* category_;
  std::string name_;
  int tag_;
  TraceRecorder::Clock::time_point start_;
};

}  // namespace stratum
