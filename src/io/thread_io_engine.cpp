// The pread/pwrite thread backend; see thread_io_engine.h.
#include "io/thread_io_engine.h"

#include <unistd.h>

#include <cerrno>
#include <thread>
#include <algorithm>
#include <vector>

#include "io/io_block.h"

namespace stratum {

namespace {

// Moves the block with pread/pwrite, looping over partial transfers (buffered I/O) and EINTR.
// Returns the bytes moved (fewer than the block at end of file) or -errno.
long long block_transfer(const IoBlock& block) {
  const IoRequest& request = block.ticket->request();
  std::size_t moved = 0;
  while (moved < block.size_bytes) {
    unsigned char* data = block.data + moved;
    const std::size_t size = block.size_bytes - moved;
    const auto offset = static_cast<off_t>(block.file_offset + moved);
    const ssize_t n = request.op == IoOp::Read ? ::pread(request.fd, data, size, offset)
                                               : ::pwrite(request.fd, data, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    moved += static_cast<std::size_t>(n);
  }
  return static_cast<long long>(moved);
}

class ThreadIoEngine final : public IoEngine {
  static constexpr int kMaxWorkers = 64;

 public:
  explicit ThreadIoEngine(const IoEngineOptions& options)
      : block_bytes_(options.block_bytes), queue_depth_(options.queue_depth), queue_(options.fault) {
    try {
      // A thread per block in flight, up to kMaxWorkers: --io-depth 1024 started 2048 threads
      // (two engines) for no more bandwidth; deeper requests wait in the queue.
      for (int i = 0; i < std::min(queue_depth_, kMaxWorkers); ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ThreadIoEngine(const ThreadIoEngine&) = delete;
  ThreadIoEngine& operator=(const ThreadIoEngine&) = delete;
  // Finishes every queued block first: buffers handed to submit() are never touched afterwards.
  ~ThreadIoEngine() override { stop(); }

  std::shared_ptr<IoTicket> submit(IoRequest request) override {
    auto ticket = std::make_shared<IoRequestTicket>(std::move(request), block_bytes_);
    if (ticket->block_count() > 0) queue_.push(ticket);
    return ticket;
  }
  IoBackend backend() const override { return IoBackend::Threads; }
  std::size_t block_bytes() const override { return block_bytes_; }
  int queue_depth() const override { return queue_depth_; }
  IoEngineStats stats() const override { return queue_.stats(); }

 private:
  void stop() {
    queue_.close();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  void worker_loop() {
    IoBlock block;
    while (queue_.pop(&block, /*wait=*/true)) {
      const int refused = io_block_start(block);
      io_block_finish(block, refused != 0 ? refused : block_transfer(block));
      block = IoBlock{};  // let go of the ticket
    }
  }

  const std::size_t block_bytes_;
  const int queue_depth_;
  IoBlockQueue queue_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> thread_io_engine_create(const IoEngineOptions& options) {
  return std::make_unique<ThreadIoEngine>(options);
}

}  // namespace stratum
