// libFuzzer target for the checkpoint manifest reader (manifest.json): parses the input as text
// with manifest_parse. An accepted manifest must round-trip (manifest_json, parsed again, gives
// the same JSON) and keep the parser's promises: step >= 1, 1 to 64 files, every name a plain
// file name (1 to 255 bytes, no '/', not "." or "..", no NUL) and listed once. Caps its stack at
// 128 KiB (Note [fuzz stack limit] in fuzz_file.h).
// Pass: success or stratum::Error. Fail: any other exception, a BugError, a round trip that
// fails or differs, a broken promise, or a sanitizer report. Run with tools/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <string>

#include "fuzz_file.h"
#include "stratum/error.h"
#include "train/checkpoint.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.checkpoint_manifest] %s\n", what.c_str());
  std::abort();
}

void manifest_check(const stratum::CheckpointManifest& m) {
  if (m.step < 1) fuzz_fail("accepted step " + std::to_string(m.step));
  if (m.files.empty() || m.files.size() > 64)
    fuzz_fail("accepted a manifest of " + std::to_string(m.files.size()) + " files");
  std::set<std::string> names;
  for (const stratum::ManifestEntry& e : m.files) {
    if (e.name.empty() || e.name.size() > 255 || e.name == "." || e.name == ".." ||
        e.name.find('/') != std::string::npos || e.name.find('\0') != std::string::npos)
      fuzz_fail("accepted file name '" + e.name.substr(0, 60) + "' (not a plain file name)");
    if (!names.insert(e.name).second) fuzz_fail("accepted file name '" + e.name.substr(0, 60) + "' twice");
  }
}

}  // namespace

// Caps the stack: see Note [fuzz stack limit] in fuzz_file.h.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // What checkpoint_write writes must read back as the same manifest.
  stratum::fuzz::fuzz_parse_and_round_trip(text, "manifest", stratum::manifest_parse, stratum::manifest_json,
                                           manifest_check, fuzz_fail);
  return 0;
}
