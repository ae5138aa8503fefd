// OptimizerWorker; see optimizer_worker.h.
#include "exec/optimizer_worker.h"

#include <utility>

namespace stratum {

OptimizerWorker::OptimizerWorker() : thread_([this] { loop(); }) {}

OptimizerWorker::~OptimizerWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  thread_.join();
}

long OptimizerWorker::submit(std::function<void()> job) {
  long number = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    number = ++submitted_;
  }
  work_ready_.notify_all();
  return number;
}

void OptimizerWorker::wait_done(long job) {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this, job] { return finished_ >= job; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void OptimizerWorker::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void OptimizerWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping and drained
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    const bool skip = error_ != nullptr;
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    if (!skip) {
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
    }
    job = nullptr;  // destroy captured state outside the lock
    lock.lock();
    running_ = false;
    ++finished_;
    if (error && !error_) error_ = error;
    idle_.notify_all();
  }
}

}  // namespace stratum
