// stratum report: the SVG has a polyline per series present in the log (loss, validation loss,
// MiB read/written, step ms, stall ms), escapes text, and bad logs get one clear line.
#include "obs/report_svg.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/file_util.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

// The log's objects as cmd_report reads them.
std::string svg_of(const std::vector<nlohmann::json>& objects, const std::string& title) {
  std::vector<ReportRecord> records;
  for (const nlohmann::json& o : objects) records.push_back(report_record(o, records.size()));
  return report_svg(records, title);
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(ReportSvg, OnePolylinePerSeriesPresent) {
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 10; ++step) {
    nlohmann::json r = {{"step", step}, {"loss", 10.0 / step}, {"step_ms", 100.0 + step},
                        {"stall_ms", 5.0}, {"read_bytes", step << 20}, {"write_bytes", step << 19}};
    if (step % 5 == 0) r["val_loss"] = 11.0 / step;
    records.push_back(r);
  }
  const std::string svg = svg_of(records, "run <a&b>");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 6);
  EXPECT_NE(svg.find("run &lt;a&amp;b&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("run <a&b>"), std::string::npos);
  // A log from an in-RAM run without validation: loss, step ms and zero traffic still plot.
  for (auto& r : records) r.erase("val_loss");
  EXPECT_EQ(count(svg_of(records, "t"), "<polyline"), 5);
}

// Values at the ends of the double range (a log can hold any number): finite coordinates.
TEST(ReportSvg, ExtremeValuesGiveFiniteCoordinates) {
  const std::vector<nlohmann::json> records = {nlohmann::json{{"step", -1e308}, {"loss", 1e308}},
                                               nlohmann::json{{"step", 1e308}, {"loss", -1e308}}};
  const std::string svg = svg_of(records, "t");
  EXPECT_EQ(count(svg, "<polyline"), 1);
  EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
  // A flat series of huge values: the +-0.5 widening would be lost to rounding.
  const std::string flat = svg_of({nlohmann::json{{"step", 1}, {"loss", 1e300}}}, "t");
  EXPECT_EQ(flat.find("nan"), std::string::npos) << flat;
  EXPECT_EQ(flat.find("inf"), std::string::npos) << flat;
}

// A log of a million steps draws each pixel column's lowest and highest point (it wrote every
// point: an 81 MB SVG), so a one-step spike stays; huge values label as 1e+300, not cut-off digits.
TEST(ReportSvg, LongLogsAreDecimatedKeepingSpikes) {
  std::vector<ReportRecord> records(1000000);
  for (std::size_t i = 0; i < records.size(); ++i) {
    records[i].step = static_cast<double>(i + 1);
    records[i].loss = i == 500000 ? 99.0 : 2.0 + 1e-6 * static_cast<double>(i % 7);
  }
  const std::string svg = report_svg(records, "t");
  EXPECT_LT(svg.size(), 200000u);
  const std::size_t at = svg.find("points=\"");
  ASSERT_NE(at, std::string::npos);
  const std::string points = svg.substr(at, svg.find('"', at + 8) - at);
  EXPECT_LT(std::count(points.begin(), points.end(), ','), 2000);
  EXPECT_NE(svg.find(">99</text>"), std::string::npos) << "the spike sets the axis";
  const std::string huge = svg_of({nlohmann::json{{"step", 1}, {"loss", 1e300}}, nlohmann::json{{"step", 2}, {"loss", 0}}}, "t");
  EXPECT_NE(huge.find(">1e+300</text>"), std::string::npos) << huge;
}

TEST(ReportSvg, RejectsRecordsWithoutStepOrLoss) {
  EXPECT_THROW(svg_of({}, "t"), Error);
  EXPECT_THROW(svg_of({nlohmann::json{{"step", 1}}}, "t"), Error);
  EXPECT_THROW(svg_of({nlohmann::json{{"step", "1"}, {"loss", 2.0}}}, "t"), Error);
}

TEST(ReportSvg, CliRendersATrainingLogAndRejectsBadOnes) {
  testing::TempDir tmp;
  const std::string dir = testing::source_path("tests/golden/tiny_gpt2");
  const auto train = testing::run_stratum("train --model " + dir + " --data " + dir +
                                          "/tokens.bin --batch 2 --seq 16 --steps 4 --quiet --log " +
                                          tmp.file("run.jsonl"));
  ASSERT_EQ(train.exit_code, 0) << train.errors;
  const auto r = testing::run_stratum("report " + tmp.file("run.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  const std::string svg = file_read_all(tmp.file("run.svg"));  // default: next to the log
  EXPECT_GE(count(svg, "<polyline"), 4);
  file_write_atomic(tmp.file("bad.jsonl"), std::string("{\"step\":1,\"loss\":2}\nnot json\n"));
  const auto bad = testing::run_stratum("report " + tmp.file("bad.jsonl") + " --out " + tmp.file("x.svg"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.errors.find("line 2 is not JSON"), std::string::npos) << bad.errors;
  EXPECT_FALSE(file_exists(tmp.file("x.svg")));
}

}  // namespace
}  // namespace stratum
