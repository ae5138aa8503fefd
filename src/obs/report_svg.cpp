// report_svg; see report_svg.h.
#include "obs/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "stratum/error.h"

namespace stratum {

namespace {
constexpr double kWidth = 900, kPanelHeight = 220, kLeft = 70, kRight = 20, kTop = 40, kGap = 40;

struct Series {
  std::string label;
  const char* color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

std::string number(double v) {
  char buf[32];
  // Whole numbers in full up to 1e15 (beyond, %.0f of 1e308 is 309 digits: cut off in buf).
  if (std::fabs(v) < 1e15 && (std::fabs(v) >= 1000 || v == std::floor(v))) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// The points a polyline draws: all of them where they are fewer than about two a pixel column,
// else, for each run of consecutive points in one column, its lowest and highest (in order), so
// every spike stays visible.
template <class X>
std::vector<std::pair<double, double>> drawn_points(const std::vector<std::pair<double, double>>& points, X x,
                                                    double columns) {
  if (static_cast<double>(points.size()) <= 2 * columns) return points;
  std::vector<std::pair<double, double>> out;
  std::size_t first = 0;
  while (first < points.size()) {
    const long column = std::lround(x(points[first].first));
    std::size_t end = first, lo = first, hi = first;
    for (; end < points.size() && std::lround(x(points[end].first)) == column; ++end) {
      if (points[end].second < points[lo].second) lo = end;
      if (points[end].second > points[hi].second) hi = end;
    }
    out.push_back(points[std::min(lo, hi)]);
    if (lo != hi) out.push_back(points[std::max(lo, hi)]);
    first = end;
  }
  return out;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// One panel: axes, y ticks, one polyline per series (points drawn when a series is sparse).
std::string panel(int index, const std::string& title, const std::vector<Series>& series, double step_min,
                  double step_max) {
  const double top = kTop + index * (kPanelHeight + kGap), bottom = top + kPanelHeight;
  const double left = kLeft, right = kWidth - kRight;
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (const auto& p : s.points) {
      lo = std::min(lo, p.second);
      hi = std::max(hi, p.second);
    }
  std::string out = "<text x=\"" + number(left) + "\" y=\"" + number(top - 8) +
                    "\" font-size=\"13\" font-weight=\"bold\">" + escape(title) + "</text>\n";
  out += "<rect x=\"" + number(left) + "\" y=\"" + number(top) + "\" width=\"" + number(right - left) +
         "\" height=\"" + number(kPanelHeight) + "\" fill=\"none\" stroke=\"#999\"/>\n";
  if (!std::isfinite(lo)) return out + "<text x=\"" + number(left + 10) + "\" y=\"" + number(top + 20) +
                                "\" font-size=\"12\" fill=\"#666\">no data in this log</text>\n";
  if (hi - lo < 1e-12 || hi / 2 - lo / 2 <= 1e-12 * std::max(std::fabs(hi), std::fabs(lo))) {  // flat
    const double pad = std::max(0.5, 1e-3 * std::max(std::fabs(hi), std::fabs(lo)));  // not lost to rounding
    lo -= pad;
    hi += pad;
  }
  if (lo > 0 && lo < 0.25 * hi) lo = 0;  // start at zero when the data nearly does
  // Halves: hi - lo of values near +-1e308 (a log can hold any double) would overflow to inf and
  // put NaN coordinates in the SVG.
  const double half_x = std::max(0.5, step_max / 2 - step_min / 2), half_y = hi / 2 - lo / 2;
  auto x = [&](double step) { return left + (step / 2 - step_min / 2) / half_x * (right - left); };
  auto y = [&](double v) { return bottom - (v / 2 - lo / 2) / half_y * kPanelHeight; };
  for (int t = 0; t <= 4; ++t) {
    const double v = lo * (1.0 - t / 4.0) + hi * (t / 4.0);
    out += "<text x=\"" + number(left - 6) + "\" y=\"" + number(y(v) + 4) +
           "\" font-size=\"11\" text-anchor=\"end\">" + number(v) + "</text>\n";
    out += "<line x1=\"" + number(left) + "\" x2=\"" + number(right) + "\" y1=\"" + number(y(v)) + "\" y2=\"" +
           number(y(v)) + "\" stroke=\"#eee\"/>\n";
  }
  out += "<text x=\"" + number(left) + "\" y=\"" + number(bottom + 15) + "\" font-size=\"11\">step " +
         number(step_min) + "</text>\n<text x=\"" + number(right) + "\" y=\"" + number(bottom + 15) +
         "\" font-size=\"11\" text-anchor=\"end\">step " + number(step_max) + "</text>\n";
  double legend_x = left + 10;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    std::string pts;
    for (const auto& p : drawn_points(s.points, x, right - left)) pts += number(x(p.first)) + "," + number(y(p.second)) + " ";
    out += "<polyline fill=\"none\" stroke=\"" + std::string(s.color) + "\" stroke-width=\"1.5\" points=\"" + pts +
           "\"/>\n";
    if (s.points.size() <= 50)
      for (const auto& p : s.points)
        out += "<circle cx=\"" + number(x(p.first)) + "\" cy=\"" + number(y(p.second)) + "\" r=\"2.5\" fill=\"" +
               s.color + "\"/>\n";
    out += "<text x=\"" + number(legend_x) + "\" y=\"" + number(top + 16) + "\" font-size=\"12\" fill=\"" + s.color +
           "\">" + escape(s.label) + "</text>\n";
    legend_x += 14 + 7.0 * static_cast<double>(s.label.size());
  }
  return out;
}
}  // namespace

ReportRecord report_record(const nlohmann::json& r, std::size_t index) {
  STRATUM_CHECK(r.is_object() && r.contains("step") && r["step"].is_number() && r.contains("loss") &&
                    r["loss"].is_number(),
                "[report] record ", index + 1, " has no numeric \"step\" and \"loss\"; is this a stratum train --log file?");
  ReportRecord out;
  out.step = r["step"].get<double>();
  out.loss = r["loss"].get<double>();
  auto get = [&](const char* key, double scale, double& field) {
    if (r.contains(key) && r[key].is_number()) field = r[key].get<double>() * scale;
  };
  get("val_loss", 1.0, out.val_loss);
  get("read_bytes", 1.0 / (1024 * 1024), out.read_mib);
  get("write_bytes", 1.0 / (1024 * 1024), out.write_mib);
  get("step_ms", 1.0, out.step_ms);
  get("stall_ms", 1.0, out.stall_ms);
  return out;
}

std::string report_svg(const std::vector<ReportRecord>& records, const std::string& title) {
  STRATUM_CHECK(!records.empty(), "[report] the log has no records; pass the --log FILE of a stratum train run");
  Series loss{"loss", "#1f77b4", {}}, val{"validation loss", "#d62728", {}};
  Series read{"MiB read", "#2ca02c", {}}, written{"MiB written", "#ff7f0e", {}};
  Series step_ms{"step ms", "#1f77b4", {}}, stall{"stall ms", "#d62728", {}};
  double step_min = INFINITY, step_max = -INFINITY;
  for (const ReportRecord& r : records) {
    step_min = std::min(step_min, r.step);
    step_max = std::max(step_max, r.step);
    loss.points.push_back({r.step, r.loss});
    auto add = [&](Series& s, double v) {
      if (!std::isnan(v)) s.points.push_back({r.step, v});
    };
    add(val, r.val_loss);
    add(read, r.read_mib);
    add(written, r.write_mib);
    add(step_ms, r.step_ms);
    add(stall, r.stall_ms);
  }
  const double height = kTop + 3 * (kPanelHeight + kGap);
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    number(kWidth) + "\" height=\"" + number(height) + "\" font-family=\"sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"" + number(kLeft) +
         "\" y=\"18\" font-size=\"15\">" + escape(title) + "</text>\n";
  svg += panel(0, "loss", {loss, val}, step_min, step_max);
  svg += panel(1, "offload traffic per step (MiB)", {read, written}, step_min, step_max);
  svg += panel(2, "time per step (ms)", {step_ms, stall}, step_min, step_max);
  return svg + "</svg>\n";
}

}  // namespace stratum
