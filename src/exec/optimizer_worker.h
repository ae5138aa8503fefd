// One background thread that runs queued jobs in order (the executor queues one AdamW update
// per segment as soon as that segment's gradients are final; Note [optimizer overlap]). Jobs
// never throw across the queue: the first error is kept and rethrown by wait_idle(); later jobs
// are skipped. Does not know what the jobs do.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace stratum {

class OptimizerWorker {
 public:
  OptimizerWorker();
  OptimizerWorker(const OptimizerWorker&) = delete;
  OptimizerWorker& operator=(const OptimizerWorker&) = delete;
  ~OptimizerWorker();  // finishes queued jobs, then joins

  // Queues a job; returns its number (1, 2, ...), for wait_done().
  long submit(std::function<void()> job);
  // Blocks until the queue is empty and no job runs; rethrows the first error (once).
  void wait_idle();
  // Blocks until jobs 1..job have finished; rethrows the first error (once).
  void wait_done(long job);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable work_ready_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false, stopping_ = false;
  long submitted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace stratum
