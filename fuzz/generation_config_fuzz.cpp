// libFuzzer target for the generation_config.json reader (hf_generation_config_read, Note
// [generation config] in model/hf_config.h): writes the input to a per-process temporary file and
// reads it. An accepted file must give values generate accepts: temperature finite and >= 0,
// top_k >= 0, top_p in (0, 1], eos ids >= 0. Caps its stack at 128 KiB (Note [fuzz stack limit] in
// fuzz_file.h). Pass: success or stratum::Error. Fail: any other exception, a BugError, an accepted
// value out of range, or a sanitizer report. Run with tools/fuzz.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_file.h"
#include "model/hf_config.h"
#include "stratum/error.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) { stratum::fuzz::fuzz_abort("generation_config", what); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static stratum::fuzz::FuzzFile file("generation_config.json");
  const std::string& path = file.write(data, size);
  stratum::HfGenerationConfig g;
  try {
    g = stratum::hf_generation_config_read(path);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input
  }
  if (!g.present) fuzz_fail("an existing file read as absent");
  if (!std::isfinite(g.temperature) || g.temperature < 0) fuzz_fail("accepted temperature " + std::to_string(g.temperature));
  if (g.top_k < 0) fuzz_fail("accepted top_k " + std::to_string(g.top_k));
  if (!(g.top_p > 0 && g.top_p <= 1)) fuzz_fail("accepted top_p " + std::to_string(g.top_p));
  for (std::int32_t id : g.eos_token_ids)
    if (id < 0) fuzz_fail("accepted eos id " + std::to_string(id));
  return 0;
}
