// Shared by the fuzz targets: the fuzz input written to a per-process temporary file, because
// the parsers read by path. Does not parse anything.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "stratum/error.h"

namespace stratum::fuzz {

// The fuzz input as a file (the parser reads by path): one per process, rewritten for every
// input, removed at exit. Overwrite + ftruncate rather than O_TRUNC: on ext4, truncating to zero
// and rewriting forces a flush at close (auto_da_alloc): ~100x fewer execs/s.
class FuzzFile {
 public:
  explicit FuzzFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("stratum_fuzz_" + std::to_string(::getpid()) + "_" + name)).string()) {}
  FuzzFile(const FuzzFile&) = delete;
  FuzzFile& operator=(const FuzzFile&) = delete;
  ~FuzzFile() { ::unlink(path_.c_str()); }

  const std::string& write(const std::uint8_t* data, std::size_t size) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    std::size_t done = 0;
    while (fd >= 0 && done < size) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    if (fd < 0 || done != size || ::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        ::close(fd) != 0) {
      std::perror(("[fuzz] cannot write " + path_).c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::string path_;
};

// A harness's failure: prints "[fuzz.<target>] <what>" and aborts, so the fuzzer keeps the input.
[[noreturn]] inline void fuzz_abort(const char* target, const std::string& what) {
  std::fprintf(stderr, "[fuzz.%s] %s\n", target, what.c_str());
  std::abort();
}

// Note [fuzz stack limit]
// nlohmann::json::dump() recurses once per nesting level, and the parsers once called it to quote
// a bad value in an error message. With the usual 8 MiB stack only inputs of ~100 KB overflow, far
// beyond what the fuzzer generates; capping the stack at 128 KiB (the main thread's stack grows
// on demand up to RLIMIT_STACK) makes a few-KB input of deep nesting crash. Parsing itself is
// iterative and needs far less. Call from LLVMFuzzerInitialize. A recursive-descent parser with
// a bound on its depth (the Jinja engine's 128 levels, some 1 KiB each under ASan) passes a larger
// cap that still stops unbounded recursion: a 4 KB input nests thousands of levels deep.
inline void fuzz_cap_stack(rlim_t kStackLimitBytes = 128 << 10) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur > kStackLimitBytes) {
    limit.rlim_cur = kStackLimitBytes;
    ::setrlimit(RLIMIT_STACK, &limit);
  }
}

// The check of a text format with a parser and a writer: parse(text, where) -> T; a
// stratum::Error rejects the input (returns); a BugError or any other exception fails. An accepted
// value goes to check(value), then must round-trip: write(value) parses again and writes back the
// same text. fail(message) must not return. `what` names the value in failure messages.
template <class Parse, class Write, class Check, class Fail>
void fuzz_parse_and_round_trip(const std::string& text, const std::string& what, Parse parse, Write write,
                               Check check, Fail fail) {
  decltype(parse(text, std::string())) value;
  try {
    value = parse(text, "fuzz");
  } catch (const stratum::BugError& e) {
    fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return;  // rejected input: the expected outcome for most fuzz inputs
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception: ") + e.what());
  }
  check(value);
  try {
    const std::string json = write(value);
    const std::string json_again = write(parse(json, "roundtrip"));
    if (json_again != json)
      fail("round trip changed the " + what + ":\n--- first\n" + json + "--- after parsing it\n" + json_again);
  } catch (const stratum::Error& e) {
    fail("round trip: the written " + what + " does not parse: " + e.what());
  } catch (const std::exception& e) {
    fail(std::string("round trip: unexpected exception: ") + e.what());
  }
}

}  // namespace stratum::fuzz
