// `stratum train --mem-budget --offload-dir` when things go wrong, run as a user runs it (the real
// binary): a bad offload directory, bad flag combinations, a full disk, I/O errors, short reads,
// corrupted blocks (checksum mismatch), a second run on the same directory. Each must end in one
// clear line "stratum: [component] ..." with exit code 1 (never a crash or exit 70), and leave no
// offload files behind. A full disk mid-run must leave the last checkpoint intact, byte-identical
// to a fault-free run's checkpoint at that step. Faults are injected with STRATUM_IO_FAULT
// (IoFaultPlan::parse in src/io/io_engine.h). Also: a tmpfs offload directory (O_DIRECT accepted
// on newer kernels, buffered I/O on older ones) trains to the same parameters as /tmp and RAM.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "integration_util.h"
#include "train/checkpoint.h"

namespace stratum {
namespace {

using testing::CommandResult;
using testing::run_stratum;
using testing::ScopedEnv;
using testing::TempDir;

// Small enough that a run takes well under a second, big enough that the minimum budget
// (about 14 MiB) is below the 17 MiB of training state, so the run streams through the disk.
constexpr const char* kModel = "--layers 3 --heads 4 --embd 128 --ctx 32 --vocab 4096";
constexpr const char* kLockName = "stratum-offload.lock";

std::string quote(const std::string& s) { return "'" + s + "'"; }

// ~4000 little-endian uint16 token ids < 4096.
std::string write_tokens(const TempDir& dir) {
  return stratum::testing::write_random_tokens(dir.file("tokens.bin"), 4000, 4096, 7);
}

// `train` on the small model with `steps` steps; the caller appends the budget/offload flags.
// Constant LR so that a run of K steps ends in the same state as the first K steps of a longer
// run (the cosine schedule depends on --steps).
std::string train_args(const std::string& tokens, int steps) {
  return std::string("train ") + kModel + " --data " + quote(tokens) + " --batch 2 --seq 32 --steps " +
         std::to_string(steps) + " --threads 2 --quiet --lr-schedule constant";
}

std::string offload_args(long budget_mib, const std::string& dir) {
  return " --mem-budget " + std::to_string(budget_mib) + "M --offload-dir " + quote(dir);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Exit 1 with exactly one error line "stratum: [component] ...", last on stderr, containing every
// word. Before training starts (setup errors) it must be the only line; a failure mid-run may
// follow the trainer's "[stratum] ..." status lines, but nothing else. Returns the error line.
std::string expect_one_error_line(const CommandResult& r, const std::vector<std::string>& words,
                                  bool only_line) {
  EXPECT_EQ(r.exit_code, 1) << "stderr:\n" << r.errors;
  const std::vector<std::string> lines = lines_of(r.errors);
  if (lines.empty()) {
    ADD_FAILURE() << "no error message on stderr (exit " << r.exit_code << ")";
    return {};
  }
  if (only_line) {
    EXPECT_EQ(lines.size(), 1u) << "stderr:\n" << r.errors;
  }
  for (std::size_t i = 0; i + 1 < lines.size(); ++i)
    EXPECT_EQ(lines[i].rfind("[stratum] ", 0), 0u) << "unexpected stderr line " << i << ": " << lines[i];
  const std::string& error = lines.back();
  EXPECT_EQ(error.rfind("stratum: [", 0), 0u) << error;
  EXPECT_FALSE(contains(error, "please report")) << error;
  EXPECT_FALSE(contains(error, "[internal]")) << error;
  EXPECT_EQ(error.find("stratum: ", 1), std::string::npos) << "two errors on one line: " << error;
  for (const std::string& w : words) EXPECT_TRUE(contains(error, w)) << "expected '" << w << "' in: " << error;
  return error;
}

// Every entry of `dir` except those named in `allowed`.
std::vector<std::string> leftovers(const std::string& dir, const std::vector<std::string>& allowed = {}) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

#define EXPECT_DIR_CLEAN(dir, ...)                                         \
  do {                                                                     \
    const std::vector<std::string> left = leftovers(dir, ##__VA_ARGS__);   \
    EXPECT_TRUE(left.empty()) << (dir) << " still holds: " << join(left); \
  } while (0)

std::string params_hash(const CommandResult& r) {
  std::smatch m;
  static const std::regex re("params hash ([0-9a-f]{16})");
  return std::regex_search(r.errors, m, re) ? m[1].str() : std::string();
}

// "[stratum] tier traffic: read X MiB, written Y MiB, ..." -> {X, Y}; {-1, -1} if absent.
std::pair<double, double> tier_traffic_mib(const CommandResult& r) {
  std::smatch m;
  static const std::regex re(R"(\[stratum\] tier traffic: read ([0-9.]+) MiB [^,]*, written ([0-9.]+) MiB)");
  if (!std::regex_search(r.errors, m, re)) return {-1.0, -1.0};
  return {std::stod(m[1].str()), std::stod(m[2].str())};
}

// The minimum --mem-budget (MiB) for train_args(): from the refusal of a 1 MiB budget.
long min_budget_mib() {
  static long cached = [] {
    TempDir tmp;
    const std::string tokens = write_tokens(tmp);
    const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(1, tmp.path()));
    std::smatch m;
    static const std::regex re("use --mem-budget ([0-9]+)M");
    return std::regex_search(r.errors, m, re) ? std::stol(m[1].str()) : -1L;
  }();
  return cached;
}

// Sets an environment variable for the child processes of this scope.
// A run at the minimum budget in `offload` with STRATUM_IO_FAULT=spec (steps: 3).
CommandResult run_with_fault(const std::string& spec, const std::string& tokens, const std::string& offload) {
  const std::string args = train_args(tokens, 3) + offload_args(min_budget_mib(), offload);  // before the fault is set
  ScopedEnv fault("STRATUM_IO_FAULT", spec);
  return run_stratum(args);
}

// ---- budget and directory checks (before any training) ----

TEST(OffloadFault, BudgetBelowMinimumIsRefusedWithTheMinimum) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(1, offload));
  expect_one_error_line(r, {"below the minimum", "use --mem-budget "}, true);
  const long min_mib = min_budget_mib();
  ASSERT_GT(min_mib, 1) << r.errors;
  EXPECT_DIR_CLEAN(offload);

  // The minimum it names works, and with it the run really streams through the disk (the fault
  // tests below rely on that).
  const CommandResult ok = run_stratum(train_args(tokens, 3) + offload_args(min_mib, offload));
  ASSERT_EQ(ok.exit_code, 0) << ok.errors;
  const auto [read_mib, written_mib] = tier_traffic_mib(ok);
  EXPECT_GT(read_mib, 0.0) << ok.errors;
  EXPECT_GT(written_mib, 0.0) << ok.errors;
  EXPECT_DIR_CLEAN(offload);
  // One MiB less than the minimum it names is refused too.
  const CommandResult below = run_stratum(train_args(tokens, 3) + offload_args(min_mib - 1, offload));
  expect_one_error_line(below, {"below the minimum"}, true);
}

TEST(OffloadFault, MissingOffloadDirIsNamed) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string missing = tmp.file("no_such_dir");
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), missing));
  expect_one_error_line(r, {missing, "does not exist"}, true);
  EXPECT_FALSE(std::filesystem::exists(missing));
}

// A disk without room for the run's offloaded state is refused before the plan measures (it was
// refused after the measurement, 46 s on a large model), by train and by plan alike.
TEST(OffloadFault, ADiskTooSmallForTheStateIsRefusedBeforeMeasuring) {
  TempDir tmp;
  const std::string disk = tmp.file("disk");
  const testing::SmallDisk small(disk, "1m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here (not root)";
  const std::string tokens = write_tokens(tmp);
  const CommandResult train = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), disk));
  const CommandResult plan = run_stratum(std::string("plan ") + kModel + " --batch 2 --seq 32" +
                                         offload_args(min_budget_mib(), disk));
  for (const CommandResult* r : {&train, &plan}) {
    expect_one_error_line(*r, {"--offload-dir " + disk + " has", "free but this run needs at least"}, true);
    EXPECT_EQ(r->errors.find("[calibrate]"), std::string::npos) << "refused before measuring the disk: " << r->errors;
  }
}

// A run killed outright (SIGKILL, power loss) leaves its offload files in DIR/stratum-offload.
// They count as free for the next run, which removes them when it takes the directory's lock: a
// crash loop rerunning on a disk with room for one run's files is not refused forever (it was,
// as "has X free but this run needs Y"), and no dead file stays behind.
TEST(OffloadFault, ADeadRunsOffloadFilesAreTheNextRunsSpace) {
  TempDir tmp;
  const std::string disk = tmp.file("disk");
  const testing::SmallDisk small(disk, "24m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here (not root)";
  const std::string tokens = write_tokens(tmp);
  dir_create(disk + "/stratum-offload");
  {
    const int fd = ::open((disk + "/stratum-offload/layer.9.params.bin").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::posix_fallocate(fd, 0, 10 << 20), 0);  // 24 MiB - 10 MiB < the run's 17 MiB
    ::close(fd);
  }
  const CommandResult r = run_stratum(train_args(tokens, 2) + offload_args(min_budget_mib(), disk));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_DIR_CLEAN(disk);
}

// A disk with room to calibrate (4 MiB) but too small even for the plan's one-layer measurement:
// named as the directory given, not the measurement's scratch subdirectory, and not as "this
// run's" need.
// A disk too small for a rank's offload files (its own moments only) is refused before the plan
// measures, for ranks as for one process (ranks were let through unchecked, and failed in the
// measurement or the store).
TEST(OffloadFault, ADiskTooSmallForARanksFilesIsRefusedBeforeMeasuring) {
  TempDir tmp;
  const std::string disk = tmp.file("disk");
  const testing::SmallDisk small(disk, "6m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here (not root)";
  const CommandResult r = run_stratum(std::string("plan ") + kModel + " --batch 2 --seq 32 --ranks 2 --grad-accum 2 "
                                      "--net-gbps 25" + offload_args(min_budget_mib(), disk));
  expect_one_error_line(r, {"--offload-dir " + disk + " has", "needs at least"}, true);
  EXPECT_TRUE(std::filesystem::is_empty(disk));
}

TEST(OffloadFault, OffloadDirThatIsAFileIsRefused) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string file = tmp.file("plain_file");
  file_write_atomic(file, std::string("not a directory"));
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), file));
  expect_one_error_line(r, {file, "not a directory"}, true);
  EXPECT_EQ(file_read_all(file), "not a directory");
}

TEST(OffloadFault, UnwritableOffloadDirIsRefused) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string dir = tmp.file("read_only");
  dir_create(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  CommandResult r;
  if (::geteuid() != 0) {
    r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), dir));
  } else {
    // Root ignores permission bits: run the binary as 'nobody' instead, where setpriv exists.
    if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "running as root and no setpriv to drop privileges";
    ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
    ASSERT_EQ(::chmod(tokens.c_str(), 0644), 0);
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);  // nobody owns it, and has r-x only
    const std::string cmd = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups " +
                            std::string(STRATUM_BINARY) + " " + train_args(tokens, 3) +
                            offload_args(min_budget_mib(), dir) + " >" + tmp.file("out") + " 2>" + tmp.file("err");
    const int status = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.errors = file_read_all(tmp.file("err"));
    if (r.exit_code != 1 && contains(r.errors, "setpriv"))
      GTEST_SKIP() << "setpriv cannot drop privileges: " << r.errors;
  }
  expect_one_error_line(r, {dir, "not writable"}, true);
  EXPECT_DIR_CLEAN(dir);
}

TEST(OffloadFault, BadFlagCombinationsAreRefused) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  const std::string base = train_args(tokens, 3);
  const std::string budget = " --mem-budget " + std::to_string(min_budget_mib()) + "M";
  const std::string dir = " --offload-dir " + quote(offload);
  struct Case {
    std::string flags;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {budget, {"--offload-dir"}},
      {dir, {"--mem-budget"}},
      {budget + dir + " --io bogus", {"bogus", "auto", "uring", "threads"}},
      {budget + dir + " --prefetch -2", {"--prefetch"}},
      {budget + dir + " --prefetch 65", {"--prefetch"}},
      {" --prefetch 2", {"--prefetch", "--mem-budget"}},
      {" --io threads", {"--io", "--mem-budget"}},
      {" --mem-budget 0" + dir, {"--mem-budget"}},
      {budget + dir + " --io-block 5000", {"--io-block", "4K"}},
      {budget + dir + " --io-depth 0", {"--io-depth"}},
      {" --io-depth 4", {"--io-depth", "--mem-budget"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    expect_one_error_line(run_stratum(base + c.flags), c.words, true);
  }
  {
    SCOPED_TRACE("bad STRATUM_IO_FAULT");
    ScopedEnv fault("STRATUM_IO_FAULT", "enospc@-3");
    expect_one_error_line(run_stratum(base + budget + dir), {"STRATUM_IO_FAULT", "enospc@-3"}, true);
  }
  EXPECT_DIR_CLEAN(offload);
}

// ---- faults mid-run ----

TEST(OffloadFault, DiskFullMidRunKeepsTheLastCheckpointIntact) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  const std::string out = tmp.file("ckpt");
  const std::string log = tmp.file("log.jsonl");
  const long budget = min_budget_mib();
  const std::string saved_prefix = "[stratum] saved checkpoint " + out + "/step-";

  // About 20 blocks are written per step at the minimum budget, more when the plan offloads the
  // block internals (--activations auto) and more again when ASan slows the compute against the
  // write-behind; try fault points from a later step down, until one fails the run after at least
  // one checkpoint was saved.
  CommandResult r;
  long saved_step = 0;
  std::string used_spec;
  for (const int n : {150, 110, 80, 65, 50, 40, 30, 20, 12, 8}) {
    std::error_code ec;
    std::filesystem::remove_all(out, ec);
    std::filesystem::remove(log, ec);
    used_spec = "enospc@" + std::to_string(n);
    ScopedEnv fault("STRATUM_IO_FAULT", used_spec);
    r = run_stratum(train_args(tokens, 4) + offload_args(budget, offload) + " --save " + quote(out) +
                    " --save-every 1 --log " + quote(log));
    saved_step = 0;
    for (const std::string& line : lines_of(r.errors))
      if (line.rfind(saved_prefix, 0) == 0)
        saved_step = std::max(saved_step, std::stol(line.substr(saved_prefix.size())));
    if (r.exit_code == 1 && saved_step >= 1) break;
  }
  ASSERT_GE(saved_step, 1) << "no fault point failed the run after a checkpoint; last try " << used_spec << ":\n"
                           << r.errors;
  SCOPED_TRACE(used_spec);
  const std::string error = expect_one_error_line(r, {"no space left", offload + "/", ".bin"}, false);
  EXPECT_TRUE(contains(error, "--offload-dir")) << error;  // says what to do about it
  const long logged_steps = static_cast<long>(lines_of(file_read_all(log)).size());
  EXPECT_TRUE(logged_steps == saved_step || logged_steps == saved_step + 1)
      << logged_steps << " steps logged, checkpoint of step " << saved_step;
  EXPECT_DIR_CLEAN(offload);
  EXPECT_DIR_CLEAN(tmp.path(), {"offload", "ckpt", "log.jsonl", "tokens.bin"});
  for (const auto& entry : std::filesystem::directory_iterator(out))  // no .step-*.tmp.*, no lock left
    EXPECT_TRUE(entry.path().filename() == "latest" || entry.path().filename() == "run" ||
                entry.path().filename().string().rfind("step-", 0) == 0)
        << entry.path();

  // The checkpoint left behind is a complete model, the one `latest` names...
  const std::string latest = checkpoint_model_dir(out);
  EXPECT_EQ(latest, out + "/" + checkpoint_name(saved_step));
  ASSERT_TRUE(file_exists(latest + "/config.json"));
  ASSERT_TRUE(file_exists(latest + "/model.safetensors"));
  EXPECT_TRUE(checkpoint_verify(latest).ok()) << checkpoint_verify(latest).problem;
  const CommandResult info = run_stratum("info " + quote(out));
  EXPECT_EQ(info.exit_code, 0) << info.errors;
  EXPECT_TRUE(contains(info.output, "L3 H4 C128 ctx32 V4096")) << info.output;

  // ...byte-identical to a fault-free run stopped at the step it was saved.
  const std::string ref = tmp.file("ref");
  const std::string ref_offload = tmp.file("ref_offload");
  dir_create(ref_offload);
  const CommandResult clean = run_stratum(train_args(tokens, static_cast<int>(saved_step)) +
                                          offload_args(budget, ref_offload) + " --save " + quote(ref));
  ASSERT_EQ(clean.exit_code, 0) << clean.errors;
  const std::string got = file_read_all(latest + "/model.safetensors");
  const std::string want = file_read_all(checkpoint_model_dir(ref) + "/model.safetensors");
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "checkpoint of step " << saved_step << " differs from the fault-free run's";
  EXPECT_EQ(file_read_all(latest + "/config.json"), file_read_all(checkpoint_model_dir(ref) + "/config.json"));
}

TEST(OffloadFault, ReadAndWriteIoErrorsNameTheFile) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  for (const std::string spec : {"eio-read@5", "eio-write@5", "eio-read@0", "eio-write@0"}) {
    SCOPED_TRACE(spec);
    const CommandResult r = run_with_fault(spec, tokens, offload);
    const bool reading = spec.rfind("eio-read", 0) == 0;
    expect_one_error_line(r, {"I/O error", reading ? "I/O error reading " : "I/O error writing ", offload + "/",
                              ".bin", "at offset "},
                          false);
    EXPECT_DIR_CLEAN(offload);
  }
}

TEST(OffloadFault, ShortReadIsReported) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  const CommandResult r = run_with_fault("short-read@3", tokens, offload);
  expect_one_error_line(r, {"short read", offload + "/", ".bin", "at offset "}, false);
  EXPECT_DIR_CLEAN(offload);
}

TEST(OffloadFault, BitFlipIsAChecksumMismatch) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  for (const std::string spec : {"flip@0", "flip@12"}) {
    SCOPED_TRACE(spec);
    const CommandResult r = run_with_fault(spec, tokens, offload);
    const std::string error = expect_one_error_line(r, {"checksum mismatch", offload + "/", ".bin"}, false);
    EXPECT_TRUE(std::regex_search(error, std::regex("at offset [0-9]+"))) << error;
    EXPECT_DIR_CLEAN(offload);
  }
}

// ---- file systems and sharing ----

TEST(OffloadFault, TmpfsOffloadDirTrainsToTheSameParameters) {
  if (!dir_exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  char tmpl[] = "/dev/shm/stratum_offload_test_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) GTEST_SKIP() << "cannot create a directory in /dev/shm";
  const std::string shm = tmpl;
  struct Remove {
    std::string path;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove{shm};
  // Does this kernel's tmpfs take O_DIRECT (Linux >= 6.6 does)? Decides which wording to expect.
  bool shm_direct = true;
  {
    const std::string probe = shm + "/probe";
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd < 0) shm_direct = errno != EINVAL;
    else ::close(fd);
    ::unlink(probe.c_str());
  }

  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string disk = tmp.file("offload");
  dir_create(disk);
  const long budget = min_budget_mib();

  const CommandResult ram = run_stratum(train_args(tokens, 3));
  ASSERT_EQ(ram.exit_code, 0) << ram.errors;
  const CommandResult on_disk = run_stratum(train_args(tokens, 3) + offload_args(budget, disk));
  ASSERT_EQ(on_disk.exit_code, 0) << on_disk.errors;
  const CommandResult on_shm = run_stratum(train_args(tokens, 3) + offload_args(budget, shm));
  ASSERT_EQ(on_shm.exit_code, 0) << on_shm.errors;

  std::smatch m;
  ASSERT_TRUE(std::regex_search(on_shm.errors, m, std::regex(R"(\[stratum\] memory: ([^\n]*))"))) << on_shm.errors;
  const std::string memory_line = m[1].str();
  if (shm_direct) {
    EXPECT_TRUE(contains(memory_line, ", O_DIRECT,")) << memory_line;
  } else {
    EXPECT_TRUE(contains(memory_line, "refuses O_DIRECT")) << memory_line;
    EXPECT_TRUE(contains(memory_line, ", buffered,")) << memory_line;
    EXPECT_TRUE(contains(memory_line, "page cache")) << memory_line;
  }
  const std::string hash = params_hash(ram);
  ASSERT_FALSE(hash.empty()) << ram.errors;
  EXPECT_EQ(params_hash(on_disk), hash);
  EXPECT_EQ(params_hash(on_shm), hash);
  EXPECT_GT(tier_traffic_mib(on_shm).first, 0.0) << on_shm.errors;
  EXPECT_DIR_CLEAN(shm);
  EXPECT_DIR_CLEAN(disk);

  // io_uring forced on tmpfs: trains to the same parameters, or says clearly why it cannot.
  const CommandResult uring = run_stratum(train_args(tokens, 3) + offload_args(budget, shm) + " --io uring");
  if (uring.exit_code == 0) {
    EXPECT_EQ(params_hash(uring), hash) << uring.errors;
  } else {
    expect_one_error_line(uring, {}, false);
  }
  EXPECT_DIR_CLEAN(shm);
}

TEST(OffloadFault, OffloadDirInUseByAnotherRunIsRefused) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  const std::string lock_path = offload + "/" + kLockName;
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), offload));
  expect_one_error_line(r, {"another stratum run", offload}, true);
  EXPECT_DIR_CLEAN(offload, {kLockName});
  ::flock(fd, LOCK_UN);
  ::close(fd);

  // Once the other run is gone, the directory (stale lock file and all) is usable again.
  const CommandResult ok = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), offload));
  EXPECT_EQ(ok.exit_code, 0) << ok.errors;
  EXPECT_DIR_CLEAN(offload);
}

// A setup failure after the offload files were created (here: a directory squats on the name of
// one of them) must still remove them. DISABLED: TieredSegmentStore's constructor throws after
// creating the lock file and the earlier *.bin files, and only the destructor (which does not run)
// removes them. Enable once the constructor cleans up on failure.
TEST(OffloadFault, SetupFailureAfterCreatingFilesLeavesNoFiles) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  dir_create(offload + "/stratum-offload/head.adam_v.bin");  // in the way inside Stratum's own subdirectory
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), offload));
  expect_one_error_line(r, {"head.adam_v.bin"}, true);
  EXPECT_DIR_CLEAN(offload, {"stratum-offload"});
  EXPECT_DIR_CLEAN(offload + "/stratum-offload", {"head.adam_v.bin"});
}

// Note [own subdirectory]: a user's files in --offload-dir, even with the names of Stratum's
// offload files, are neither overwritten nor deleted (they were both).
TEST(OffloadFault, UserFilesInTheOffloadDirAreLeftAlone) {
  TempDir tmp;
  const std::string tokens = write_tokens(tmp);
  const std::string offload = tmp.file("offload");
  dir_create(offload);
  for (const char* name : {"head.adam_v.bin", "layer.0.params.bin", "notes.txt"})
    file_write_atomic(offload + "/" + name, std::string("mine: ") + name);
  const CommandResult r = run_stratum(train_args(tokens, 3) + offload_args(min_budget_mib(), offload));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  for (const char* name : {"head.adam_v.bin", "layer.0.params.bin", "notes.txt"})
    EXPECT_EQ(file_read_all(offload + "/" + name), std::string("mine: ") + name);
  EXPECT_DIR_CLEAN(offload, {"head.adam_v.bin", "layer.0.params.bin", "notes.txt"});
}

}  // namespace
}  // namespace stratum
