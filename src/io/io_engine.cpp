// The backend-independent half of the I/O engine: backend and fault-spec parsing, the factory,
// the block bookkeeping of io_block.h (Note [io blocks]), the per-block XXH3 checksums (core/hash.h), and opening and probing
// offload files. Does not move bytes: uring_io_engine.cpp and thread_io_engine.cpp do.
#include "io/io_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>
#include <utility>

#include "core/aligned_buffer.h"
#include "core/file_descriptor.h"
#include "core/file_util.h"
#include "core/hash.h"
#include "io/io_block.h"
#include "io/thread_io_engine.h"
#include "io/uring_io_engine.h"
#include "stratum/error.h"

namespace stratum {

// ---- backend names, fault specs, the factory ----

IoBackend io_backend_parse(const std::string& name) {
  if (name == "auto") return IoBackend::Auto;
  if (name == "uring") return IoBackend::Uring;
  if (name == "threads") return IoBackend::Threads;
  STRATUM_FAIL("[io] unknown I/O backend '", name, "': expected auto, uring or threads");
}

const char* io_backend_name(IoBackend backend) {
  switch (backend) {
    case IoBackend::Auto: return "auto";
    case IoBackend::Uring: return "uring";
    case IoBackend::Threads: return "threads";
  }
  return "?";
}

IoFaultPlan IoFaultPlan::parse(const std::string& spec) {
  IoFaultPlan plan;
  if (spec.empty()) return plan;
  struct Form {
    const char* name;
    Kind kind;
    IoOp op;
  };
  static constexpr Form kForms[] = {{"enospc", Kind::NoSpace, IoOp::Write},
                                    {"eio-read", Kind::IoError, IoOp::Read},
                                    {"eio-write", Kind::IoError, IoOp::Write},
                                    {"short-read", Kind::ShortRead, IoOp::Read},
                                    {"flip", Kind::BitFlip, IoOp::Read}};
  const std::size_t at = spec.find('@');
  const std::string name = spec.substr(0, at);
  const char* number = at == std::string::npos ? nullptr : spec.c_str() + at + 1;
  const char* end = spec.c_str() + spec.size();
  long block = -1;
  // Digits only: no sign, no spaces, nothing after the number.
  bool number_ok = number != nullptr && number != end && *number >= '0' && *number <= '9';
  if (number_ok) {
    const std::from_chars_result parsed = std::from_chars(number, end, block);
    number_ok = parsed.ec == std::errc() && parsed.ptr == end;
  }
  for (const Form& form : kForms) {
    if (name != form.name || !number_ok) continue;
    plan.kind = form.kind;
    plan.op = form.op;
    plan.at_block = block;
    return plan;
  }
  STRATUM_FAIL("[io] bad fault spec '", spec, "' (STRATUM_IO_FAULT): expected enospc@N, eio-read@N, ",
               "eio-write@N, short-read@N or flip@N with N a 0-based block number");
}

namespace {
void io_options_check(const IoEngineOptions& options) {
  STRATUM_CHECK(options.block_bytes > 0 && options.block_bytes % AlignedBuffer::kAlignmentBytes == 0 &&
                    options.block_bytes <= (std::size_t{1} << 30),
                "[io] block size must be a multiple of 4096 bytes between 4 KiB and 1 GiB, got ",
                options.block_bytes);
  STRATUM_CHECK(options.queue_depth >= 1 && options.queue_depth <= 1024,
                "[io] queue depth must be between 1 and 1024, got ", options.queue_depth);
  using Kind = IoFaultPlan::Kind;
  const IoFaultPlan& fault = options.fault;
  const bool read_only_kind = fault.kind == Kind::ShortRead || fault.kind == Kind::BitFlip;
  if ((read_only_kind && fault.op != IoOp::Read) || (fault.kind == Kind::NoSpace && fault.op != IoOp::Write))
    throw BugError("[io] bug: the fault plan pairs a read-only fault with writes or 'no space' with reads");
  STRATUM_CHECK(fault.at_block >= 0, "[io] fault block number must be >= 0, got ", fault.at_block);
}
}  // namespace

std::unique_ptr<IoEngine> IoEngine::create(const IoEngineOptions& options, std::string* note) {
  io_options_check(options);
  if (options.backend != IoBackend::Threads) {
    std::string why_not;
    if (auto engine = uring_io_engine_create(options, &why_not)) return engine;
    if (note != nullptr) *note = "io_uring is unavailable (" + why_not + "); using the pread/pwrite thread backend";
  }
  return thread_io_engine_create(options);
}

// ---- block bookkeeping (Note [io blocks]) ----

IoRequestTicket::IoRequestTicket(IoRequest request, std::size_t block_bytes)
    : request_(std::move(request)),
      block_bytes_(block_bytes),
      block_count_((request_.size_bytes + block_bytes - 1) / block_bytes),
      blocks_left_(block_count_) {
  constexpr std::size_t kAlign = AlignedBuffer::kAlignmentBytes;
  const IoRequest& r = request_;
  if (r.size_bytes == 0) return;
  if (r.fd < 0 || r.buffer == nullptr || r.offset % kAlign != 0 || r.size_bytes % kAlign != 0 ||
      reinterpret_cast<std::uintptr_t>(r.buffer) % kAlign != 0)
    throw BugError(detail::concat("[io] bug: request for ", r.what, " breaks the engine's contract (fd ", r.fd,
                                  ", offset ", r.offset, ", ", r.size_bytes,
                                  " bytes; offset, size and buffer must be 4096-aligned)"));
}

void IoRequestTicket::block_done(std::size_t index, std::exception_ptr error) {
  // Only the message crosses threads: every wait() throws its own Error, so no exception object
  // is shared between the I/O thread and the waiters (ThreadSanitizer cannot see libstdc++'s
  // exception_ptr reference counting).
  std::string message;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "[io] unknown error";
    }
    error = nullptr;
  }
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!message.empty() && (!failed_ || index < error_block_)) {
      failed_ = true;
      error_message_ = std::move(message);
      error_block_ = index;
    }
    if (--blocks_left_ == 0) {
      completed_at_ = std::chrono::steady_clock::now();
      all_done_.notify_all();
      last = true;
    }
  }
  // The engine's block still holds the ticket, so request_ outlives the call.
  if (last && request_.on_done) request_.on_done();
}

std::chrono::steady_clock::time_point IoRequestTicket::completed_at() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_at_;
}

void IoRequestTicket::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  all_done_.wait(lock, [this] { return blocks_left_ == 0; });
  if (failed_) throw Error(error_message_);
}

bool IoRequestTicket::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_left_ == 0;
}

bool IoRequestTicket::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_left_ == 0 && failed_;
}

void IoBlockQueue::push(std::shared_ptr<IoRequestTicket> ticket) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    STRATUM_ASSERT(!closed_);
    tickets_.push_back(std::move(ticket));
  }
  ready_.notify_one();
}

bool IoBlockQueue::pop(IoBlock* block, bool wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait) ready_.wait(lock, [this] { return !tickets_.empty() || closed_; });
  if (tickets_.empty()) return false;
  const std::shared_ptr<IoRequestTicket>& ticket = tickets_.front();
  const IoRequest& request = ticket->request();
  const std::size_t index = front_next_block_;
  const std::size_t begin = index * ticket->block_bytes();
  block->ticket = ticket;
  block->index = index;
  block->file_offset = request.offset + begin;
  block->data = static_cast<unsigned char*>(request.buffer) + begin;
  block->size_bytes = std::min(ticket->block_bytes(), request.size_bytes - begin);
  const long seen = blocks_popped_[static_cast<int>(request.op)]++;
  const bool faulty = fault_.kind != IoFaultPlan::Kind::None && fault_.op == request.op && seen == fault_.at_block;
  block->fault = faulty ? fault_.kind : IoFaultPlan::Kind::None;
  block->busy = &busy_;
  if (++front_next_block_ == ticket->block_count()) {
    tickets_.pop_front();
    front_next_block_ = 0;
  }
  return true;
}

void IoBlockQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  ready_.notify_all();
}

bool IoBlockQueue::closed_and_empty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_ && tickets_.empty();
}

void IoBusyClock::block_start(IoOp op) {
  const int i = static_cast<int>(op);
  std::lock_guard<std::mutex> lock(mutex_);
  if (in_flight_[i]++ == 0) since_[i] = std::chrono::steady_clock::now();
}

void IoBusyClock::block_finish(IoOp op, std::size_t bytes) {
  const int i = static_cast<int>(op);
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_[i] += bytes;
  if (--in_flight_[i] == 0)
    busy_ms_[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since_[i]).count();
}

IoEngineStats IoBusyClock::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  IoEngineStats s;
  s.read_bytes = bytes_[0];
  s.write_bytes = bytes_[1];
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    double busy = busy_ms_[i];
    if (in_flight_[i] > 0) busy += std::chrono::duration<double, std::milli>(now - since_[i]).count();
    (i == 0 ? s.read_busy_ms : s.write_busy_ms) = busy;
  }
  return s;
}

int io_block_start(const IoBlock& block) noexcept {
  const IoRequest& request = block.ticket->request();
  if (block.busy != nullptr) block.busy->block_start(request.op);
  if (block.fault == IoFaultPlan::Kind::NoSpace) return -ENOSPC;
  if (block.fault == IoFaultPlan::Kind::IoError) return -EIO;
  if (request.op == IoOp::Write && request.block_sums != nullptr)
    request.block_sums[block.index] = hash64(block.data, block.size_bytes);
  return 0;
}

namespace {
// The one-line message for a failed block, or "" when it arrived whole and intact.
std::string io_block_problem(const IoBlock& block, long long result) {
  const IoRequest& request = block.ticket->request();
  const bool reading = request.op == IoOp::Read;
  const std::string what = request.what.empty() ? "fd " + std::to_string(request.fd) : request.what;
  const std::string where = what + " at offset " + std::to_string(block.file_offset);
  if (result == -ENOSPC)
    return "[io] no space left on device writing " + where +
           ": free space under --offload-dir or choose another directory";
  if (result < 0)
    return std::string("[io] I/O error ") + (reading ? "reading " : "writing ") + where + ": " +
           std::strerror(static_cast<int>(-result));
  if (static_cast<std::size_t>(result) < block.size_bytes)
    return std::string("[io] short ") + (reading ? "read of " : "write of ") + where + ": " +
           (reading ? "got " : "wrote ") + std::to_string(result) + " of " + std::to_string(block.size_bytes) +
           " bytes" + (reading ? " (the file is shorter than expected)" : "");
  if (reading && request.block_sums != nullptr &&
      hash64(block.data, block.size_bytes) != request.block_sums[block.index])
    return "[io] checksum mismatch reading " + where + " (block " + std::to_string(block.index) +
           "): the offload file was modified or the disk returned bad data";
  return {};
}
}  // namespace

void io_block_finish(const IoBlock& block, long long result) noexcept {
  if (result >= 0 && block.fault == IoFaultPlan::Kind::ShortRead)
    result = std::min<long long>(result, static_cast<long long>(block.size_bytes / 2));
  if (result > 0 && block.fault == IoFaultPlan::Kind::BitFlip) block.data[result / 2] ^= 0x10;
  std::exception_ptr error;
  try {
    std::string problem = io_block_problem(block, result);
    if (!problem.empty()) error = std::make_exception_ptr(Error(problem));
  } catch (...) {
    error = std::current_exception();  // out of memory while writing the message
  }
  if (block.busy != nullptr) block.busy->block_finish(block.ticket->request().op, result > 0 ? result : 0);
  block.ticket->block_done(block.index, std::move(error));
}

// ---- offload files ----

int io_open_file(const std::string& path, bool direct) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  STRATUM_CHECK(fd >= 0, "[io] cannot open offload file ", path, direct ? " with O_DIRECT" : "", ": ",
                std::strerror(errno));
  return fd;
}


bool io_direct_supported(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    STRATUM_CHECK(errno != ENOENT, "[io] --offload-dir ", dir, " does not exist: create it or choose another");
    STRATUM_FAIL("[io] cannot use --offload-dir ", dir, ": ", std::strerror(errno));
  }
  STRATUM_CHECK(S_ISDIR(st.st_mode), "[io] --offload-dir ", dir, " is not a directory: choose a directory");
  STRATUM_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "[io] --offload-dir ", dir,
                " is not writable (permission denied): choose another or fix its permissions");

  const std::string path = dir + "/.stratum-direct-probe." + std::to_string(::getpid());
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600));
  if (fd.get() < 0 && errno == EINVAL) return false;  // the file system refuses O_DIRECT
  STRATUM_CHECK(fd.get() >= 0, "[io] --offload-dir ", dir, " is not writable (", std::strerror(errno),
                "): choose another or fix its permissions");
  const FileUnlinkGuard probe(path);  // on every path out
  AlignedBuffer buffer(AlignedBuffer::kAlignmentBytes);
  std::memset(buffer.data(), 0x5A, buffer.size_bytes());
  ssize_t moved = ::pwrite(fd.get(), buffer.data(), buffer.size_bytes(), 0);
  if (moved >= 0) moved = ::pread(fd.get(), buffer.data(), buffer.size_bytes(), 0);
  if (moved < 0 && errno == EINVAL) return false;
  STRATUM_CHECK(moved >= 0, "[io] cannot write a test file in --offload-dir ", dir, ": ", std::strerror(errno));
  return static_cast<std::size_t>(moved) == buffer.size_bytes();
}

}  // namespace stratum
