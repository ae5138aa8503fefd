// libFuzzer target for the calibration cache reader (calibration.json, Note [calibration cache]).
// The reader (cache_read/entry_parse in plan/calibration.cpp) is private; its one public caller,
// calibrate(), measures the machine (~0.5 s) whenever the cache has no entry for this run's key.
// So every input is made a cache that is certain to hit: the input must be one JSON value (else it
// is skipped); a JSON array stands for a list of entries, any other value for one entry, and the
// target writes {"version": 1, "entries": [<the input's entries, bytes unchanged>, <a valid entry
// for this run's key>]} to a per-process temporary file and calls calibrate() with it as the cache
// (offload dir: a per-process temporary directory). The strings "@device", "@cpu" and "@blas" in
// the input stand for this run's key, so seeds can hold entries that match it. The key is found
// once at start-up by one real calibration with a 4 KiB disk test (Note [calibration fuzz key]).
// Caps its stack at 128 KiB (Note [fuzz stack limit] in fuzz_file.h).
// Pass: calibrate() returns a cached (not measured) result for the key, with finite positive
// numbers. Fail: it throws (the cache never makes it throw), measures, returns another key or a
// bad number, a BugError or other exception, or a sanitizer report. Does not fuzz the file's top
// level (version, shape, invalid JSON: those make a cache miss) nor the writer. Run with
// tools/fuzz.sh.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "fuzz_file.h"
#include "plan/calibration.h"
#include "stratum/error.h"

namespace {

using nlohmann::json;
using stratum::fuzz::FuzzFile;

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.calibration] %s\n", what.c_str());
  std::abort();
}

// The offload directory calibrate() checks (and measures once): per process, removed at exit.
class FuzzDir {
 public:
  FuzzDir()
      : path_((std::filesystem::temp_directory_path() /
               ("stratum_fuzz_" + std::to_string(::getpid()) + "_calibration.d")).string()) {
    std::error_code ec;
    std::filesystem::create_directories(path_, ec);
    if (ec) fuzz_fail("cannot create " + path_ + ": " + ec.message());
  }
  FuzzDir(const FuzzDir&) = delete;
  FuzzDir& operator=(const FuzzDir&) = delete;
  ~FuzzDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Note [calibration fuzz key]
// A cache entry is used only when its key (device of the offload dir, CPU description, BLAS
// description, threads, disk test size) equals the run's. The CPU description is private to
// calibration.cpp, so the key is taken from one real calibrate() at start-up (refresh, 4 KiB
// disk test, 1 ms GEMM budget: well under a second), never from a copy of its code.
struct Setup {
  FuzzDir dir;
  stratum::CalibrationOptions options;  // cache_path set per input
  stratum::Calibration key;
  std::string hit_entry;  // a valid entry for `key`, as JSON text
};
Setup* g_setup = nullptr;

stratum::CalibrationOptions options_for(const std::string& dir, const std::string& cache_path) {
  stratum::CalibrationOptions options;
  options.offload_dir = dir;
  options.threads = 1;
  options.cache_path = cache_path;
  options.disk_test_bytes = 4096;
  options.gemm_time_ms = 1;
  return options;
}

void setup_create() {
  static Setup setup;
  const std::string bootstrap = setup.dir.path() + "/bootstrap.json";
  setup.options = options_for(setup.dir.path(), bootstrap);
  setup.options.refresh = true;
  try {
    setup.key = stratum::calibrate(setup.options);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("start-up calibration failed: ") + e.what());
  }
  setup.options.refresh = false;
  std::error_code ec;
  std::filesystem::remove(bootstrap, ec);
  const json entry = {
      {"device", setup.key.device},
      {"cpu", setup.key.cpu},
      {"blas", setup.key.blas},
      {"threads", static_cast<std::uint64_t>(setup.key.threads)},
      {"disk_test_bytes", static_cast<std::uint64_t>(setup.key.disk_test_bytes)},
      {"disk_direct", false},
      {"gemm_gflops", 1.5},
      {"disk_read_gbps", 2.5},
      {"disk_write_gbps", 3.5},
      {"mem_gbps", 4.5},
  };
  setup.hit_entry = entry.dump();
  g_setup = &setup;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

// The cache file for `value` (one JSON value): its entries first, bytes unchanged, then the hit
// entry. Falls back to re-serialising when splicing does not give valid JSON (a leading BOM).
std::string cache_text(const std::string& value, const std::string& hit_entry) {
  constexpr const char* kSpace = " \t\r\n";
  const std::size_t first = value.find_first_not_of(kSpace);
  const std::size_t last = value.find_last_not_of(kSpace);
  std::string entries = value;
  if (first != std::string::npos && value[first] == '[' && value[last] == ']')
    entries = value.substr(first + 1, last - first - 1);  // a list of entries
  const bool none = entries.find_first_not_of(kSpace) == std::string::npos;
  std::string text = "{\"version\": 1, \"entries\": [" + entries + (none ? "" : ",\n") + hit_entry + "]}";
  if (json::accept(text)) return text;
  const json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fuzz_fail("json::accept took a value json::parse rejects");
  json list = parsed.is_array() ? parsed : json::array({parsed});
  list.push_back(json::parse(hit_entry));
  return json({{"version", 1}, {"entries", list}}).dump();
}

bool positive_finite(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

// Finds the key (Note [calibration fuzz key]), then caps the stack (Note [fuzz stack limit] in
// fuzz_file.h): after the start-up calibration, so that threads it starts get the usual stack.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setup_create();
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string value(reinterpret_cast<const char*>(data), size);
  const stratum::Calibration& key = g_setup->key;
  replace_all(value, "\"@device\"", json(key.device).dump());
  replace_all(value, "\"@cpu\"", json(key.cpu).dump());
  replace_all(value, "\"@blas\"", json(key.blas).dump());
  if (!json::accept(value)) return 0;  // not one JSON value: the cache would be ignored (a miss)
  static FuzzFile file("calibration.json");
  const std::string text = cache_text(value, g_setup->hit_entry);
  stratum::CalibrationOptions options = g_setup->options;
  options.cache_path = file.write(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  stratum::Calibration c;
  try {
    c = stratum::calibrate(options);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const std::exception& e) {
    fuzz_fail(std::string("calibrate threw on a cache file (the cache never throws): ") + e.what());
  }
  if (!c.from_cache) fuzz_fail("measured although the cache holds a valid entry for the key");
  if (c.device != key.device || c.cpu != key.cpu || c.blas != key.blas || c.threads != key.threads ||
      c.disk_test_bytes != key.disk_test_bytes)
    fuzz_fail("returned a cached entry for another key: device '" + c.device + "', cpu '" + c.cpu + "', blas '" +
              c.blas + "', threads " + std::to_string(c.threads) + ", disk_test_bytes " +
              std::to_string(c.disk_test_bytes));
  if (!positive_finite(c.gemm_gflops) || !positive_finite(c.disk_read_gbps) ||
      !positive_finite(c.disk_write_gbps) || !positive_finite(c.mem_gbps))
    fuzz_fail("returned a cached entry with a number that is not finite and positive: gemm " +
              std::to_string(c.gemm_gflops) + ", read " + std::to_string(c.disk_read_gbps) + ", write " +
              std::to_string(c.disk_write_gbps) + ", mem " + std::to_string(c.mem_gbps));
  return 0;
}
