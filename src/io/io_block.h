// Internal to src/io: the block bookkeeping both backends share (Note [io blocks]).
// IoRequestTicket is the ticket of one request; IoBlockQueue hands out the blocks of queued
// requests in order, each with its injected fault decided; io_block_start / io_block_finish are
// the steps before and after a block's transfer (write checksums, injected faults, size and read
// checksum checks, error messages). Definitions live in io_engine.cpp. Does not own threads,
// rings or files and does not move bytes: the backends do.
//
// Note [io blocks]: a request of size S is split into ceil(S / block_bytes) blocks; block i covers
// bytes [i * block_bytes, min(S, (i + 1) * block_bytes)) of the buffer and of the file range
// starting at the request's offset, and owns block_sums[i]. A backend pops a block, calls
// io_block_start (a non-zero result fails the block without moving it), moves it, and passes the
// outcome to io_block_finish, which records it in the ticket. Blocks of one request may finish in
// any order; the ticket keeps the error of the lowest-numbered failed block, so the message does
// not depend on timing. Injected faults are decided when a block leaves the queue: the n-th block
// of an op popped over the queue's lifetime is block n of IoFaultPlan::at_block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "io/io_engine.h"

namespace stratum {

class IoRequestTicket final : public IoTicket {
 public:
  // Checks the request (alignment, sizes, fd) and throws BugError when it breaks the contract.
  IoRequestTicket(IoRequest request, std::size_t block_bytes);

  const IoRequest& request() const { return request_; }
  std::size_t block_bytes() const { return block_bytes_; }
  std::size_t block_count() const { return block_count_; }

  // Records block `index` as finished; `error` is null on success.
  void block_done(std::size_t index, std::exception_ptr error);

  void wait() override;
  bool done() const override;
  bool failed() const override;
  std::chrono::steady_clock::time_point completed_at() const override;

 private:
  const IoRequest request_;
  const std::size_t block_bytes_;
  const std::size_t block_count_;
  mutable std::mutex mutex_;
  std::condition_variable all_done_;
  std::size_t blocks_left_;             // guarded by mutex_
  std::size_t error_block_ = 0;         // guarded by mutex_; valid when failed_
  bool failed_ = false;                 // guarded by mutex_
  std::chrono::steady_clock::time_point completed_at_;  // guarded by mutex_
  std::string error_message_;           // guarded by mutex_
};

// Busy time per op (IoEngineStats): a block counts from io_block_start to io_block_finish.
class IoBusyClock {
 public:
  void block_start(IoOp op);
  void block_finish(IoOp op, std::size_t bytes);
  IoEngineStats stats() const;

 private:
  mutable std::mutex mutex_;
  int in_flight_[2] = {0, 0};
  std::chrono::steady_clock::time_point since_[2];
  double busy_ms_[2] = {0.0, 0.0};
  std::uint64_t bytes_[2] = {0, 0};
};

// One block of a request, as a backend moves it.
struct IoBlock {
  std::shared_ptr<IoRequestTicket> ticket;
  std::size_t index = 0;
  std::uint64_t file_offset = 0;
  unsigned char* data = nullptr;  // inside the request's buffer
  std::size_t size_bytes = 0;
  IoFaultPlan::Kind fault = IoFaultPlan::Kind::None;
  IoBusyClock* busy = nullptr;  // the queue's
};

// FIFO of requests handed out block by block, shared by one engine's submitter and its
// backend thread(s).
class IoBlockQueue {
 public:
  explicit IoBlockQueue(const IoFaultPlan& fault) : fault_(fault) {}

  void push(std::shared_ptr<IoRequestTicket> ticket);
  // Takes the next block. With `wait`, blocks until there is one or the queue is closed and empty;
  // returns false then, or at once (without `wait`) when nothing is queued.
  bool pop(IoBlock* block, bool wait);
  // Wakes every waiting pop; pops still drain what is queued. No pushes after close().
  void close();
  bool closed_and_empty() const;
  IoEngineStats stats() const { return busy_.stats(); }

 private:
  const IoFaultPlan fault_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<IoRequestTicket>> tickets_;  // guarded by mutex_
  std::size_t front_next_block_ = 0;                      // next block of tickets_.front()
  long blocks_popped_[2] = {0, 0};                        // per IoOp, over the queue's lifetime
  bool closed_ = false;
  IoBusyClock busy_;
};

// Before a block moves: a Write block's checksum goes into block_sums. Returns 0 to go ahead, or
// -errno when an injected fault fails the block without moving it.
int io_block_start(const IoBlock& block) noexcept;

// After a block moved: `result` is the number of bytes moved, or -errno. Applies injected read
// faults, checks for short transfers and (reads) the checksum, and records the outcome.
void io_block_finish(const IoBlock& block, long long result) noexcept;

}  // namespace stratum
