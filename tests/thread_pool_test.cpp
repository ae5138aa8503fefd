// ThreadPool: the static partition (Note [deterministic partition]), exceptions, reuse.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "stratum/error.h"

namespace stratum {
namespace {

TEST(ThreadPool, SplitsIntoContiguousOrderedRangesCoveringEverything) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (std::size_t n : {1u, 2u, 5u, 64u, 1001u}) {
      std::mutex mutex;
      std::vector<std::pair<std::size_t, std::size_t>> ranges;
      pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
        std::lock_guard<std::mutex> lock(mutex);
        ranges.emplace_back(b, e);
      });
      std::sort(ranges.begin(), ranges.end());
      ASSERT_FALSE(ranges.empty());
      EXPECT_LE(ranges.size(), static_cast<std::size_t>(threads));
      EXPECT_EQ(ranges.front().first, 0u);
      EXPECT_EQ(ranges.back().second, n);
      for (std::size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
    }
  }
}

TEST(ThreadPool, SmallLoopsStayOnOneRange) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  pool.parallel_for(10, [&](std::size_t b, std::size_t e) {
    ++calls;
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(e, 10u);
  }, 100);
  EXPECT_EQ(calls.load(), 1);
}

TEST(ThreadPool, RethrowsAWorkersExceptionAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(300, [&](std::size_t b, std::size_t) {
    if (b > 0) throw Error("[test] boom");
  }), Error);
  std::atomic<std::size_t> total{0};
  for (int round = 0; round < 200; ++round)
    pool.parallel_for(1000, [&](std::size_t b, std::size_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 200u * 1000u);
}

// Spinning workers (decoding's pool): back-to-back jobs each see every element exactly once and
// the previous job's writes; a job after a pause longer than the spin (workers asleep again)
// still runs; exceptions still propagate.
TEST(ThreadPool, SpinningPoolRunsBackToBackJobsExactly) {
  ThreadPool pool(3, 200);
  std::vector<int> data(999, 0);
  for (int round = 1; round <= 2000; ++round) {
    pool.parallel_for(data.size(), [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) data[i] += 1;
    });
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int v : data) ASSERT_EQ(v, 2000);
  EXPECT_THROW(pool.parallel_for(300, [&](std::size_t b, std::size_t) {
    if (b > 0) throw Error("[test] boom");
  }), Error);
  std::atomic<std::size_t> total{0};
  pool.parallel_for(1000, [&](std::size_t b, std::size_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 1000u);
}

TEST(ThreadPool, RejectsBadThreadCounts) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(100000), Error);
}

}  // namespace
}  // namespace stratum
