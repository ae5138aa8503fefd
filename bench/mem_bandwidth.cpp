// Memory read bandwidth: allocates a --mib buffer of floats, writes it (so every page is real,
// not the shared zero page), then --reps times has --threads std::threads each sum their own
// contiguous share with 8 independent accumulators (a loop the compiler vectorizes; far faster
// than DRAM, so the loads are the limit). Prints one JSON line: best and median GB/s (1e9 bytes)
// over the reps, threads, MiB and the machine. It is the ceiling a weight-streaming decode step
// in RAM can reach; bench/generate_bench.py sets it against Stratum's decode rate. Does not
// measure writes, latency or caches (keep --mib far above the last-level cache).
// Usage: mem_bandwidth [--mib 2048] [--threads 2] [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "stratum/error.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BandwidthArgs {
  std::size_t mib = 2048;
  int threads = 2;
  int reps = 5;
};

long parse_positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  STRATUM_CHECK(end != text.c_str() && *end == '\0' && n > 0, "[mem_bandwidth] ", flag,
                " expects a positive integer, got '", text, "'");
  return n;
}

BandwidthArgs parse_args(int argc, char** argv) {
  BandwidthArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    STRATUM_CHECK(i + 1 < argc, "[mem_bandwidth] ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--mib") args.mib = static_cast<std::size_t>(parse_positive(flag, value));
    else if (flag == "--threads") args.threads = static_cast<int>(parse_positive(flag, value));
    else if (flag == "--reps") args.reps = static_cast<int>(parse_positive(flag, value));
    else STRATUM_FAIL("[mem_bandwidth] unknown flag ", flag,
                      ": usage: mem_bandwidth [--mib 2048] [--threads 2] [--reps 5]");
  }
  return args;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// Sum of x[0, n): 8 accumulators so the adds are independent (vectorized as two 4-wide adds).
float sum_floats(const float* x, std::size_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  for (; i < n; ++i) acc[0] += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Runs fn(t, begin, end) on `threads` threads, thread t taking the t-th contiguous share of n.
template <typename Fn>
void run_shares(int threads, std::size_t n, Fn fn) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = n * t / threads, end = n * (t + 1) / threads;
    workers.emplace_back(fn, t, begin, end);
  }
  for (std::thread& w : workers) w.join();
}

int measure(const BandwidthArgs& args) {
  const std::size_t n = args.mib * (std::size_t{1} << 20) / sizeof(float);
  stratum::AlignedBuffer buffer(n * sizeof(float));  // (n) fp32, RAM
  float* x = buffer.as_f32();
  run_shares(args.threads, n, [&](int, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) x[i] = static_cast<float>(i & 1023) * 1e-3f;
  });
  std::vector<float> sums(static_cast<std::size_t>(args.threads));  // one per thread, kept so the sums are used
  std::vector<double> gbps;
  for (int rep = 0; rep < args.reps; ++rep) {
    const Clock::time_point t0 = Clock::now();
    run_shares(args.threads, n, [&](int t, std::size_t begin, std::size_t end) {
      sums[static_cast<std::size_t>(t)] = sum_floats(x + begin, end - begin);
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    gbps.push_back(static_cast<double>(n * sizeof(float)) / seconds / 1e9);
  }
  volatile float sink = 0;  // keeps the sums from being optimised away
  for (float s : sums) sink = sink + s;
  std::sort(gbps.begin(), gbps.end());
  const double median = gbps.size() % 2 ? gbps[gbps.size() / 2]
                                        : 0.5 * (gbps[gbps.size() / 2 - 1] + gbps[gbps.size() / 2]);
  std::printf("{\"read_gbps_best\": %.2f, \"read_gbps_median\": %.2f, \"threads\": %d, \"mib\": %zu, "
              "\"reps\": %d, \"cpus\": %u, \"cpu\": \"%s\"}\n",
              gbps.back(), median, args.threads, args.mib, args.reps, std::thread::hardware_concurrency(),
              cpu_model().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return measure(parse_args(argc, argv));
  } catch (const stratum::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
