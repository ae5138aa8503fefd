// Fixed-size worker pool with a static, contiguous work partition.
// Note [deterministic partition]: parallel_for splits [0, n) into `num_threads()` contiguous
// ranges in order; kernels are written so that every output element is produced by exactly one
// call and every reduction runs in a fixed sequential order inside it, so results do not depend
// on the thread count. Does not do work stealing, nesting or async tasks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stratum {

class ThreadPool {
 public:
  using RangeFn = std::function<void(std::size_t begin, std::size_t end)>;

  // num_threads >= 1; the caller is worker 0. spin_us > 0: a worker that finished a job polls
  // for the next one that long before sleeping, and the caller polls for the workers to finish
  // before sleeping, so back-to-back small jobs (decoding: ~300 per token) do not pay a futex
  // wake-up each (40-70 us on our VMs). 0 (the default) sleeps at once, leaving the cores to
  // BLAS threads between jobs.
  explicit ThreadPool(int num_threads, int spin_us = 0);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int num_threads() const { return num_threads_; }
  // Runs fn on [0, n) split into num_threads() contiguous ranges; blocks until all finish;
  // rethrows the first exception a range threw. Ranges smaller than min_items_per_range are
  // merged so tiny loops stay on the calling thread.
  void parallel_for(std::size_t n, const RangeFn& fn, std::size_t min_items_per_range = 1);

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const RangeFn* job_ = nullptr;
  std::size_t job_n_ = 0;
  int job_ranges_ = 0;
  unsigned long generation_ = 0;
  std::atomic<unsigned long> published_{0};  // generation_, readable without the lock (spinning)
  std::atomic<int> pending_{0};              // written under the lock, polled without it
  int spin_us_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

// STRATUM_THREADS if set, else the number of online CPUs.
int default_thread_count();

// The CPUs this process may run on (its affinity mask: taskset, a cgroup's cpuset), else the
// online CPUs.
int usable_cpu_count();

}  // namespace stratum
