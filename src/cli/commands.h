// Entry points of the `stratum` subcommands; each parses its flags and returns the exit code.
// Errors are thrown as stratum::Error and reported by main(). Does not print usage for the
// whole program (main.cpp does).
#pragma once

#include <csignal>
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
int cmd_eval(const std::vector<std::string>& args);

// A --model path as the readers take it: a checkpoint root stands for its latest checkpoint, or,
// when `latest` is broken, the newest that verifies (checkpoint_model_dir); says which and why on
// stderr.
std::string model_dir_resolve(const std::string& path);

// The first SIGINT, SIGTERM or SIGHUP sets the returned flag and writes `notice` to stderr (the
// command then stops at its next safe point: train after the step, with a checkpoint; generate
// after the token, removing its offload files); the handler restores the default action, so a
// second signal ends the process at once. `notice` must outlive the command (a literal).
const volatile std::sig_atomic_t* stop_signals_install(const char* notice);

// Flushes stdout: "" when everything written to it so far arrived, else why not (the error's
// text, or "the stream reported an error"). Output that cannot be written is a failure.
std::string stdout_flush();

}  // namespace stratum
