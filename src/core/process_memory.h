// The process's peak resident memory (getrusage), for the run's report and the plan's measuring
// process alike, and the memory the machine has available (/proc/meminfo), for refusing a run
// that cannot fit in RAM before it allocates.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <cstdio>

namespace stratum {

inline std::size_t process_peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

// MemAvailable of /proc/meminfo (what can be allocated without swapping): 0 when unknown.
inline std::size_t memory_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return static_cast<std::size_t>(kib) * 1024;
}

}  // namespace stratum
