// libFuzzer target for `stratum report`'s input: arbitrary bytes split into lines, each parsed as
// JSON (unparsable lines skipped, as the CLI would reject them), then rendered by report_svg.
// Pass: an SVG or a stratum::Error. Fail: any other exception, an SVG without its closing tag,
// or a sanitizer report. Run with tools/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "obs/report_svg.h"
#include "stratum/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<nlohmann::json> objects;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) objects.push_back(std::move(j));
  }
  try {
    std::vector<stratum::ReportRecord> records;  // as cmd_report reads them
    for (const nlohmann::json& object : objects) records.push_back(stratum::report_record(object, records.size()));
    const std::string svg = stratum::report_svg(records, "fuzz");
    if (svg.find("</svg>") == std::string::npos) {
      std::fprintf(stderr, "[fuzz.report_svg] SVG without its closing tag\n");
      std::abort();
    }
  } catch (const stratum::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[fuzz.report_svg] unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
