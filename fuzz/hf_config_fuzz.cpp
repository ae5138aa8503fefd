// libFuzzer target for the Hugging Face GPT-2 config.json reader: writes the input to a
// per-process temporary file and calls hf_config_read on it. An accepted config must pass
// GptConfig::validate() and have a finite layer_norm_epsilon. Caps its stack at 128 KiB (see
// Note [fuzz stack limit] in fuzz_file.h).
// Pass: success or stratum::Error. Fail: any other exception, a BugError, an accepted config
// that breaks the checks above, or a sanitizer report. Does not fuzz the writer. Run with
// tools/fuzz.sh.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "model/hf_config.h"
#include "fuzz_file.h"
#include "stratum/error.h"

namespace {

using stratum::fuzz::FuzzFile;

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.hf_config] %s\n", what.c_str());
  std::abort();
}

}  // namespace

// Caps the stack: see Note [fuzz stack limit] in fuzz_file.h.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FuzzFile file("config.json");
  const std::string& path = file.write(data, size);
  stratum::GptConfig cfg;
  try {
    cfg = stratum::hf_config_read(path);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input: the expected outcome for most fuzz inputs
  }
  // An accepted config must describe a model Stratum can build.
  try {
    cfg.validate();
  } catch (const stratum::Error& e) {
    fuzz_fail(std::string("accepted a config that validate() rejects: ") + e.what());
  }
  if (!std::isfinite(cfg.layer_norm_eps))
    fuzz_fail("accepted layer_norm_epsilon = " + std::to_string(cfg.layer_norm_eps) +
              " (not finite); layernorm would divide by sqrt(var + inf)");
  return 0;
}
