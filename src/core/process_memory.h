// The process's peak resident memory (getrusage), for the run's report and the plan's measuring
// process alike, and the memory the machine has available (/proc/meminfo), for refusing a run
// that cannot fit in RAM before it allocates.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <cstdio>

#include "core/byte_size.h"
#include "stratum/error.h"

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

// Refuses, before anything is allocated, state that does not fit in the RAM the machine has
// available: it would otherwise fill memory piece by piece until the kernel kills the process.
// component: the message's tag ("train"); what: the state; fix: what to do instead.
inline void memory_fit_check(std::size_t need, const char* component, const char* what, const char* fix) {
  const std::size_t available = memory_available_bytes();
  STRATUM_CHECK(available == 0 || need <= available, "[", component, "] ", what, " needs ", bytes_text(need),
                " of RAM and this machine has ", bytes_text(available), " available; ", fix);
}

}  // namespace stratum
