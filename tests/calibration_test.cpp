// Tests for src/plan/calibration: measured numbers are positive, the cache returns identical
// numbers for the same key and keeps entries for different keys apart, refresh re-measures,
// corrupt or unwritable caches never fail a run, bad offload directories fail with one line.
// Never asserts on how fast anything is. Small disk tests (8 MiB) and a short GEMM time keep it fast.
#include "plan/calibration.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using stratum::testing::TempDir;

// Sets (or, with nullopt, unsets) an environment variable for the scope, then restores it.
class EnvGuard {
 public:
  EnvGuard(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

CalibrationOptions small_options(const TempDir& tmp) {
  const std::string offload = tmp.file("offload");
  std::filesystem::create_directories(offload);
  CalibrationOptions o;
  o.offload_dir = offload;
  o.threads = 1;
  o.cache_path = tmp.file("cache/calibration.json");
  o.disk_test_bytes = std::size_t{8} << 20;
  o.gemm_time_ms = 40;
  return o;
}

void expect_measured(const Calibration& c, const CalibrationOptions& o) {
  EXPECT_FALSE(c.from_cache);
  EXPECT_GT(c.gemm_gflops, 0.0);
  EXPECT_GT(c.disk_read_gbps, 0.0);
  EXPECT_GT(c.disk_write_gbps, 0.0);
  EXPECT_GT(c.mem_gbps, 0.0);
  EXPECT_EQ(c.threads, o.threads);
  EXPECT_EQ(c.disk_test_bytes, o.disk_test_bytes);
  EXPECT_EQ(c.device, calibration_device(o.offload_dir));
  EXPECT_NE(c.cpu.find("hardware threads"), std::string::npos) << c.cpu;
  EXPECT_FALSE(c.blas.empty());
}

void expect_same_numbers(const Calibration& got, const Calibration& want) {
  EXPECT_EQ(got.gemm_gflops, want.gemm_gflops);
  EXPECT_EQ(got.disk_read_gbps, want.disk_read_gbps);
  EXPECT_EQ(got.disk_write_gbps, want.disk_write_gbps);
  EXPECT_EQ(got.mem_gbps, want.mem_gbps);
  EXPECT_EQ(got.disk_direct, want.disk_direct);
  EXPECT_EQ(got.threads, want.threads);
  EXPECT_EQ(got.device, want.device);
  EXPECT_EQ(got.cpu, want.cpu);
  EXPECT_EQ(got.blas, want.blas);
  EXPECT_EQ(got.disk_test_bytes, want.disk_test_bytes);
}

nlohmann::json cache_json(const std::string& path) { return nlohmann::json::parse(file_read_all(path)); }

TEST(Calibration, MeasuresThenCachesThenRefreshes) {
  TempDir tmp;
  CalibrationOptions o = small_options(tmp);
  o.cache_path.clear();  // the default path, under $STRATUM_CACHE_DIR
  const EnvGuard cache_dir("STRATUM_CACHE_DIR", tmp.file("env_cache"));
  const std::string cache_path = tmp.file("env_cache/calibration.json");

  const Calibration first = calibrate(o);
  expect_measured(first, o);
  EXPECT_EQ(first.note, "");
  ASSERT_TRUE(file_exists(cache_path));
  EXPECT_TRUE(std::filesystem::is_empty(o.offload_dir)) << "the disk test file must be removed";

  const Calibration second = calibrate(o);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.note, "");
  expect_same_numbers(second, first);

  o.refresh = true;
  const Calibration refreshed = calibrate(o);
  expect_measured(refreshed, o);
  EXPECT_EQ(cache_json(cache_path)["entries"].size(), 1u) << "refresh replaces the entry";

  o.refresh = false;
  const Calibration again = calibrate(o);
  EXPECT_TRUE(again.from_cache);
  expect_same_numbers(again, refreshed);
}

// A small offload disk that the run fits on is measured with a file of a quarter of its free
// space, saying the numbers are rough (it was refused: the test file wanted 256 MiB); below
// 4 MiB free it cannot be measured at all, in one line.
TEST(Calibration, ASmallDiskIsMeasuredWithASmallerFile) {
  TempDir tmp;
  CalibrationOptions o = small_options(tmp);
  o.disk_test_bytes = std::size_t{256} << 20;
  o.free_bytes_override = std::size_t{64} << 20;
  const Calibration c = calibrate(o);
  EXPECT_EQ(c.disk_test_bytes, std::size_t{16} << 20);
  EXPECT_GT(c.disk_read_gbps, 0.0);
  EXPECT_NE(c.note.find("measured with a 16 MiB file (64 MiB free"), std::string::npos) << c.note;
  EXPECT_NE(c.note.find("rough"), std::string::npos) << c.note;
  o.free_bytes_override = std::size_t{3} << 20;
  try {
    calibrate(o);
    ADD_FAILURE() << "3 MiB free was measured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too little to measure the disk"), std::string::npos) << e.what();
  }
}

TEST(Calibration, EntriesAreKeyedByThreads) {
  TempDir tmp;
  CalibrationOptions o = small_options(tmp);
  const Calibration one = calibrate(o);
  o.threads = 2;
  const Calibration two = calibrate(o);
  EXPECT_FALSE(two.from_cache) << "an entry for 1 thread must not answer for 2";
  EXPECT_EQ(two.threads, 2);
  EXPECT_EQ(cache_json(o.cache_path)["entries"].size(), 2u);

  o.threads = 1;
  const Calibration one_again = calibrate(o);
  EXPECT_TRUE(one_again.from_cache);
  expect_same_numbers(one_again, one);
  o.threads = 2;
  const Calibration two_again = calibrate(o);
  EXPECT_TRUE(two_again.from_cache);
  expect_same_numbers(two_again, two);
}

TEST(Calibration, CorruptCacheIsIgnoredAndRewritten) {
  TempDir tmp;
  const CalibrationOptions o = small_options(tmp);
  const std::filesystem::path cache_dir = std::filesystem::path(o.cache_path).parent_path();
  std::filesystem::create_directories(cache_dir);
  const std::vector<std::string> corrupt = {
      "",
      "{\"version\": 1, \"entries\": [",
      "\x01\xff garbage",
      "{\"version\": 1, \"entries\": {}}",
      "{\"version\": 99, \"entries\": []}",
  };
  for (const std::string& text : corrupt) {
    SCOPED_TRACE("cache file: " + text);
    file_write_atomic(o.cache_path, text);
    const Calibration c = calibrate(o);
    expect_measured(c, o);
    EXPECT_NE(c.note.find("ignored"), std::string::npos) << c.note;
    const nlohmann::json rewritten = cache_json(o.cache_path);
    EXPECT_EQ(rewritten["version"], 1);
    EXPECT_EQ(rewritten["entries"].size(), 1u);
    const Calibration cached = calibrate(o);
    EXPECT_TRUE(cached.from_cache);
    expect_same_numbers(cached, c);
  }
}

TEST(Calibration, MatchingEntryWithBadNumbersIsRemeasured) {
  TempDir tmp;
  const CalibrationOptions o = small_options(tmp);
  const Calibration c = calibrate(o);
  // The same key with a number that is not positive, another key's valid entry, and a non-object.
  nlohmann::json root = cache_json(o.cache_path);
  nlohmann::json other = root["entries"][0];
  other["threads"] = 7;
  root["entries"][0]["gemm_gflops"] = -1.0;
  root["entries"].push_back(other);
  root["entries"].push_back(42);
  file_write_atomic(o.cache_path, root.dump());

  const Calibration again = calibrate(o);
  EXPECT_FALSE(again.from_cache);
  EXPECT_NE(again.note.find("malformed"), std::string::npos) << again.note;
  const nlohmann::json rewritten = cache_json(o.cache_path);
  ASSERT_EQ(rewritten["entries"].size(), 2u) << "the other key's entry is kept, the bad one replaced";
  EXPECT_EQ(rewritten["entries"][0]["threads"], 7);
  EXPECT_GT(rewritten["entries"][1]["gemm_gflops"].get<double>(), 0.0);
  (void)c;
}

TEST(Calibration, UnwritableCacheIsNotAnError) {
  TempDir tmp;
  CalibrationOptions o = small_options(tmp);
  file_write_atomic(tmp.file("not_a_dir"), "x");
  o.cache_path = tmp.file("not_a_dir/calibration.json");  // its directory cannot be created
  const Calibration first = calibrate(o);
  expect_measured(first, o);
  EXPECT_NE(first.note.find("cannot write"), std::string::npos) << first.note;
  const Calibration second = calibrate(o);
  EXPECT_FALSE(second.from_cache);
}

TEST(Calibration, BadOffloadDirIsAClearError) {
  TempDir tmp;
  CalibrationOptions o = small_options(tmp);
  const auto expect_error = [&](const std::string& dir, const std::string& says) {
    o.offload_dir = dir;
    try {
      calibrate(o);
      ADD_FAILURE() << "no error for " << dir;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("[calibrate] ", 0), 0u) << message;
      EXPECT_NE(message.find(dir), std::string::npos) << message;
      EXPECT_NE(message.find(says), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  };
  expect_error(tmp.file("missing"), "does not exist");
  file_write_atomic(tmp.file("plain_file"), "x");
  expect_error(tmp.file("plain_file"), "not a directory");
  o.offload_dir.clear();
  EXPECT_THROW(calibrate(o), Error);
  EXPECT_FALSE(file_exists(o.cache_path)) << "nothing is cached for a failed calibration";
}

TEST(Calibration, DeviceKeyNamesDeviceAndFileSystem) {
  TempDir tmp;
  const std::string key = calibration_device(tmp.path());
  EXPECT_TRUE(std::regex_match(key, std::regex(R"(dev [0-9]+:[0-9]+( \([^)]+\))? \S.*)"))) << key;
  EXPECT_EQ(calibration_device(tmp.path() + "/"), key);
  EXPECT_THROW(calibration_device(tmp.file("missing")), Error);
}

TEST(Calibration, DefaultCachePathFollowsEnvironment) {
  const EnvGuard stratum_dir("STRATUM_CACHE_DIR", std::nullopt);
  const EnvGuard xdg("XDG_CACHE_HOME", std::nullopt);
  const EnvGuard home("HOME", std::nullopt);
  EXPECT_EQ(calibration_default_cache_path(), "");
  {
    const EnvGuard h("HOME", std::string("/home/u"));
    EXPECT_EQ(calibration_default_cache_path(), "/home/u/.cache/stratum/calibration.json");
    const EnvGuard x("XDG_CACHE_HOME", std::string("/xdg"));
    EXPECT_EQ(calibration_default_cache_path(), "/xdg/stratum/calibration.json");
    const EnvGuard empty("STRATUM_CACHE_DIR", std::string(""));
    EXPECT_EQ(calibration_default_cache_path(), "/xdg/stratum/calibration.json") << "empty is unset";
    const EnvGuard s("STRATUM_CACHE_DIR", std::string("/c"));
    EXPECT_EQ(calibration_default_cache_path(), "/c/calibration.json");
  }
}

}  // namespace
}  // namespace stratum
