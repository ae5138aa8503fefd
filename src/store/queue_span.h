// QueueSpan: a span of a device's own timeline in a --trace.
// Note [device timeline]: the training thread only queues a device's work; the trace's compute
// spans say when it queued them, not when the device ran them, and the copies' spans said when
// they were started. With a trace, the executor marks each schedule group on the device's compute
// queue and the device tier each copy on its direction's queue (Ops::queue_call): a span starts
// when the queue reaches its first mark (everything before it finished) and ends when it reaches
// the second, on the tracks "device compute", "device copies in" and "device copies out". A span
// therefore includes a wait its queue makes inside it (a copy waiting for its buffer's compute to
// finish; compute waiting for an upload). Where the device computes in host memory (the CPU
// backend) both marks run at once: the spans are empty. Each mark pauses its queue for a host
// callback (a few microseconds on an H200), so only --trace pays for them.
#pragma once

#include <string>
#include <utility>

#include "obs/trace_recorder.h"
#include "ops/ops.h"

namespace stratum {

class QueueSpan {
 public:
  // Marks the start on `queue` (nothing without a trace).
  QueueSpan(const Ops& ops, Ops::Queue queue, TraceRecorder* trace, TraceRecorder::Track track, const char* category,
            std::string name, int tag = -1)
      : ops_(ops), queue_(queue) {
    if (trace == nullptr) return;
    mark_ = new Mark{trace, track, category, std::move(name), tag, {}};
    ops_.queue_call(queue_, &QueueSpan::started, mark_);
  }
  // Marks the end: the span is recorded when the queue gets there.
  ~QueueSpan() {
    if (mark_ == nullptr) return;
    try {
      ops_.queue_call(queue_, &QueueSpan::ended, mark_);
    } catch (...) {  // the queue failed: its error is reported by the next call that waits on it
    }
  }
  QueueSpan(const QueueSpan&) = delete;
  QueueSpan& operator=(const QueueSpan&) = delete;

 private:
  struct Mark {
    TraceRecorder* trace;
    TraceRecorder::Track track;
    const char* category;
    std::string name;
    int tag;
    TraceRecorder::Clock::time_point start;
  };
  static void started(void* p) { static_cast<Mark*>(p)->start = TraceRecorder::Clock::now(); }
  static void ended(void* p) {
    Mark* const m = static_cast<Mark*>(p);
    m->trace->span(m->track, m->category, std::move(m->name), m->start, TraceRecorder::Clock::now(), m->tag);
    delete m;
  }
  const Ops& ops_;
  Ops::Queue queue_;
  Mark* mark_ = nullptr;
};

}  // namespace stratum
