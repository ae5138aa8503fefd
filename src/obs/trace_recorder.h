// Chrome / Perfetto trace of a run (`stratum train --trace FILE.json`): complete events ("ph":"X")
// on named tracks (compute, optimizer, read I/O, write I/O), so a user sees what overlaps what.
// Thread-safe. Does not sample or aggregate.
// Note [streamed trace]: a run's trace (stream_to) goes to its file as the spans come, in Chrome's
// JSON Array Format ("[" then one event per line), written in whole events 64 KiB at a time, so
// its memory stays constant however long the run (before: every span was kept until the end,
// 563 MiB after 15k small steps) and a run that is killed leaves a file that chrome://tracing and
// Perfetto still open (the array's "]" is optional there); finish() closes the array. Without a
// file (the planner's timing, tests) spans are kept in memory, at most kMaxEvents (later ones
// are counted as dropped).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace stratum {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxEvents = 2'000'000;
  // kDevice, kDeviceIn, kDeviceOut: a device's own timeline (Note [device timeline] in
  // store/queue_span.h): its compute queue, its copies in and out.
  enum Track : int { kCompute = 1, kOptimizer = 2, kRead = 3, kWrite = 4, kDevice = 5, kDeviceIn = 6, kDeviceOut = 7 };

  TraceRecorder() : origin_(Clock::now()) {}
  // One span [start, end) named `name` (category `category`: "forward", "io", "stall", ...).
  // tag: what the span computes, for programs that read the spans back (the executor tags its
  // compute with the schedule group's GroupWork, which the planner times; -1 = untagged). The
  // name is for people only.
  void span(Track track, const char* category, std::string name, Clock::time_point start, Clock::time_point end,
            int tag = -1);
  // Streams every span from now on to `path` (created or truncated; Note [streamed trace]);
  // process: the name the viewer shows ("stratum train"). Throws Error naming the path when it
  // cannot be written. Spans recorded before are written first.
  void stream_to(const std::string& path, const char* process);
  // Writes the rest and closes the array; throws Error naming the path when any write failed (a
  // full disk). Called again (or never: the destructor closes quietly) it does nothing.
  void finish();
  ~TraceRecorder();
  // Writes the spans kept in memory as a JSON trace, atomically (file_write_atomic); throws
  // Error naming the path.
  void write(const std::string& path) const;
  std::size_t event_count() const;  // spans recorded (kept or streamed)

  struct Event {
    Track track;
    const char* category;
    std::string name;
    double ts_us, dur_us;
    int tag = -1;
  };
  // The spans kept in memory (none once streaming; the planner times the executor's phases with
  // them).
  std::vector<Event> events() const;

 private:
  static std::string event_json(const Event& e);
  static std::string header_json(const char* process);  // the metadata events naming the tracks
  void flush_locked();  // writes buffer_ to the file; records a failure in error_

  const Clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::size_t dropped_ = 0, recorded_ = 0;
  int fd_ = -1;              // streaming: the trace file
  std::string path_, buffer_, error_;
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
