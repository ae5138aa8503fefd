// Entry points of the `stratum` subcommands; each parses its flags and returns the exit code.
// Errors are thrown as stratum::Error and reported by main(). Does not print usage for the
// whole program (main.cpp does).
#pragma once

#include <string>
#include <vector>

namespace stratum {

int cmd_train(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_verify(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);

// A --model path as the readers take it: a checkpoint root stands for its latest checkpoint, or,
// when `latest` is broken, the newest that verifies (checkpoint_model_dir); says which and why on
// stderr.
std::string model_dir_resolve(const std::string& path);

// Flushes stdout: "" when everything written to it so far arrived, else why not (the error's
// text, or "the stream reported an error"). Output that cannot be written is a failure.
std::string stdout_flush();

}  // namespace stratum
