// The flags of the recorded training options (Note [option table] in train/train_options.h), for
// the commands that take them: train (every row) and eval (the rows that say what is evaluated
// and where it runs). Defined in cmd_train.cpp. Does not run anything.
#pragma once

#include <string>
#include <vector>

#include "cli/args.h"
#include "train/trainer.h"

namespace stratum {

// The table's flags, each with its default; only: the flags to take (empty: every row).
std::vector<FlagSpec> train_option_specs(const std::vector<std::string>& only = {});
// Each recorded option from its flag, or its default (integers within the row's range as they
// parse); a flag the command does not take is not given, so its field keeps its default.
void train_options_parse(const Args& args, TrainSettings& s);
// The options that apply only under a budget or on the GPU, after a resume filled in the
// checkpoint's: a resume that drops its budget (--mem-budget 0) or its GPU (--backend cpu) drops
// the values that went with them; one given with nothing it applies to is refused.
void run_options_settle(const Args& args, TrainOptions& o);

}  // namespace stratum
