// `stratum report`: renders a training log (the JSONL of `stratum train --log`) as one SVG with
// three panels sharing the step axis: loss (and validation loss), offload traffic per step (MiB
// read and written) and time per step (step time and stall). Plain SVG 1.1, no scripts, no
// external fonts. Does not read the log file itself or plot anything else.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratum {

// records: the log's objects in order; each needs "step" and "loss" (others are optional).
// Throws Error naming the record when one lacks them. `title` goes at the top.
std::string report_svg(const std::vector<nlohmann::json>& records, const std::string& title);

}  // namespace stratum
