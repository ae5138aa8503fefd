// The process's peak resident memory (getrusage), for the run's report and the plan's measuring
// process alike. Does not measure anything else.
#pragma once

#include <sys/resource.h>

#include <cstddef>

namespace stratum {

inline std::size_t process_peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

}  // namespace stratum
