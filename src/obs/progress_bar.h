// One-line training progress on stderr: step, loss, tokens/s, ETA. Redraws in place on a
// terminal; prints a plain line every `every` steps otherwise (logs, CI). Does not log to files.
#pragma once

#include <string>

namespace stratum {

class ProgressBar {
 public:
  ProgressBar(long total_steps, bool quiet);
  // step is 1-based (steps done).
  void update(long step, float loss, double tokens_per_s, double eta_s, const std::string& extra);
  void message(const std::string& line);  // prints a full line without breaking the bar
  void finish();

 private:
  long total_steps_;
  bool quiet_;
  bool tty_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "2m05s", "1h02m", "12s"

}  // namespace stratum
