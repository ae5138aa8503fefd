// JSON Lines metrics file: one JSON object per line, flushed after every record so a crash
// loses at most the line being written. Does not aggregate or plot.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace stratum {

class MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::string& path);  // truncates; throws naming the path if unwritable
  // Continues an existing log (a resumed run): keeps the records of steps <= keep_through_step
  // and drops the rest (a run that crashed after its last checkpoint logged steps it will redo).
  MetricsLog(const std::string& path, long keep_through_step);
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  MetricsLog(MetricsLog&& other) noexcept;
  MetricsLog& operator=(MetricsLog&& other) noexcept;
  ~MetricsLog();

  bool enabled() const { return file_ != nullptr; }
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace stratum
