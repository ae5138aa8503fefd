// Command-line flags for `stratum` subcommands: "--name value" or "--name=value", boolean
// switches, and positional arguments. Every flag must be declared; unknown flags, missing
// values and malformed numbers are one-line errors. Does not print help by itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace stratum {

struct FlagSpec {
  std::string name;  // without "--"
  std::string value_name;  // empty = boolean switch
  std::string help;
};

class Args {
 public:
  // argv excludes the program and subcommand names.
  Args(std::string command, const std::vector<std::string>& argv, std::vector<FlagSpec> specs,
       int max_positional = 0);

  bool help_requested() const { return help_; }
  std::string help_text(const std::string& synopsis) const;

  bool has(const std::string& name) const;
  std::string str(const std::string& name, const std::string& fallback = "") const;
  std::int64_t integer(const std::string& name, std::int64_t fallback, std::int64_t min, std::int64_t max) const;
  double number(const std::string& name, double fallback) const;
  bool flag(const std::string& name) const;
  // Sizes like 512M, 2G, 4096 (bytes); K/M/G/T are powers of 1024.
  std::uint64_t size_bytes(const std::string& name, std::uint64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  const FlagSpec* spec(const std::string& name) const;
  const std::string* value(const std::string& name) const;

  std::string command_;
  std::vector<FlagSpec> specs_;
  std::vector<std::pair<std::string, std::string>> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// The flags that describe a model (shared by train and plan): --model HF_DIR or a new model's
// --layers/--heads/--embd/--ctx/--vocab.
std::vector<FlagSpec> model_flag_specs();
std::vector<FlagSpec> concat_specs(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b);
// Refuses shape flags together with --model (config.json gives the shape).
void model_flags_alone_check(const Args& args);
// The new model's shape from those flags (defaults L4 H4 C256 ctx256 V50257); refuses shape
// flags together with --model (model_flags_alone_check).
GptConfig model_flags_config(const Args& args);
// Note [model flags]: the flags of a new model's shape and family, one row each: its help, how it
// sets the config (its default when absent) and the config's value as that flag would say it
// (for the resume check). model_flag_specs, model_flags_config and the resume check loop over it.
struct ModelShapeFlag {
  const char* flag;
  const char* value_name;
  const char* help;
  bool llama_only;
  void (*read)(const Args& args, GptConfig& config);
  std::string (*text)(const GptConfig& config);
};
const std::vector<ModelShapeFlag>& model_shape_flags();

}  // namespace stratum
