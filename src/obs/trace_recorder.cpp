// TraceRecorder; see trace_recorder.h and Note [streamed trace]. Writes Chrome's Trace Event
// Format, JSON Array Format: complete events "X" with microsecond ts/dur and metadata "M" events
// naming the tracks, which chrome://tracing and ui.perfetto.dev open.
#include "obs/trace_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "stratum/error.h"

namespace stratum {

namespace {
constexpr std::size_t kFlushBytes = 64 * 1024;
}  // namespace

std::string TraceRecorder::event_json(const Event& e) {
  const nlohmann::json j = {{"ph", "X"},  {"name", e.name},  {"cat", e.category}, {"pid", 1},
                            {"tid", static_cast<int>(e.track)}, {"ts", e.ts_us}, {"dur", e.dur_us}};
  return j.dump();
}

std::string TraceRecorder::header_json(const char* process) {
  std::string out;
  auto add = [&](const nlohmann::json& j) {
    out += out.empty() ? "[\n" : ",\n";
    out += j.dump();
  };
  const std::pair<Track, const char*> tracks[] = {
      {kCompute, "compute (training thread)"}, {kOptimizer, "optimizer worker"}, {kRead, "I/O reads"},
      {kWrite, "I/O writes"}, {kDevice, "device compute"}, {kDeviceIn, "device copies in"},
      {kDeviceOut, "device copies out"}};
  for (const auto& [track, name] : tracks) {
    add({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", static_cast<int>(track)}, {"args", {{"name", name}}}});
    add({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", static_cast<int>(track)},
         {"args", {{"sort_index", static_cast<int>(track)}}}});
  }
  add({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", process}}}});
  return out;
}

void TraceRecorder::span(Track track, const char* category, std::string name, Clock::time_point start,
                         Clock::time_point end, int tag) {
  const double ts = std::chrono::duration<double, std::micro>(start - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - start).count();
  Event e{track, category, std::move(name), ts, dur < 0 ? 0.0 : dur, tag};
  std::lock_guard<std::mutex> lock(mutex_);
  ++recorded_;
  if (fd_ >= 0) {
    buffer_ += ",\n";
    buffer_ += event_json(e);
    if (buffer_.size() >= kFlushBytes) flush_locked();
    return;
  }
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void TraceRecorder::flush_locked() {
  if (fd_ < 0 || buffer_.empty()) return;
  if (error_.empty()) {
    std::size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = std::strerror(n < 0 ? errno : EIO);
        break;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  buffer_.clear();
}

namespace {
// A file --trace may replace: none yet, an empty one, or a Stratum trace (it starts as
// header_json does: its first line is the same for every process). Anything else is somebody's
// file (a checkpoint's weights, an input), never truncated.
void check_replaceable(const std::string& path, const std::string& header) {
  STRATUM_CHECK(!file_is_special(path), "[trace] --trace '", path, "' is a device, pipe or socket; give a file path");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // none yet (or unreadable: the open for writing says why)
  const std::string first = header.substr(0, header.find('\n', 2) + 1);
  std::string have(first.size(), '\0');
  const ssize_t n = ::read(fd, have.data(), have.size());
  ::close(fd);
  STRATUM_CHECK(n <= 0 || (static_cast<std::size_t>(n) == first.size() && have == first), "[trace] --trace '", path,
                "' exists and is not a Stratum trace; choose another path (or remove it)");
}
}  // namespace

void TraceRecorder::stream_to(const std::string& path, const char* process) {
  std::lock_guard<std::mutex> lock(mutex_);
  STRATUM_ASSERT(fd_ < 0);
  check_replaceable(path, header_json(process));
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATUM_CHECK(fd_ >= 0, "[trace] cannot write --trace '", path, "': ", std::strerror(errno),
                "; choose another path");
  path_ = path;
  buffer_ = header_json(process);
  for (const Event& e : events_) buffer_ += ",\n" + event_json(e);
  events_.clear();
  events_.shrink_to_fit();
  flush_locked();
  STRATUM_CHECK(error_.empty(), "[trace] cannot write '", path, "': ", error_);
}

void TraceRecorder::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  buffer_ += "\n]\n";
  flush_locked();
  if (::close(fd_) != 0 && error_.empty()) error_ = std::strerror(errno);
  fd_ = -1;
  STRATUM_CHECK(error_.empty(), "[trace] writing '", path_, "' failed: ", error_,
                "; the trace is incomplete (free space or choose another --trace path)");
}

TraceRecorder::~TraceRecorder() {
  try {
    finish();
  } catch (...) {  // the run already reported (or will report) its own outcome
  }
}

std::size_t TraceRecorder::event_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_ - dropped_;
}

std::vector<TraceRecorder::Event> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void TraceRecorder::write(const std::string& path) const {
  std::string out = header_json("stratum");
  check_replaceable(path, out);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Event& e : events_) out += ",\n" + event_json(e);
    if (dropped_ > 0)
      out += ",\n" + nlohmann::json({{"ph", "M"}, {"name", "dropped_events"}, {"pid", 1}, {"args", {{"count", dropped_}}}})
                         .dump();
  }
  out += "\n]\n";
  file_write_atomic(path, out);
}

}  // namespace stratum
