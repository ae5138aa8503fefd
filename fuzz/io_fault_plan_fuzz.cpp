// libFuzzer target for IoFaultPlan::parse (the STRATUM_IO_FAULT spec): arbitrary bytes must
// either parse into a plan with a known kind and a block index >= 0, or throw stratum::Error.
// Pass: one of those. Fail: any other exception, a parsed plan out of range, or a sanitizer
// report. Run with tools/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "io/io_engine.h"
#include "stratum/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  try {
    const stratum::IoFaultPlan plan = stratum::IoFaultPlan::parse(spec);
    const bool none = plan.kind == stratum::IoFaultPlan::Kind::None;
    if (plan.at_block < 0 || (none && !spec.empty())) {
      std::fprintf(stderr, "[fuzz.io_fault_plan] bad plan from a %zu-byte spec\n", size);
      std::abort();
    }
  } catch (const stratum::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[fuzz.io_fault_plan] unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
