// IoEngine, both backends: round trips of multi-block requests, more requests than the queue
// depth, several submitting threads, checksum mismatches, every injected fault (and that the
// engine stays usable), short reads past end of file, draining on destruction; the fallback to
// threads without io_uring; io_checksum; io_direct_supported; the backend-name and fault-spec
// parsers.
#include "io/io_engine.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/file_descriptor.h"
#include "core/hash.h"
#include "core/rng.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

void fill_random(AlignedBuffer& buffer, std::uint64_t seed) {
  Rng rng(seed);
  auto* bytes = static_cast<unsigned char*>(buffer.data());
  for (std::size_t i = 0; i < buffer.size_bytes(); i += 8) {
    const std::uint64_t word = rng.next_u64();
    std::memcpy(bytes + i, &word, std::min<std::size_t>(8, buffer.size_bytes() - i));
  }
}

bool same_bytes(const AlignedBuffer& a, const AlignedBuffer& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// The message of the Error that wait() throws, or "" when it does not throw.
std::string wait_error(const std::shared_ptr<IoTicket>& ticket) {
  try {
    ticket->wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One request's buffer and block sums, with the request that moves them.
struct Transfer {
  AlignedBuffer buffer;
  std::vector<std::uint64_t> sums;
  IoRequest request;

  Transfer(IoOp op, int fd, std::uint64_t offset, std::size_t size_bytes, std::size_t block_bytes,
           const std::string& what = "seg (test)")
      : buffer(size_bytes), sums((size_bytes + block_bytes - 1) / block_bytes) {
    request.op = op;
    request.fd = fd;
    request.offset = offset;
    request.buffer = buffer.data();
    request.size_bytes = size_bytes;
    request.block_sums = sums.data();
    request.what = what;
  }
  // A read of the same range, verifying against this transfer's sums.
  Transfer read_back(std::size_t block_bytes) const {
    Transfer r(IoOp::Read, request.fd, request.offset, request.size_bytes, block_bytes, request.what);
    r.sums = sums;
    r.request.block_sums = r.sums.data();
    return r;
  }
};

// An offload file in a fresh temp dir, with O_DIRECT where the file system takes it.
struct OffloadFile {
  testing::TempDir dir;
  std::string path = dir.file("seg.bin");
  bool direct = io_direct_supported(dir.path());
  FileDescriptor fd{io_open_file(path, direct)};
};

class IoEngineTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  std::unique_ptr<IoEngine> make_engine(std::size_t block_bytes, int queue_depth, const std::string& fault = "") {
    IoEngineOptions options;
    options.backend = GetParam();
    options.block_bytes = block_bytes;
    options.queue_depth = queue_depth;
    options.fault = IoFaultPlan::parse(fault);
    std::string note;
    auto engine = IoEngine::create(options, &note);
    if (GetParam() == IoBackend::Uring && engine->backend() != IoBackend::Uring) {
      EXPECT_NE(note.find("io_uring is unavailable"), std::string::npos) << note;
      return nullptr;
    }
    EXPECT_EQ(engine->backend(), GetParam());
    EXPECT_EQ(engine->block_bytes(), block_bytes);
    EXPECT_EQ(engine->queue_depth(), queue_depth);
    return engine;
  }
};

#define MAKE_ENGINE_OR_SKIP(engine, ...)                                             \
  auto engine = make_engine(__VA_ARGS__);                                            \
  if (engine == nullptr) GTEST_SKIP() << "io_uring is unavailable on this machine"

TEST_P(IoEngineTest, RoundTripsMultiBlockRequestsOfOddSizes) {
  OffloadFile file;
  for (std::size_t block_bytes : {64 * kKiB, 1 * kMiB}) {
    MAKE_ENGINE_OR_SKIP(engine, block_bytes, 4);
    std::vector<Transfer> writes;
    std::uint64_t offset = 0;
    for (std::size_t size : {4 * kKiB * 3, 1 * kMiB + 4096, 5 * kMiB}) {
      writes.emplace_back(IoOp::Write, file.fd.get(), offset, size, block_bytes);
      fill_random(writes.back().buffer, size + block_bytes);
      offset += size + 8192;  // leave holes between requests
    }
    std::vector<std::shared_ptr<IoTicket>> tickets;
    for (Transfer& w : writes) tickets.push_back(engine->submit(w.request));
    for (auto& t : tickets) EXPECT_EQ(wait_error(t), "");
    for (const Transfer& w : writes) {
      Transfer r = w.read_back(block_bytes);
      EXPECT_EQ(wait_error(engine->submit(r.request)), "");
      EXPECT_TRUE(same_bytes(r.buffer, w.buffer)) << w.request.size_bytes << " bytes, blocks of " << block_bytes;
    }
  }
}

TEST_P(IoEngineTest, ManyMoreRequestsThanQueueDepthAllCompleteIntact) {
  OffloadFile file;
  const std::size_t block_bytes = 64 * kKiB;
  MAKE_ENGINE_OR_SKIP(engine, block_bytes, 3);
  std::vector<Transfer> writes;
  for (int i = 0; i < 48; ++i) {
    writes.emplace_back(IoOp::Write, file.fd.get(), i * 192 * kKiB, 192 * kKiB, block_bytes);
    fill_random(writes.back().buffer, 1000 + i);
  }
  std::vector<std::shared_ptr<IoTicket>> tickets;
  for (Transfer& w : writes) tickets.push_back(engine->submit(w.request));
  for (auto& t : tickets) EXPECT_EQ(wait_error(t), "");
  for (auto& t : tickets) EXPECT_TRUE(t->done());

  std::vector<Transfer> reads;
  for (const Transfer& w : writes) reads.push_back(w.read_back(block_bytes));
  tickets.clear();
  for (Transfer& r : reads) tickets.push_back(engine->submit(r.request));
  for (std::size_t i = 0; i < reads.size(); ++i) {
    EXPECT_EQ(wait_error(tickets[i]), "");
    EXPECT_TRUE(same_bytes(reads[i].buffer, writes[i].buffer)) << "request " << i;
  }
}

TEST_P(IoEngineTest, SubmittersOnSeveralThreadsShareOneEngine) {
  OffloadFile file;
  const std::size_t block_bytes = 64 * kKiB;
  MAKE_ENGINE_OR_SKIP(engine, block_bytes, 4);
  constexpr int kThreads = 4, kPerThread = 12;
  std::vector<Transfer> writes;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    writes.emplace_back(IoOp::Write, file.fd.get(), i * 128 * kKiB, 128 * kKiB, block_bytes);
    fill_random(writes.back().buffer, 300 + i);
  }
  std::vector<std::string> errors(writes.size());
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t)
    submitters.emplace_back([&, t] {
      for (int i = t * kPerThread; i < (t + 1) * kPerThread; ++i) {
        errors[i] = wait_error(engine->submit(writes[i].request));
        Transfer r = writes[i].read_back(block_bytes);
        const std::string read_error = wait_error(engine->submit(r.request));
        if (errors[i].empty()) errors[i] = read_error;
        if (errors[i].empty() && !same_bytes(r.buffer, writes[i].buffer)) errors[i] = "data differs";
      }
    });
  for (std::thread& s : submitters) s.join();
  for (std::size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "request " << i;
}

TEST_P(IoEngineTest, ChecksumMismatchWhenTheFileChangesNamesTheOffset) {
  OffloadFile file;
  const std::size_t block_bytes = 64 * kKiB;
  MAKE_ENGINE_OR_SKIP(engine, block_bytes, 4);
  const std::uint64_t base = 128 * kKiB;
  Transfer w(IoOp::Write, file.fd.get(), base, 3 * block_bytes, block_bytes, "layer.3.params (" + file.path + ")");
  fill_random(w.buffer, 7);
  ASSERT_EQ(wait_error(engine->submit(w.request)), "");
  {
    FileDescriptor plain(::open(file.path.c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_GE(plain.get(), 0);
    const char garbage[] = "garbage";
    ASSERT_EQ(::pwrite(plain.get(), garbage, sizeof garbage, static_cast<off_t>(base + 2 * block_bytes + 100)),
              static_cast<ssize_t>(sizeof garbage));
    ASSERT_EQ(::fsync(plain.get()), 0);
  }
  Transfer r = w.read_back(block_bytes);
  const std::string message = wait_error(engine->submit(r.request));
  EXPECT_EQ(message, "[io] checksum mismatch reading layer.3.params (" + file.path + ") at offset " +
                         std::to_string(base + 2 * block_bytes) +
                         " (block 2): the offload file was modified or the disk returned bad data");
  // The untouched blocks still arrived.
  EXPECT_EQ(std::memcmp(r.buffer.data(), w.buffer.data(), 2 * block_bytes), 0);
}

struct FaultCase {
  const char* spec;
  IoOp op;             // the op that fails
  std::size_t block;   // which block of the 3-block request fails
  const char* prefix;  // of the message, up to the file
  const char* suffix;  // after the offset
};

TEST_P(IoEngineTest, EveryInjectedFaultFailsItsBlockAndTheEngineStaysUsable) {
  const std::size_t block_bytes = 64 * kKiB;
  const FaultCase cases[] = {
      {"enospc@1", IoOp::Write, 1, "[io] no space left on device writing ",
       ": free space under --offload-dir or choose another directory"},
      {"eio-write@0", IoOp::Write, 0, "[io] I/O error writing ", ": Input/output error"},
      {"eio-read@2", IoOp::Read, 2, "[io] I/O error reading ", ": Input/output error"},
      {"short-read@1", IoOp::Read, 1, "[io] short read of ",
       ": got 32768 of 65536 bytes (the file is shorter than expected)"},
      {"flip@0", IoOp::Read, 0, "[io] checksum mismatch reading ",
       " (block 0): the offload file was modified or the disk returned bad data"},
  };
  for (const FaultCase& c : cases) {
    SCOPED_TRACE(c.spec);
    OffloadFile file;
    MAKE_ENGINE_OR_SKIP(engine, block_bytes, 2, c.spec);
    const std::uint64_t base = 64 * kKiB;
    const std::string what = "layer.3.grads (" + file.path + ")";
    Transfer w(IoOp::Write, file.fd.get(), base, 3 * block_bytes, block_bytes, what);
    fill_random(w.buffer, 11);
    const std::string write_error = wait_error(engine->submit(w.request));
    Transfer r = w.read_back(block_bytes);
    const std::string read_error = wait_error(engine->submit(r.request));
    const std::string& error = c.op == IoOp::Write ? write_error : read_error;
    const std::string offset = std::to_string(base + c.block * block_bytes);
    EXPECT_EQ(error, c.prefix + what + " at offset " + offset + c.suffix);
    if (c.op == IoOp::Read) {
      EXPECT_EQ(write_error, "");
    }
    // The fault fires once: the same request now goes through both ways.
    Transfer w2(IoOp::Write, file.fd.get(), base, 3 * block_bytes, block_bytes, what);
    fill_random(w2.buffer, 12);
    EXPECT_EQ(wait_error(engine->submit(w2.request)), "");
    Transfer r2 = w2.read_back(block_bytes);
    EXPECT_EQ(wait_error(engine->submit(r2.request)), "");
    EXPECT_TRUE(same_bytes(r2.buffer, w2.buffer));
  }
}

TEST_P(IoEngineTest, ReadingPastEndOfFileIsAShortRead) {
  OffloadFile file;
  const std::size_t block_bytes = 64 * kKiB;
  MAKE_ENGINE_OR_SKIP(engine, block_bytes, 4);
  Transfer w(IoOp::Write, file.fd.get(), 0, block_bytes + 4096, block_bytes, "head.params (f)");
  fill_random(w.buffer, 3);
  ASSERT_EQ(wait_error(engine->submit(w.request)), "");
  // Block 1 holds 4096 bytes of the file; block 2 lies wholly past its end.
  Transfer r(IoOp::Read, file.fd.get(), 0, 3 * block_bytes, block_bytes, "head.params (f)");
  r.sums[0] = w.sums[0];
  EXPECT_EQ(wait_error(engine->submit(r.request)),
            "[io] short read of head.params (f) at offset 65536: got 4096 of 65536 bytes (the file is shorter than "
            "expected)");
  Transfer past(IoOp::Read, file.fd.get(), 4 * block_bytes, block_bytes, block_bytes, "head.params (f)");
  EXPECT_EQ(wait_error(engine->submit(past.request)),
            "[io] short read of head.params (f) at offset 262144: got 0 of 65536 bytes (the file is shorter than "
            "expected)");
}

TEST_P(IoEngineTest, DestructionWithRequestsInFlightFinishesThem) {
  OffloadFile file;
  const std::size_t block_bytes = 64 * kKiB;
  std::vector<Transfer> writes;
  std::vector<std::shared_ptr<IoTicket>> tickets;
  {
    MAKE_ENGINE_OR_SKIP(engine, block_bytes, 2);
    for (int i = 0; i < 24; ++i) {
      writes.emplace_back(IoOp::Write, file.fd.get(), i * 256 * kKiB, 256 * kKiB, block_bytes);
      fill_random(writes.back().buffer, 50 + i);
    }
    for (Transfer& w : writes) tickets.push_back(engine->submit(w.request));
  }
  for (auto& t : tickets) {
    EXPECT_TRUE(t->done());
    EXPECT_EQ(wait_error(t), "");
  }
  FileDescriptor plain(::open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(plain.get(), 0);
  std::vector<unsigned char> got(256 * kKiB);
  for (const Transfer& w : writes) {
    ASSERT_EQ(::pread(plain.get(), got.data(), got.size(), static_cast<off_t>(w.request.offset)),
              static_cast<ssize_t>(got.size()));
    EXPECT_EQ(std::memcmp(got.data(), w.buffer.data(), got.size()), 0) << "offset " << w.request.offset;
  }
}

TEST_P(IoEngineTest, EmptyRequestIsDoneAtOnceAndMisalignedRequestIsABug) {
  OffloadFile file;
  MAKE_ENGINE_OR_SKIP(engine, 64 * kKiB, 2);
  IoRequest empty;
  empty.fd = file.fd.get();
  auto ticket = engine->submit(empty);
  EXPECT_TRUE(ticket->done());
  EXPECT_EQ(wait_error(ticket), "");
  Transfer bad(IoOp::Read, file.fd.get(), 100, 4096, 64 * kKiB);
  EXPECT_THROW(engine->submit(bad.request), BugError);
}

TEST_P(IoEngineTest, RejectsBadOptions) {
  IoEngineOptions options;
  options.backend = GetParam();
  options.block_bytes = 1000;
  EXPECT_THROW(IoEngine::create(options), Error);
  options.block_bytes = 4096;
  options.queue_depth = 0;
  EXPECT_THROW(IoEngine::create(options), Error);
}

std::string backend_test_name(const ::testing::TestParamInfo<IoBackend>& info) {
  return io_backend_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(IoBackends, IoEngineTest, ::testing::Values(IoBackend::Uring, IoBackend::Threads),
                         backend_test_name);

#if defined(__x86_64__)
// Makes io_uring_setup fail with ENOSYS in this process from now on (seccomp), as on kernels or
// containers without io_uring. Returns false when the filter cannot be installed.
bool io_uring_block_for_this_process() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

TEST(IoBackendFallback, WithoutIoUringAutoAndUringUseThreadsAndSaySo) {
  // In a child process (a re-executed death test), so the filter does not outlive this test.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!io_uring_block_for_this_process()) std::_Exit(3);
        bool ok = true;
        for (IoBackend asked : {IoBackend::Auto, IoBackend::Uring}) {
          IoEngineOptions options;
          options.backend = asked;
          std::string note;
          auto engine = IoEngine::create(options, &note);
          ok = ok && engine->backend() == IoBackend::Threads &&
               note == "io_uring is unavailable (Function not implemented); using the pread/pwrite thread backend";
        }
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
#endif

// ---- the block checksum: hash64 (core/hash.h) ----

// Deterministic bytes on every platform (SplitMix64), no period.
std::vector<unsigned char> pattern_bytes(std::size_t n) {
  std::vector<unsigned char> bytes(n);
  Rng rng(2024);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng.next_u64() >> 56);
  return bytes;
}

TEST(IoChecksum, IsXxh3AndStreamsLikeOneCall) {
  // XXH3-64 of the empty input, seed 0 (xxHash's published test value); a streamed hash of
  // pieces equals the hash of their concatenation.
  EXPECT_EQ(hash64(nullptr, 0), 0x2D06800538D394C2ull);
  const std::vector<unsigned char> bytes = pattern_bytes(3000);
  for (std::size_t piece : {1, 7, 64, 1000, 3000}) {
    Hash64Stream stream;
    for (std::size_t at = 0; at < bytes.size(); at += piece)
      stream.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    EXPECT_EQ(stream.digest(), hash64(bytes.data(), bytes.size())) << piece;
  }
}

TEST(IoChecksum, EverySingleBitFlipChangesTheSum) {
  std::vector<unsigned char> bytes = pattern_bytes(4096 + 24);
  const std::uint64_t clean = hash64(bytes.data(), bytes.size());
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(hash64(bytes.data(), bytes.size()), clean) << "bit " << bit;
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

TEST(IoChecksum, MovingDataChangesTheSum) {
  const std::vector<unsigned char> bytes = pattern_bytes(4096);
  const std::uint64_t clean = hash64(bytes.data(), bytes.size());
  std::vector<unsigned char> swapped = bytes;  // two stripes of one round swapped
  std::swap_ranges(swapped.begin(), swapped.begin() + 64, swapped.begin() + 128);
  EXPECT_NE(hash64(swapped.data(), swapped.size()), clean);
  swapped = bytes;  // two whole rounds swapped
  std::swap_ranges(swapped.begin(), swapped.begin() + 1024, swapped.begin() + 2048);
  EXPECT_NE(hash64(swapped.data(), swapped.size()), clean);
  swapped = bytes;  // two neighbouring words of one stripe swapped
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(hash64(swapped.data(), swapped.size()), clean);
}

TEST(IoChecksum, LengthsZeroTo200AtEveryAlignmentAreDistinctAndAlignmentFree) {
  const std::vector<unsigned char> bytes = pattern_bytes(256);
  std::set<std::uint64_t> seen;
  for (std::size_t n = 0; n <= 200; ++n) {
    const std::uint64_t sum = hash64(bytes.data(), n);
    EXPECT_TRUE(seen.insert(sum).second) << "length " << n;
    for (std::size_t shift = 1; shift < 8; ++shift) {
      std::vector<unsigned char> moved(n + shift);
      std::memcpy(moved.data() + shift, bytes.data(), n);
      EXPECT_EQ(hash64(moved.data() + shift, n), sum) << "length " << n << " shift " << shift;
    }
  }
  // Zero padding of the tail is not ambiguous: a trailing zero byte changes the sum.
  const std::vector<unsigned char> zeros(65, 0);
  for (std::size_t n = 0; n < 64; ++n) EXPECT_NE(hash64(zeros.data(), n), hash64(zeros.data(), n + 1));
}

// ---- io_direct_supported, io_open_file ----

TEST(IoDirect, SupportedOnTmpAndLeavesNoProbeBehind) {
  testing::TempDir dir;
  EXPECT_TRUE(io_direct_supported(dir.path()));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(IoDirect, NotSupportedOnTmpfs) {
  if (!dir_exists("/dev/shm")) GTEST_SKIP() << "/dev/shm does not exist";
  {
    // Linux 6.6 and later give tmpfs O_DIRECT: then there is nothing to refuse.
    const std::string probe = "/dev/shm/stratum_io_test_probe." + std::to_string(::getpid());
    FileDescriptor fd(::open(probe.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600));
    ::unlink(probe.c_str());
    if (fd.get() >= 0) GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT";
  }
  EXPECT_FALSE(io_direct_supported("/dev/shm"));
}

std::string thrown_message(const std::string& dir) {
  try {
    io_direct_supported(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(IoDirect, ClearErrorsForAMissingDirectoryOrAFile) {
  testing::TempDir dir;
  EXPECT_EQ(thrown_message(dir.file("nope")),
            "[io] --offload-dir " + dir.file("nope") + " does not exist: create it or choose another");
  file_write_atomic(dir.file("plain"), "x");
  EXPECT_EQ(thrown_message(dir.file("plain")),
            "[io] --offload-dir " + dir.file("plain") + " is not a directory: choose a directory");
}

TEST(IoDirect, ClearErrorForAReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  testing::TempDir dir;
  const std::string locked = dir.file("locked");
  ASSERT_EQ(::mkdir(locked.c_str(), 0500), 0);
  EXPECT_EQ(thrown_message(locked), "[io] --offload-dir " + locked +
                                        " is not writable (permission denied): choose another or fix its permissions");
}

TEST(IoDirect, OpenFileNamesThePathOnFailure) {
  testing::TempDir dir;
  try {
    io_open_file(dir.file("missing/seg.bin"), false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing/seg.bin")), std::string::npos) << e.what();
  }
  FileDescriptor fd(io_open_file(dir.file("seg.bin"), false));
  struct stat st {};
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// ---- parsers ----

TEST(IoFaultPlan, ParseTable) {
  using Kind = IoFaultPlan::Kind;
  struct Good {
    const char* spec;
    Kind kind;
    IoOp op;
    long at_block;
  };
  const Good good[] = {{"enospc@0", Kind::NoSpace, IoOp::Write, 0},
                       {"eio-read@7", Kind::IoError, IoOp::Read, 7},
                       {"eio-write@12", Kind::IoError, IoOp::Write, 12},
                       {"short-read@3", Kind::ShortRead, IoOp::Read, 3},
                       {"flip@1000000", Kind::BitFlip, IoOp::Read, 1000000}};
  for (const Good& g : good) {
    const IoFaultPlan plan = IoFaultPlan::parse(g.spec);
    EXPECT_EQ(plan.kind, g.kind) << g.spec;
    EXPECT_EQ(plan.op, g.op) << g.spec;
    EXPECT_EQ(plan.at_block, g.at_block) << g.spec;
  }
  EXPECT_EQ(IoFaultPlan::parse("").kind, Kind::None);
  for (const char* bad : {"enospc", "enospc@", "enospc@-1", "enospc@+1", "enospc@1x", "enospc@ 1", "ENOSPC@1",
                          "eio@1", "@1", "flip@1@2", "short-read@99999999999999999999", "bogus@1", " flip@1",
                          "flip@0x10"}) {
    try {
      IoFaultPlan::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("[io] bad fault spec '") + bad +
                                           "' (STRATUM_IO_FAULT): expected enospc@N, eio-read@N, eio-write@N, "
                                           "short-read@N or flip@N with N a 0-based block number");
    }
  }
}

TEST(IoBackendName, ParsesWhatItPrints) {
  for (IoBackend b : {IoBackend::Auto, IoBackend::Uring, IoBackend::Threads})
    EXPECT_EQ(io_backend_parse(io_backend_name(b)), b);
  for (const char* bad : {"", "URING", "io_uring", "thread"})
    EXPECT_THROW(io_backend_parse(bad), Error) << bad;
}

}  // namespace
}  // namespace stratum
