// ProgressBar; see progress_bar.h.
#include "obs/progress_bar.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace stratum {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

ProgressBar::ProgressBar(long total_steps, bool quiet)
    : total_steps_(total_steps), quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressBar::update(long step, float loss, double tokens_per_s, double eta_s, const std::string& extra) {
  if (quiet_) return;
  const int width = 24;
  const int filled = total_steps_ > 0 ? static_cast<int>(width * step / total_steps_) : width;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(width, '.');
  char line[512];
  std::snprintf(line, sizeof line, "[%s] step %ld/%ld | loss %.4f | %.0f tok/s | ETA %s%s%s", bar.c_str(), step,
                total_steps_, loss, tokens_per_s, format_duration(eta_s).c_str(), extra.empty() ? "" : " | ",
                extra.c_str());
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line);
    drawn_ = true;
  } else {
    const long every = total_steps_ >= 50 ? total_steps_ / 25 : 1;
    if (step == 1 || step % every == 0 || step == total_steps_) std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

void ProgressBar::message(const std::string& line) {
  if (tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  drawn_ = false;
}

void ProgressBar::finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace stratum
