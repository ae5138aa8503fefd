// One way to print a number of bytes in messages and reports: "512 bytes", "3.4 KiB", "13.4 MiB",
// "12.5 GiB" (MiB up to 10 GiB, so budgets and unit sizes stay comparable at a glance). Never
// "0.0 MiB" for a small non-zero amount, never "0.01 GiB".
#pragma once

#include <cstdio>
#include <string>

namespace stratum {

inline std::string bytes_text(double bytes) {
  char text[32];
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024.0, kGiB = kMiB * 1024.0;
  if (bytes < kKiB) std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  else if (bytes < kMiB) std::snprintf(text, sizeof text, "%.1f KiB", bytes / kKiB);
  else if (bytes < 10 * kGiB) std::snprintf(text, sizeof text, "%.1f MiB", bytes / kMiB);
  else std::snprintf(text, sizeof text, "%.1f GiB", bytes / kGiB);
  return text;
}

}  // namespace stratum
