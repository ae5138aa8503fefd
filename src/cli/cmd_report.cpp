// `stratum report LOG.jsonl [--out FILE.svg]`: reads a training log and writes report_svg().
#include <cstdio>
#include <fstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/file_util.h"
#include "obs/report_svg.h"
#include "stratum/error.h"

namespace stratum {

int cmd_report(const std::vector<std::string>& argv) {
  Args args("report", argv, {{"out", "FILE.svg", "where to write the SVG (default: the log's path with .svg)"}}, 1);
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum report LOG.jsonl [--out FILE.svg]").c_str(), stdout);
    return 0;
  }
  STRATUM_CHECK(args.positional().size() == 1, "[cli] 'stratum report' needs the log file: stratum report LOG.jsonl");
  const std::string log = args.positional()[0];
  std::string out = args.str("out");
  if (out.empty()) {
    const std::size_t dot = log.rfind('.');
    const std::size_t slash = log.rfind('/');
    out = (dot != std::string::npos && (slash == std::string::npos || dot > slash) ? log.substr(0, dot) : log) + ".svg";
  }
  STRATUM_CHECK(!same_file(log, out), "[report] --out '", out, "' is the log being read; choose another --out");
  STRATUM_CHECK(!dir_exists(out), "[report] --out '", out, "' is a directory; give the SVG file's path");
  // Only an SVG is replaced (--out naming another run's log destroyed it).
  if (file_exists(out) && file_size_bytes(out) > 0) {
    std::ifstream existing(out, std::ios::binary);
    std::string head(512, '\0');
    existing.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(existing.gcount()));
    STRATUM_CHECK(head.find("<svg") != std::string::npos, "[report] --out '", out,
                  "' exists and is not an SVG: report replaces only an SVG; choose another --out (or remove it)");
  }
  // Line by line, keeping only what is plotted (a 443 MB log held as JSON objects took 3.6 GB).
  const std::string problem = file_read_problem(log);
  STRATUM_CHECK(problem.empty(), "[report] '", log, "' ", problem);
  std::ifstream in(log, std::ios::binary);
  STRATUM_CHECK(in.good(), "[report] cannot open '", log, "'");
  std::vector<ReportRecord> records;
  long line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      if (in.eof()) {  // the last record, cut off (no newline after it): a run killed while writing it
        std::fprintf(stderr, "[stratum] report: %s line %ld is cut off (the run stopped while writing it): left out\n",
                     log.c_str(), line_number);
        break;
      }
      STRATUM_FAIL("[report] ", log, " line ", line_number, " is not JSON; give the --log FILE of a stratum train run");
    }
    records.push_back(report_record(object, records.size()));
  }
  STRATUM_CHECK(!in.bad(), "[report] cannot read '", log, "'");
  file_write_atomic(out, report_svg(records, "stratum train: " + log));
  std::printf("wrote %s (%zu steps)\n", out.c_str(), records.size());
  return 0;
}

}  // namespace stratum
