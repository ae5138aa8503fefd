// MetricsLog; see metrics_log.h.
#include "obs/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// The step of a log line, when it is one of our records (a JSON object with an integer "step").
std::optional<long> record_step(const std::string& line) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return std::nullopt;
  return record["step"].get<long>();
}

// The lines of `path` (at most max_lines, each cut at max_line_bytes; none when it does not exist)
// and whether it holds any byte at all.
std::vector<std::string> lines_of(const std::string& path, std::size_t max_lines, std::size_t max_line_bytes,
                                  bool* empty) {
  std::vector<std::string> lines;
  *empty = true;
  STRATUM_CHECK(!file_is_special(path), "[log] --log '", path,
                "' is a device, pipe or socket; give a file path (the log is read back on --resume)");
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return lines;
  std::string line;
  for (int c; lines.size() < max_lines && (c = std::fgetc(f)) != EOF;) {
    *empty = false;
    if (c == '\n') lines.push_back(std::exchange(line, {}));
    else if (line.size() < max_line_bytes) line.push_back(static_cast<char>(c));
  }
  if (!line.empty() && lines.size() < max_lines) lines.push_back(line);
  std::fclose(f);
  return lines;
}

// A file --log may replace: none yet, an empty one, or a Stratum log (its first line one of our
// records). Anything else is somebody's file, never truncated.
void check_ours(const std::string& path, const std::vector<std::string>& lines, bool empty) {
  STRATUM_CHECK(empty || (!lines.empty() && record_step(lines[0])), "[log] --log '", path,
                "' exists and is not a Stratum training log; choose another path (or remove it)");
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  bool empty = true;
  const std::vector<std::string> first = lines_of(path, 1, 1 << 16, &empty);  // the first line is enough
  check_ours(path, first, empty);
  file_ = std::fopen(path.c_str(), "w");
  STRATUM_CHECK(file_ != nullptr, "[log] cannot open --log file '", path, "' for writing: ", std::strerror(errno));
}

MetricsLog::MetricsLog(const std::string& path, long keep_through_step) : path_(path) {
  // Keep the records of steps 1..keep_through_step (a resumed run continues the log; records of
  // steps after the checkpoint, from the run that crashed, are dropped as it redoes them).
  bool empty = true;
  constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
  const std::vector<std::string> lines = lines_of(path, kAll, kAll, &empty);
  check_ours(path, lines, empty);
  std::string kept;
  for (const std::string& line : lines)
    if (const std::optional<long> step = record_step(line); step && *step <= keep_through_step) kept += line + "\n";
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
