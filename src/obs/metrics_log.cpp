// MetricsLog; see metrics_log.h.
#include "obs/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "stratum/error.h"

namespace stratum {

namespace {
// A file --log may replace: none yet, an empty one, or a Stratum log (its first line a JSON
// object with a "step"). Anything else is somebody's file, never truncated.
void check_ours(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return;
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF && c != '\n' && line.size() < (1 << 16);) line.push_back(static_cast<char>(c));
  const bool empty = line.empty() && std::feof(f);
  std::fclose(f);
  if (empty) return;
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  STRATUM_CHECK(record.is_object() && record.contains("step"), "[log] --log '", path,
                "' exists and is not a Stratum training log; choose another path (or remove it)");
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  check_ours(path);
  file_ = std::fopen(path.c_str(), "w");
  STRATUM_CHECK(file_ != nullptr, "[log] cannot open --log file '", path, "' for writing: ", std::strerror(errno));
}

MetricsLog::MetricsLog(const std::string& path, long keep_through_step) : path_(path) {
  // Keep the records of steps 1..keep_through_step (a resumed run continues the log; records of
  // steps after the checkpoint, from the run that crashed, are dropped as it redoes them).
  check_ours(path);
  std::string kept;
  if (std::FILE* old = std::fopen(path.c_str(), "r")) {
    std::string line;
    int c;
    auto take = [&] {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
          record["step"].get<long>() <= keep_through_step)
        kept += line + "\n";
      line.clear();
    };
    while ((c = std::fgetc(old)) != EOF) {
      if (c == '\n') take();
      else line.push_back(static_cast<char>(c));
    }
    std::fclose(old);
  }
  file_ = std::fopen(path.c_str(), "w");
  STRATUM_CHECK(file_ != nullptr, "[log] cannot open --log file '", path, "' for writing: ", std::strerror(errno));
  const bool ok = std::fwrite(kept.data(), 1, kept.size(), file_) == kept.size() && std::fflush(file_) == 0;
  STRATUM_CHECK(ok, "[log] write to '", path_, "' failed: ", std::strerror(errno), " (disk full?)");
}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  STRATUM_CHECK(ok, "[log] write to '", path_, "' failed: ", std::strerror(errno), " (disk full?)");
}

}  // namespace stratum
