// Asynchronous file I/O for the offload tier: requests are split into blocks of block_bytes,
// up to queue_depth blocks are in flight and refilled as each completes. Two backends: io_uring
// (one submission/completion thread owning the ring) and a pread/pwrite thread pool. Every block
// written gets a checksum (hash64, XXH3-64, core/hash.h) stored in the request's block_sums; every block read is
// verified against it. Errors never cross a thread: they are stored in the request's IoTicket and
// rethrown by wait() as stratum::Error naming the file, offset and what was being moved.
// Does not open files, choose offsets or decide what lives where (src/store does).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace stratum {

enum class IoOp { Read, Write };
enum class IoBackend { Auto, Uring, Threads };

// "auto" | "uring" | "threads"; throws Error on anything else.
IoBackend io_backend_parse(const std::string& name);
const char* io_backend_name(IoBackend backend);

// Deterministic fault injection (tests and the fault scripts): the at_block-th block (0-based,
// counted over the engine's lifetime, per op) of `op` fails as `kind` instead of being moved.
// Parsed from STRATUM_IO_FAULT by the trainer; never set in normal runs.
struct IoFaultPlan {
  enum class Kind { None, NoSpace, IoError, ShortRead, BitFlip };
  Kind kind = Kind::None;
  IoOp op = IoOp::Write;
  long at_block = 0;
  // "" -> none; "enospc@N" (write), "eio-read@N", "eio-write@N", "short-read@N",
  // "flip@N" (read: one bit of the block's data flipped after it arrives). Throws Error otherwise.
  static IoFaultPlan parse(const std::string& spec);
};

struct IoEngineOptions {
  IoBackend backend = IoBackend::Auto;          // Auto: io_uring, else threads
  std::size_t block_bytes = std::size_t{1} << 20;  // multiple of 4096
  int queue_depth = 16;                         // blocks in flight (threads backend: worker count); from io_sweep
  IoFaultPlan fault;
};

// Completion handle of one request. wait() blocks until every block is done and rethrows the
// first error as stratum::Error. done() never blocks.
class IoTicket {
 public:
  virtual ~IoTicket() = default;
  virtual void wait() = 0;
  virtual bool done() const = 0;
  // Done, and wait() would throw. Never blocks.
  virtual bool failed() const = 0;
  // When the last block finished (valid once done()).
  virtual std::chrono::steady_clock::time_point completed_at() const = 0;
};

struct IoRequest {
  IoOp op = IoOp::Read;
  int fd = -1;
  std::uint64_t offset = 0;       // 4096-aligned
  void* buffer = nullptr;         // 4096-aligned, size_bytes long; untouched by the caller until wait()
  std::size_t size_bytes = 0;     // multiple of 4096
  // One checksum per block_bytes block of the request (ceil(size/block_bytes) entries): written
  // by Write requests, verified by Read requests. Owned by the caller; must outlive the ticket.
  // Null: no checksums are computed or verified.
  std::uint64_t* block_sums = nullptr;
  std::string what;               // for errors, e.g. "layer.3.params (/dir/layer.3.params.bin)"
  // Called once on an engine thread right after the ticket became done (successful or not):
  // a wake-up for whoever waits on more than one ticket. Must be quick, must not block and must
  // not call into the engine. Empty, or a request of no bytes (done at once): nothing is called.
  std::function<void()> on_done;
};

// Per op: bytes moved and the wall time with at least one block of that op in flight, so
// bytes / busy_ms is the bandwidth the device delivered while it was working.
struct IoEngineStats {
  std::uint64_t read_bytes = 0, write_bytes = 0;
  double read_busy_ms = 0.0, write_busy_ms = 0.0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Creates the backend asked for. Auto (and Uring) fall back to Threads when io_uring cannot be
  // set up; *note (if given) then receives one line saying why.
  static std::unique_ptr<IoEngine> create(const IoEngineOptions& options, std::string* note = nullptr);
  virtual std::shared_ptr<IoTicket> submit(IoRequest request) = 0;
  virtual IoBackend backend() const = 0;
  virtual std::size_t block_bytes() const = 0;
  virtual int queue_depth() const = 0;
  virtual IoEngineStats stats() const = 0;
};

// Opens (creating if needed) `path` for reading and writing, with O_DIRECT when `direct`.
// Returns the fd; throws Error naming the path on failure.
int io_open_file(const std::string& path, bool direct);
// True when the file system holding `dir` accepts O_DIRECT reads and writes of 4 KiB
// (tmpfs before Linux 6.6, for one, refuses it). Throws Error when `dir` is missing or not writable.
bool io_direct_supported(const std::string& dir);

}  // namespace stratum
