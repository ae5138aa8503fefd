// calibrate() and its cache; see calibration.h.
//
// Note [calibration cache]: one JSON file, {"version": 1, "entries": [entry, ...]}, each entry
// holding its key (device, cpu, blas, threads, disk_test_bytes) and its numbers. A lookup takes
// the entry whose key equals this run's; an entry with missing or ill-typed fields, or a number
// that is not finite and positive, counts as absent. A file that cannot be parsed, or whose
// top level has another shape, is ignored (with a note) and replaced by the next store. Stores
// re-read the file, drop entries with the same key and write the whole list atomically
// (file_write_atomic), so a crash never leaves half a file; two processes storing at once can
// lose one entry, which only costs a re-measurement. Nothing about the cache ever throws.
#include "plan/calibration.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/aligned_buffer.h"
#include "core/file_descriptor.h"
#include "core/file_util.h"
#include "formats/json_fields.h"
#include "io/io_engine.h"
#include "kernels/cpu/matmul.h"
#include "core/simd.h"
#include "stratum/error.h"

namespace stratum {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kCacheVersion = 1;

double seconds_between(Clock::time_point begin, Clock::time_point end) {
  return std::chrono::duration<double>(end - begin).count();
}

double median(std::vector<double> values) {
  STRATUM_ASSERT(!values.empty());
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string env_nonempty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

// Deterministic fill in [-0.05, 0.05): finite, no denormals, so sgemm speed does not depend on data.
// Each element is a hash of its index (no serial dependency, so the loop vectorises).
void fill_pattern(float* data, std::size_t count, std::uint32_t seed) {
  const std::uint32_t offset = seed * 0x9E3779B9u;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t h = (static_cast<std::uint32_t>(i) + offset) * 2654435761u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    data[i] = (static_cast<float>(h >> 8) * 0x1.0p-24f - 0.5f) * 0.1f;
  }
}

// ---- device and cpu descriptions ----

std::string fs_type_name(unsigned long magic) {
  switch (magic) {
    case 0xEF53: return "ext4";  // ext2/3/4 share the magic
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0xF2F52010: return "f2fs";
    case 0x2FC12FC1: return "zfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    default: break;
  }
  char text[32];
  std::snprintf(text, sizeof text, "fs 0x%lx", magic);
  return text;
}

// DEVNAME from /sys/dev/block/MAJ:MIN/uevent, or "" (no such block device, e.g. tmpfs, btrfs).
std::string block_device_name(unsigned major_id, unsigned minor_id) {
  const std::string path = "/sys/dev/block/" + std::to_string(major_id) + ":" + std::to_string(minor_id) + "/uevent";
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return "";
  std::string name;
  char line[512];
  while (std::fgets(line, sizeof line, file) != nullptr) {
    if (std::strncmp(line, "DEVNAME=", 8) != 0) continue;
    name = line + 8;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    break;
  }
  std::fclose(file);
  return name;
}

std::string cpu_describe() {
  std::string model;
  if (std::FILE* file = std::fopen("/proc/cpuinfo", "r")) {
    char line[1024];
    // x86: "model name"; some ARM kernels: "Hardware" or "Processor"; MIPS: "cpu model".
    static constexpr const char* kKeys[] = {"model name", "Hardware", "Processor", "cpu model"};
    int best = static_cast<int>(std::size(kKeys));
    while (std::fgets(line, sizeof line, file) != nullptr) {
      for (int k = 0; k < best; ++k) {
        const std::size_t len = std::strlen(kKeys[k]);
        if (std::strncmp(line, kKeys[k], len) != 0) continue;
        const char* colon = std::strchr(line + len, ':');
        if (colon == nullptr) continue;
        std::string value = colon + 1;
        const std::size_t first = value.find_first_not_of(" \t\r\n");
        const std::size_t last = value.find_last_not_of(" \t\r\n");
        if (first == std::string::npos) continue;
        model = value.substr(first, last - first + 1);
        best = k;
        break;
      }
      if (best == 0) break;
    }
    std::fclose(file);
  }
  if (model.empty()) model = "unknown cpu";
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  const unsigned hardware_threads = online > 0 ? static_cast<unsigned>(online) : std::thread::hardware_concurrency();
  return model + ", " + std::to_string(hardware_threads) + " hardware threads";
}

// ---- measurements ----

// Median GFLOP/s over sgemm calls on the shapes of a GPT-2 small MLP matmul with 1024 rows
// (forward nn, input-gradient nt, weight-gradient tn: the three calls of matmul_forward/backward),
// round-robin after one warm-up call until about `time_ms` have passed in all (at least three
// timed calls). On a machine so slow that one call takes more than a quarter of the time, the row
// count shrinks (not below 128) to keep the total short.
double gemm_measure(int time_ms) {
  constexpr int kRows = 1024, kIn = 768, kOut = 3072;  // M, K, N
  constexpr int kMinCalls = 3, kMaxCalls = 64;
  const auto count = [](int a, int b) { return static_cast<std::size_t>(a) * static_cast<std::size_t>(b); };
  AlignedBuffer inp(count(kRows, kIn) * sizeof(float));     // (M,K) fp32
  AlignedBuffer w(count(kIn, kOut) * sizeof(float));        // (K,N) fp32
  AlignedBuffer dout(count(kRows, kOut) * sizeof(float));   // (M,N) fp32
  AlignedBuffer out(count(kRows, kOut) * sizeof(float));    // (M,N) fp32, forward output
  AlignedBuffer dinp(count(kRows, kIn) * sizeof(float));    // (M,K) fp32
  AlignedBuffer dw(count(kIn, kOut) * sizeof(float));       // (K,N) fp32
  fill_pattern(inp.as_f32(), count(kRows, kIn), 1);
  fill_pattern(w.as_f32(), count(kIn, kOut), 2);
  fill_pattern(dout.as_f32(), count(kRows, kOut), 3);
  std::memset(out.data(), 0, out.size_bytes());  // touch every page before timing
  std::memset(dinp.data(), 0, dinp.size_bytes());
  std::memset(dw.data(), 0, dw.size_bytes());

  int rows = kRows;
  const auto call = [&](int variant) {
    switch (variant) {
      case 0: sgemm(false, false, rows, kOut, kIn, 1.0f, inp.as_f32(), kIn, w.as_f32(), kOut, 0.0f, out.as_f32(), kOut); break;
      case 1: sgemm(false, true, rows, kIn, kOut, 1.0f, dout.as_f32(), kOut, w.as_f32(), kOut, 0.0f, dinp.as_f32(), kIn); break;
      default: sgemm(true, false, kIn, kOut, rows, 1.0f, inp.as_f32(), kIn, dout.as_f32(), kOut, 0.0f, dw.as_f32(), kOut); break;
    }
  };
  const double budget_s = std::max(1, time_ms) * 1e-3;
  const Clock::time_point begin = Clock::now();
  call(0);  // BLAS threads start, buffers come into cache
  const double warm_s = seconds_between(begin, Clock::now());
  if (warm_s > budget_s / 4) {
    const double scaled = kRows * (budget_s / 4) / warm_s;
    rows = std::max(128, static_cast<int>(scaled / 64) * 64);
  }
  const double flop = 2.0 * rows * kIn * kOut;  // the same for all three variants
  std::vector<double> gflops;
  for (int i = 0; i < kMaxCalls; ++i) {
    const Clock::time_point t0 = Clock::now();
    call(i % 3);
    const Clock::time_point t1 = Clock::now();
    const double call_s = seconds_between(t0, t1);
    gflops.push_back(flop / std::max(call_s, 1e-9) * 1e-9);
    // Stop when the next call would end past the budget.
    if (i + 1 >= kMinCalls && seconds_between(begin, t1) + call_s > budget_s) break;
  }
  return median(gflops);
}

// x = a*x + y: the read-modify-write pattern of the optimizer kernels (AdamW updates its
// params and moments in place), vectorised like them.
STRATUM_SIMD_CLONES
void scale_add(float* x, const float* y, std::size_t n, float a) {
  for (std::size_t i = 0; i < n; ++i) x[i] = a * x[i] + y[i];
}

// Median over passes of scale_add on two 64 MiB arrays (well beyond the last-level cache),
// one thread; counts 8 bytes read and 4 written per element.
double mem_measure() {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  constexpr std::size_t kCount = kBytes / sizeof(float);
  constexpr int kPasses = 3;
  AlignedBuffer x(kBytes), y(kBytes);  // (kCount) fp32 each; x converges to 2*y = 1
  std::fill(x.as_f32(), x.as_f32() + kCount, 1.0f);
  std::fill(y.as_f32(), y.as_f32() + kCount, 0.5f);
  scale_add(x.as_f32(), y.as_f32(), kCount, 0.5f);  // warm-up
  std::vector<double> gbps;
  for (int pass = 0; pass < kPasses; ++pass) {
    const Clock::time_point t0 = Clock::now();
    scale_add(x.as_f32(), y.as_f32(), kCount, 0.5f);
    const double s = seconds_between(t0, Clock::now());
    gbps.push_back(3.0 * static_cast<double>(kBytes) / std::max(s, 1e-9) * 1e-9);
  }
  volatile float sink = x.as_f32()[kCount / 2];  // the passes' results are observed
  (void)sink;
  return median(gbps);
}

struct DiskNumbers {
  double read_gbps = 0, write_gbps = 0;
  bool direct = false;
};

// Moves the whole file once in `op` through `engine`: requests of `chunk` bytes, up to
// buffers.size() in flight (one buffer each), so the engine's queue never drains between
// requests. Every ticket is waited for before returning or throwing: none outlives its buffer.
void disk_pass(IoEngine& engine, IoOp op, int fd, std::size_t total_bytes, std::size_t chunk_bytes,
               std::vector<AlignedBuffer>& buffers, std::vector<std::uint64_t>& block_sums, const std::string& what) {
  std::deque<std::shared_ptr<IoTicket>> in_flight;
  try {
    std::size_t index = 0;
    for (std::size_t offset = 0; offset < total_bytes; offset += chunk_bytes, ++index) {
      if (in_flight.size() == buffers.size()) {
        in_flight.front()->wait();
        in_flight.pop_front();
      }
      IoRequest request;
      request.op = op;
      request.fd = fd;
      request.offset = offset;
      request.buffer = buffers[index % buffers.size()].data();
      request.size_bytes = std::min(chunk_bytes, total_bytes - offset);
      request.block_sums = block_sums.data() + offset / engine.block_bytes();
      request.what = what;
      in_flight.push_back(engine.submit(std::move(request)));
    }
    while (!in_flight.empty()) {
      in_flight.front()->wait();
      in_flight.pop_front();
    }
  } catch (...) {
    for (const std::shared_ptr<IoTicket>& ticket : in_flight) {
      try {
        ticket->wait();
      } catch (...) {  // the first error is the one reported
      }
    }
    throw;
  }
}

// Fills a fresh, preallocated file of `bytes` in `dir` (as the store's offload files are) once
// untimed, then times a second write of it plus fsync, drops it from the page cache and times
// reading it back (checksums verified), with the engine the store would use: O_DIRECT when the
// file system takes it, default block size and queue depth. The timed write overwrites written
// blocks, as the store does after its first step (writing into fresh preallocated extents costs
// the file system extra work: 15-30% slower on ext4 here). The file is removed on every path out.
DiskNumbers disk_measure(const std::string& dir, std::size_t bytes) {
  stale_planner_files_remove(dir);  // Note [stale plan directories] (plan/calibration.h)
  DiskNumbers numbers;
  numbers.direct = io_direct_supported(dir);
  IoEngineOptions io;
  if (!numbers.direct) io.backend = IoBackend::Threads;  // as TieredSegmentStore does
  std::string notes;
  const std::unique_ptr<IoEngine> engine = IoEngine::create(io, &notes);
  const std::size_t block = engine->block_bytes();
  const std::size_t chunk = std::min(bytes, block * static_cast<std::size_t>(std::max(1, engine->queue_depth())));
  const std::size_t buffer_count = std::min<std::size_t>(2, (bytes + chunk - 1) / chunk);
  std::vector<AlignedBuffer> buffers;
  for (std::size_t b = 0; b < buffer_count; ++b) {
    buffers.emplace_back(chunk);
    fill_pattern(static_cast<float*>(buffers.back().data()), chunk / sizeof(float), 10 + static_cast<std::uint32_t>(b));
  }
  std::vector<std::uint64_t> block_sums((bytes + block - 1) / block, 0);

  const std::string path = dir + "/.stratum-calibrate." + std::to_string(::getpid()) + ".tmp";
  const FileUnlinkGuard remove_file(path);  // declared before the file exists: removed on every path out
  FileDescriptor fd(io_open_file(path, numbers.direct));
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    STRATUM_CHECK(err != ENOSPC, "[calibrate] no space on the device of --offload-dir ", dir, " for the ", bytes,
                  "-byte disk test file: free space or choose another directory");
    STRATUM_CHECK(err == EOPNOTSUPP || err == ENOSYS, "[calibrate] cannot allocate ", bytes, " bytes for ", path,
                  ": ", std::strerror(err));
  }
  const std::string what = "calibration test file (" + path + ")";

  disk_pass(*engine, IoOp::Write, fd.get(), bytes, chunk, buffers, block_sums, what);  // untimed first fill
  STRATUM_CHECK(::fsync(fd.get()) == 0, "[calibrate] cannot fsync ", path, ": ", std::strerror(errno));
  const Clock::time_point write_begin = Clock::now();
  disk_pass(*engine, IoOp::Write, fd.get(), bytes, chunk, buffers, block_sums, what);
  STRATUM_CHECK(::fsync(fd.get()) == 0, "[calibrate] cannot fsync ", path, ": ", std::strerror(errno));
  const double write_s = seconds_between(write_begin, Clock::now());
  // Buffered fallback only: drop the file's pages so reads come from the device where possible.
  if (!numbers.direct) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);

  const Clock::time_point read_begin = Clock::now();
  disk_pass(*engine, IoOp::Read, fd.get(), bytes, chunk, buffers, block_sums, what);
  const double read_s = seconds_between(read_begin, Clock::now());

  numbers.write_gbps = static_cast<double>(bytes) / std::max(write_s, 1e-9) * 1e-9;
  numbers.read_gbps = static_cast<double>(bytes) / std::max(read_s, 1e-9) * 1e-9;
  return numbers;
}

// ---- cache (Note [calibration cache]) ----

// The entry as a Calibration, or nothing when any field is missing, ill-typed or out of range
// (a cache entry that does not parse is measured again, never an error).
std::optional<Calibration> entry_parse(const json& entry) {
  if (!entry.is_object()) return std::nullopt;
  try {
    const JsonFields f(entry, "calibration cache entry", "plan");
    constexpr double kTiny = std::numeric_limits<double>::min(), kHuge = std::numeric_limits<double>::max();
    Calibration c;
    c.device = f.str("device");
    c.cpu = f.str("cpu");
    c.blas = f.str("blas");
    c.threads = static_cast<int>(f.integer("threads", 1, 1 << 20));
    c.disk_test_bytes =
        static_cast<std::size_t>(f.integer("disk_test_bytes", 0, std::numeric_limits<std::int64_t>::max()));
    c.disk_direct = f.boolean("disk_direct");
    c.gemm_gflops = f.number("gemm_gflops", kTiny, kHuge);
    c.disk_read_gbps = f.number("disk_read_gbps", kTiny, kHuge);
    c.disk_write_gbps = f.number("disk_write_gbps", kTiny, kHuge);
    c.mem_gbps = f.number("mem_gbps", kTiny, kHuge);
    return c;
  } catch (const Error&) {
    return std::nullopt;
  }
}

bool key_equal(const Calibration& a, const Calibration& b) {
  return a.device == b.device && a.cpu == b.cpu && a.blas == b.blas && a.threads == b.threads &&
         a.disk_test_bytes == b.disk_test_bytes;
}

json entry_make(const Calibration& c) {
  json entry = json::object();
  entry["device"] = c.device;
  entry["cpu"] = c.cpu;
  entry["blas"] = c.blas;
  entry["threads"] = static_cast<std::uint64_t>(c.threads);
  entry["disk_test_bytes"] = static_cast<std::uint64_t>(c.disk_test_bytes);
  entry["disk_direct"] = c.disk_direct;
  entry["gemm_gflops"] = c.gemm_gflops;
  entry["disk_read_gbps"] = c.disk_read_gbps;
  entry["disk_write_gbps"] = c.disk_write_gbps;
  entry["mem_gbps"] = c.mem_gbps;
  entry["measured_unix_s"] = static_cast<std::int64_t>(std::time(nullptr));
  return entry;
}

// The cache's valid entries; `problem` says why the file (or some entries) were ignored.
struct CacheContents {
  std::vector<json> entries;
  std::string problem;
};

CacheContents cache_read(const std::string& path) {
  CacheContents contents;
  if (path.empty() || !file_exists(path)) return contents;
  std::string text;
  try {
    text = file_read_all(path);
  } catch (const std::exception& e) {
    contents.problem = e.what();
    return contents;
  }
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    contents.problem = "not valid JSON";
    return contents;
  }
  const auto version = root.is_object() ? root.find("version") : root.end();
  const auto entries = root.is_object() ? root.find("entries") : root.end();
  if (!root.is_object() || version == root.end() || !version->is_number_integer() || entries == root.end() ||
      !entries->is_array()) {
    contents.problem = "expected {\"version\": " + std::to_string(kCacheVersion) + ", \"entries\": [...]}";
    return contents;
  }
  if (version->get<std::int64_t>() != kCacheVersion) {
    contents.problem = "version " + std::to_string(version->get<std::int64_t>()) + ", this build reads version " +
                       std::to_string(kCacheVersion);
    return contents;
  }
  std::size_t bad = 0;
  for (const json& entry : *entries) {
    if (entry_parse(entry)) {
      contents.entries.push_back(entry);
    } else {
      ++bad;
    }
  }
  if (bad > 0) contents.problem = std::to_string(bad) + " malformed entr" + (bad == 1 ? "y" : "ies");
  return contents;
}

// Adds (or replaces) `c`'s entry; returns a note when the file cannot be written, else "".
std::string cache_store(const std::string& path, const Calibration& c) {
  if (path.empty()) return "[calibrate] no cache directory ($STRATUM_CACHE_DIR, $XDG_CACHE_HOME, $HOME unset): not cached";
  CacheContents contents = cache_read(path);
  json entries = json::array();
  for (json& entry : contents.entries) {
    const std::optional<Calibration> parsed = entry_parse(entry);
    if (parsed && !key_equal(*parsed, c)) entries.push_back(std::move(entry));
  }
  entries.push_back(entry_make(c));
  json root = json::object();
  root["version"] = kCacheVersion;
  root["entries"] = std::move(entries);
  try {
    const std::size_t slash = path.rfind('/');
    if (slash != std::string::npos && slash > 0) dir_create(path.substr(0, slash));
    file_write_atomic(path, root.dump(2) + "\n");
  } catch (const std::exception& e) {
    return std::string("[calibrate] cannot write the calibration cache (") + e.what() + "): measured again next time";
  }
  return "";
}

}  // namespace

std::string calibration_default_cache_path() {
  constexpr const char* kFile = "/calibration.json";
  if (std::string dir = env_nonempty("STRATUM_CACHE_DIR"); !dir.empty()) return dir + kFile;
  if (std::string dir = env_nonempty("XDG_CACHE_HOME"); !dir.empty()) return dir + "/stratum" + kFile;
  if (std::string dir = env_nonempty("HOME"); !dir.empty()) return dir + "/.cache/stratum" + kFile;
  return "";
}

std::string calibration_device(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    STRATUM_CHECK(errno != ENOENT, "[calibrate] --offload-dir ", dir, " does not exist: create it or choose another");
    STRATUM_FAIL("[calibrate] cannot use --offload-dir ", dir, ": ", std::strerror(errno));
  }
  STRATUM_CHECK(S_ISDIR(st.st_mode), "[calibrate] --offload-dir ", dir, " is not a directory: choose a directory");
  const unsigned major_id = major(st.st_dev), minor_id = minor(st.st_dev);
  std::string key = "dev " + std::to_string(major_id) + ":" + std::to_string(minor_id);
  if (const std::string name = block_device_name(major_id, minor_id); !name.empty()) key += " (" + name + ")";
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) == 0) {
    key += " " + fs_type_name(static_cast<unsigned long>(fs.f_type));
  } else {
    key += " fs unknown";
  }
  return key;
}

Calibration calibrate(const CalibrationOptions& options) {
  STRATUM_CHECK(options.threads >= 1, "[calibrate] threads must be at least 1, got ", options.threads);
  STRATUM_CHECK(options.disk_test_bytes > 0, "[calibrate] the disk test size must be positive, got 0");
  std::string dir = options.offload_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  STRATUM_CHECK(!dir.empty(), "[calibrate] no offload directory given: pass --offload-dir DIR (the disk to measure)");

  Calibration c;
  c.device = calibration_device(dir);  // checks that dir exists and is a directory
  // Checked before the cache is consulted, so a cached entry cannot hide an unusable directory.
  STRATUM_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "[calibrate] --offload-dir ", dir,
                " is not writable (", std::strerror(errno), "): choose another or fix its permissions");
  c.threads = options.threads;
  c.cpu = cpu_describe();
  c.blas = blas_describe();
  c.disk_test_bytes = align_up(options.disk_test_bytes, AlignedBuffer::kAlignmentBytes);
  // A small offload disk the run fits on is measured with a smaller file, not refused.
  const std::size_t free_bytes =
      options.free_bytes_override > 0 ? options.free_bytes_override : dir_free_bytes(dir, "--offload-dir");
  std::string small_note;
  if (free_bytes / 4 < c.disk_test_bytes) {
    const std::size_t fit = free_bytes / 4 / AlignedBuffer::kAlignmentBytes * AlignedBuffer::kAlignmentBytes;
    STRATUM_CHECK(fit >= (std::size_t{1} << 20), "[calibrate] --offload-dir ", dir, " has ", free_bytes >> 10,
                  " KiB free, too little to measure the disk (a 1 MiB test file needs 4 MiB free): free space or "
                  "choose another directory");
    c.disk_test_bytes = fit;
    small_note = "[calibrate] the disk was measured with a " + std::to_string(fit >> 20) + " MiB file (" +
                 std::to_string(free_bytes >> 20) + " MiB free on " + dir + "), so its numbers are rough";
  }
  const std::string cache_path = options.cache_path.empty() ? calibration_default_cache_path() : options.cache_path;

  std::string note;
  if (!cache_path.empty() && !options.refresh) {
    const CacheContents contents = cache_read(cache_path);
    for (const json& entry : contents.entries) {
      std::optional<Calibration> cached = entry_parse(entry);
      if (cached && key_equal(*cached, c)) {
        cached->from_cache = true;
        return *cached;
      }
    }
    if (!contents.problem.empty())
      note = "[calibrate] ignored " + std::string(contents.entries.empty() ? "cache file " : "part of cache file ") +
             cache_path + " (" + contents.problem + "); it is rewritten";
  }

  c.gemm_gflops = gemm_measure(options.gemm_time_ms);
  c.mem_gbps = mem_measure();
  const DiskNumbers disk = disk_measure(dir, c.disk_test_bytes);
  c.disk_read_gbps = disk.read_gbps;
  c.disk_write_gbps = disk.write_gbps;
  c.disk_direct = disk.direct;
  c.from_cache = false;
  const std::string store_note = cache_store(cache_path, c);
  c.note = store_note.empty() ? note : (note.empty() ? store_note : note + "; " + store_note);
  if (!small_note.empty()) c.note = c.note.empty() ? small_note : c.note + "; " + small_note;
  return c;
}

void stale_planner_files_remove(const std::string& parent) {
  // (prefix, what may follow the pid): "" or "-XXXXXX" for directories, ".tmp" for the test file
  constexpr std::pair<std::string_view, std::string_view> kKinds[] = {{"stratum-plan-", "-"},
                                                                      {".stratum-calibrate.", ".tmp"}};
  std::error_code ec;
  for (std::filesystem::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (const auto& [prefix, tail] : kKinds) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const char* digits = name.c_str() + prefix.size();
      char* rest = nullptr;
      const long pid = std::strtol(digits, &rest, 10);
      const std::string_view after(rest);
      const bool named = rest != digits && (tail == "-" ? after.empty() || after.front() == '-' : after == tail);
      if (!named || pid <= 0 || pid == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      std::error_code ignored;
      std::filesystem::remove_all(it->path(), ignored);
    }
  }
}

}  // namespace stratum
