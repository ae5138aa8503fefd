// `stratum report`: renders a training log (the JSONL of `stratum train --log`) as one SVG with
// three panels sharing the step axis: loss (and validation loss), offload traffic per step (MiB
// read and written) and time per step (step time and stall). Plain SVG 1.1, no scripts, no
// external fonts. Does not read the log file itself or plot anything else.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratum {

// What the report plots of one log record; NaN where the record has no such value.
struct ReportRecord {
  double step = 0, loss = 0;
  double val_loss = NAN, read_mib = NAN, write_mib = NAN, step_ms = NAN, stall_ms = NAN;
};
// One log object as a record: it needs a numeric "step" and "loss" (the others are optional).
// Throws Error naming the record (`index`, 0-based) when it lacks them.
ReportRecord report_record(const nlohmann::json& object, std::size_t index);

// The records in log order; `title` goes at the top. A series of more points than the plot has
// pixel columns draws each column's lowest and highest point (a log of millions of steps made
// an SVG of millions of points). Throws Error when there are none.
std::string report_svg(const std::vector<ReportRecord>& records, const std::string& title);

}  // namespace stratum
