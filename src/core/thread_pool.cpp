// ThreadPool: static-partition parallel_for; see thread_pool.h and Note [deterministic partition].
#include "core/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "stratum/error.h"

namespace stratum {

ThreadPool::ThreadPool(int num_threads, int spin_us) : num_threads_(num_threads), spin_us_(spin_us) {
  STRATUM_CHECK(num_threads >= 1 && num_threads <= 1024, "[core.threads] thread count must be in 1..1024, got ",
                num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

namespace {
void range_of(std::size_t n, int ranges, int index, std::size_t* begin, std::size_t* end) {
  *begin = n * static_cast<std::size_t>(index) / static_cast<std::size_t>(ranges);
  *end = n * static_cast<std::size_t>(index + 1) / static_cast<std::size_t>(ranges);
}

// Polls done() for up to spin_us microseconds; true when it became true.
template <class Done>
bool spin_until(int spin_us, Done&& done) {
  if (spin_us <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}
}  // namespace

void ThreadPool::worker_loop(int index) {
  unsigned long seen = 0;
  for (;;) {
    const RangeFn* job = nullptr;
    std::size_t n = 0;
    int ranges = 0;
    spin_until(spin_us_, [&] { return published_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      ranges = job_ranges_;
    }
    if (index < ranges) {
      std::size_t begin = 0, end = 0;
      range_of(n, ranges, index, &begin, &end);
      try {
        if (begin < end) (*job)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::size_t n, const RangeFn& fn, std::size_t min_items_per_range) {
  if (n == 0) return;
  if (min_items_per_range == 0) min_items_per_range = 1;
  std::size_t max_ranges = n / min_items_per_range;
  int ranges = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(num_threads_),
                                                      std::max<std::size_t>(1, max_ranges)));
  if (ranges == 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_ranges_ = ranges;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  work_ready_.notify_all();
  std::exception_ptr local_error;
  std::size_t begin = 0, end = 0;
  range_of(n, ranges, 0, &begin, &end);
  try {
    if (begin < end) fn(begin, end);
  } catch (...) {
    local_error = std::current_exception();
  }
  spin_until(spin_us_, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (local_error) std::rethrow_exception(local_error);
  if (error_) std::rethrow_exception(error_);
}

int default_thread_count() {
  if (const char* env = std::getenv("STRATUM_THREADS")) {
    int n = std::atoi(env);
    STRATUM_CHECK(n >= 1 && n <= 1024, "[core.threads] STRATUM_THREADS must be in 1..1024, got '", env, "'");
    return n;
  }
  long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online >= 1 ? static_cast<int>(online) : 1;
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online >= 1 ? static_cast<int>(online) : 1;
}

}  // namespace stratum
