// I/O engine sweep: writes a --file-mib file in --dir through IoEngine (O_DIRECT where the file
// system takes it), then for every block size x queue depth measures write and read GB/s, each
// pass moving the file sequentially in 16 MiB requests for at most --seconds. Prints a table with
// each point's ratio against the first queue depth (1 by default) at the same block size (the
// in-run baseline), the best read and write settings, and the block checksum's (XXH3-64) single-core GB/s (the
// engine checksums every block, so it is part of every number). Deletes its file at the end.
// Does not drop the page cache: O_DIRECT bypasses it; without O_DIRECT the numbers are
// page-cache numbers and it says so.
// Usage: io_sweep --dir DIR [--file-mib 1024] [--backend auto|uring|threads]
//                 [--blocks 256K,1M,4M] [--depths 1,4,8,16,32] [--seconds 1]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/file_descriptor.h"
#include "core/file_util.h"
#include "core/hash.h"
#include "core/rng.h"
#include "io/io_engine.h"
#include "stratum/error.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kRequestBytes = 16 * kMiB;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct SweepArgs {
  std::string dir;
  std::size_t file_mib = 1024;
  stratum::IoBackend backend = stratum::IoBackend::Auto;
  std::vector<std::size_t> blocks = {256 * 1024, kMiB, 4 * kMiB};
  std::vector<int> depths = {1, 4, 8, 16, 32};
  double seconds = 1.0;
};

// "256K" | "1M" | "4096" -> bytes.
std::size_t parse_size(const std::string& text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  std::size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1024, ++end;
  else if (*end == 'M' || *end == 'm') scale = kMiB, ++end;
  STRATUM_CHECK(end != text.c_str() && *end == '\0' && n > 0, "[io_sweep] bad size '", text,
                "': expected a number with an optional K or M suffix, e.g. 256K");
  return static_cast<std::size_t>(n) * scale;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    parts.push_back(text.substr(begin, comma - begin));
    if (comma == std::string::npos) return parts;
    begin = comma + 1;
  }
}

SweepArgs parse_args(int argc, char** argv) {
  SweepArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    STRATUM_CHECK(i + 1 < argc, "[io_sweep] ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dir") {
      args.dir = value;
    } else if (flag == "--file-mib") {
      args.file_mib = parse_size(value);
    } else if (flag == "--backend") {
      args.backend = stratum::io_backend_parse(value);
    } else if (flag == "--blocks") {
      args.blocks.clear();
      for (const std::string& part : split_commas(value)) args.blocks.push_back(parse_size(part));
    } else if (flag == "--depths") {
      args.depths.clear();
      for (const std::string& part : split_commas(value)) args.depths.push_back(static_cast<int>(parse_size(part)));
    } else if (flag == "--seconds") {
      args.seconds = std::atof(value.c_str());
      STRATUM_CHECK(args.seconds > 0, "[io_sweep] --seconds must be positive, got '", value, "'");
    } else {
      STRATUM_FAIL("[io_sweep] unknown flag ", flag,
                   ": usage: io_sweep --dir DIR [--file-mib 1024] [--backend auto|uring|threads] "
                   "[--blocks 256K,1M,4M] [--depths 1,4,8,16,32] [--seconds 1]");
    }
  }
  STRATUM_CHECK(!args.dir.empty(), "[io_sweep] --dir is required: a directory on the disk to measure");
  for (std::size_t b : args.blocks)
    STRATUM_CHECK(b % 4096 == 0 && b <= kRequestBytes,
                  "[io_sweep] block sizes must be multiples of 4 KiB up to 16M, got ", b);
  return args;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string size_text(std::size_t bytes) {
  return bytes % kMiB == 0 ? std::to_string(bytes / kMiB) + "M" : std::to_string(bytes / 1024) + "K";
}


// Moves [0, limit_bytes) of the file sequentially in kRequestBytes requests, enough of them
// outstanding to keep every engine slot busy, stopping early after max_seconds. `sums` has one
// entry per block of the file (written by writes, verified by reads). Returns bytes moved and seconds.
struct PassResult {
  std::uint64_t bytes = 0;
  double seconds = 0;
  double gbps() const { return static_cast<double>(bytes) / seconds / 1e9; }
};

PassResult run_pass(stratum::IoEngine& engine, stratum::IoOp op, int fd, std::uint64_t limit_bytes,
                    std::vector<std::uint64_t>& sums, stratum::AlignedBuffer& pool, double max_seconds) {
  const std::size_t block = engine.block_bytes();
  const std::size_t window = pool.size_bytes() / kRequestBytes;
  std::deque<std::shared_ptr<stratum::IoTicket>> in_flight;
  PassResult result;
  const Clock::time_point t0 = Clock::now();
  std::uint64_t offset = 0;
  for (std::size_t n = 0; offset < limit_bytes && seconds_since(t0) < max_seconds; ++n) {
    if (in_flight.size() == window) {
      in_flight.front()->wait();
      in_flight.pop_front();
    }
    stratum::IoRequest request;
    request.op = op;
    request.fd = fd;
    request.offset = offset;
    request.size_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(kRequestBytes, limit_bytes - offset));
    request.buffer = static_cast<char*>(pool.data()) + (n % window) * kRequestBytes;
    request.block_sums = sums.data() + offset / block;
    request.what = "io_sweep file";
    in_flight.push_back(engine.submit(std::move(request)));
    offset += std::min<std::uint64_t>(kRequestBytes, limit_bytes - offset);
  }
  for (auto& ticket : in_flight) ticket->wait();
  result.seconds = seconds_since(t0);
  result.bytes = offset;
  return result;
}

void fill_random(stratum::AlignedBuffer& buffer, std::uint64_t seed) {
  stratum::Rng rng(seed);
  for (std::size_t i = 0; i < buffer.size_bytes(); i += 8) {
    const std::uint64_t word = rng.next_u64();
    std::memcpy(static_cast<char*>(buffer.data()) + i, &word, 8);
  }
}

// Best of 5 runs of 200 checksums of one 1 MiB block (cache-resident, as a block is right after
// it arrives or before it leaves).
double checksum_gbps() {
  stratum::AlignedBuffer buffer(kMiB);
  fill_random(buffer, 1);
  double best = 0;
  volatile std::uint64_t sink = 0;  // keeps the checksums from being optimised away
  for (int rep = 0; rep < 5; ++rep) {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < 200; ++i) sink = sink + stratum::hash64(buffer.data(), kMiB);
    best = std::max(best, 200.0 * kMiB / seconds_since(t0) / 1e9);
  }
  return best;
}

int sweep(const SweepArgs& args) {
  const bool direct = stratum::io_direct_supported(args.dir);
  const std::uint64_t file_bytes = static_cast<std::uint64_t>(args.file_mib) * kMiB;
  const std::string path = args.dir + "/io_sweep." + std::to_string(::getpid()) + ".bin";
  stratum::FileDescriptor fd(stratum::io_open_file(path, direct));
  const stratum::FileUnlinkGuard remover(path);  // on every path out of main

  const std::size_t max_block = *std::max_element(args.blocks.begin(), args.blocks.end());
  const int max_depth = *std::max_element(args.depths.begin(), args.depths.end());
  const std::size_t window = std::max<std::size_t>(2, (2 * max_block * max_depth + kRequestBytes - 1) / kRequestBytes);
  stratum::AlignedBuffer pool(window * kRequestBytes);  // reused by every pass
  fill_random(pool, 7);

  std::string note;
  stratum::IoEngineOptions first;
  first.backend = args.backend;
  auto fill_engine = stratum::IoEngine::create(first, &note);
  const char* backend = stratum::io_backend_name(fill_engine->backend());
  std::printf("io_sweep: %s, %s, file %zu MiB, backend %s, %u CPUs (%s)\n", args.dir.c_str(),
              direct ? "O_DIRECT" : "buffered: O_DIRECT refused, numbers are page-cache numbers", args.file_mib,
              backend, std::thread::hardware_concurrency(), cpu_model().c_str());
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  std::printf("block checksum (XXH3-64): %.1f GB/s on one core\n", checksum_gbps());
  {
    std::vector<std::uint64_t> sums(file_bytes / first.block_bytes + 1);
    const PassResult fill = run_pass(*fill_engine, stratum::IoOp::Write, fd.get(), file_bytes, sums, pool, 1e9);
    std::printf("initial write of the whole file (1M blocks, depth 8): %.2f GB/s\n\n", fill.gbps());
  }
  fill_engine.reset();

  struct Best {
    double gbps = 0;
    std::size_t block = 0;
    int depth = 0;
  } best_write, best_read;
  const std::string versus = "x qd" + std::to_string(args.depths.front());
  std::printf("%6s %6s %11s %8s %10s %8s\n", "block", "depth", "write GB/s", versus.c_str(), "read GB/s",
              versus.c_str());
  for (std::size_t block : args.blocks) {
    double base_write = 0, base_read = 0;
    for (int depth : args.depths) {
      stratum::IoEngineOptions options;
      options.backend = args.backend;
      options.block_bytes = block;
      options.queue_depth = depth;
      auto engine = stratum::IoEngine::create(options);
      std::vector<std::uint64_t> sums(file_bytes / block + 1);
      const PassResult w = run_pass(*engine, stratum::IoOp::Write, fd.get(), file_bytes, sums, pool, args.seconds);
      const PassResult r = run_pass(*engine, stratum::IoOp::Read, fd.get(), w.bytes, sums, pool, args.seconds);
      if (base_write == 0) base_write = w.gbps(), base_read = r.gbps();
      std::printf("%6s %6d %11.2f %8.2f %10.2f %8.2f\n", size_text(block).c_str(), depth, w.gbps(),
                  w.gbps() / base_write, r.gbps(), r.gbps() / base_read);
      std::fflush(stdout);
      if (w.gbps() > best_write.gbps) best_write = {w.gbps(), block, depth};
      if (r.gbps() > best_read.gbps) best_read = {r.gbps(), block, depth};
    }
  }
  std::printf("\nbest write: block %s, depth %d: %.2f GB/s\n", size_text(best_write.block).c_str(), best_write.depth,
              best_write.gbps);
  std::printf("best read:  block %s, depth %d: %.2f GB/s\n", size_text(best_read.block).c_str(), best_read.depth,
              best_read.gbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return sweep(parse_args(argc, argv));
  } catch (const stratum::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
