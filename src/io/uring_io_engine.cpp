// The io_uring backend; see uring_io_engine.h.
// One ring thread does everything that touches the ring: it takes blocks from the engine's queue
// into free slots (at most queue_depth), prepares one read or write per slot, submits, waits for
// completions and hands each finished block to io_block_finish (Note [io blocks]). submit() only
// queues the request and bumps an eventfd that the ring polls, so new work is picked up even
// while every submitted block is still in flight.
#include "io/uring_io_engine.h"

#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/file_descriptor.h"
#include "io/io_block.h"

namespace stratum {

namespace {

constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};  // user_data of the eventfd poll

// Owner of one io_uring instance.
class UringRing {
 public:
  UringRing() = default;
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;
  ~UringRing() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  // 0 or -errno.
  int init(unsigned entries) {
    const int result = io_uring_queue_init(entries, &ring_, 0);
    ready_ = result == 0;
    return result;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool ready_ = false;
};

// "" when the kernel supports every opcode the engine uses, else which one it lacks.
std::string uring_missing_opcode(io_uring* ring) {
  io_uring_probe* probe = io_uring_get_probe_ring(ring);
  if (probe == nullptr) return "the kernel cannot report io_uring opcodes (needs Linux 5.6 or later)";
  std::string missing;
  const std::pair<int, const char*> needed[] = {
      {IORING_OP_READ, "READ"}, {IORING_OP_WRITE, "WRITE"}, {IORING_OP_POLL_ADD, "POLL_ADD"}};
  for (auto [op, name] : needed)
    if (missing.empty() && !io_uring_opcode_supported(probe, op))
      missing = std::string("the kernel lacks IORING_OP_") + name;
  io_uring_free_probe(probe);
  return missing;
}

class UringIoEngine final : public IoEngine {
 public:
  explicit UringIoEngine(const IoEngineOptions& options)
      : block_bytes_(options.block_bytes), queue_depth_(options.queue_depth), queue_(options.fault) {}
  UringIoEngine(const UringIoEngine&) = delete;
  UringIoEngine& operator=(const UringIoEngine&) = delete;
  // Finishes every queued block first: buffers handed to submit() are never touched afterwards.
  ~UringIoEngine() override {
    queue_.close();
    wake();
    if (ring_thread_.joinable()) ring_thread_.join();
  }

  // Sets up the ring and starts the ring thread; returns why not ("" on success).
  std::string start() {
    const int result = ring_.init(static_cast<unsigned>(queue_depth_) + 1);  // + the eventfd poll
    if (result < 0) return std::strerror(-result);
    std::string missing = uring_missing_opcode(ring_.get());
    if (!missing.empty()) return missing;
    wake_fd_ = FileDescriptor(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (wake_fd_.get() < 0) return std::string("eventfd failed: ") + std::strerror(errno);
    slots_.resize(static_cast<std::size_t>(queue_depth_));
    for (int i = queue_depth_ - 1; i >= 0; --i) free_slots_.push_back(i);
    ring_thread_ = std::thread([this] { ring_loop(); });
    return {};
  }

  std::shared_ptr<IoTicket> submit(IoRequest request) override {
    auto ticket = std::make_shared<IoRequestTicket>(std::move(request), block_bytes_);
    if (ticket->block_count() > 0) {
      queue_.push(ticket);
      wake();
    }
    return ticket;
  }
  IoBackend backend() const override { return IoBackend::Uring; }
  std::size_t block_bytes() const override { return block_bytes_; }
  int queue_depth() const override { return queue_depth_; }
  IoEngineStats stats() const override { return queue_.stats(); }

 private:
  struct Slot {
    IoBlock block;
    std::size_t moved_bytes = 0;  // by earlier partial writes of this block
  };

  void wake() {
    if (wake_fd_.get() < 0) return;  // never started
    const std::uint64_t one = 1;
    const ssize_t written = ::write(wake_fd_.get(), &one, sizeof one);  // fails only if the count is huge:
    (void)written;                                                      // the ring wakes anyway
  }

  // Every sqe below is available: at most queue_depth slots plus the eventfd poll are outstanding,
  // prepared or submitted, and the submission queue has at least that many entries.
  void arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    io_uring_prep_poll_add(sqe, wake_fd_.get(), POLLIN);
    sqe->user_data = kWakeTag;
  }

  void prepare(std::size_t slot_index) {
    Slot& slot = slots_[slot_index];
    const IoBlock& block = slot.block;
    const IoRequest& request = block.ticket->request();
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    unsigned char* data = block.data + slot.moved_bytes;
    const auto size = static_cast<unsigned>(block.size_bytes - slot.moved_bytes);
    const std::uint64_t offset = block.file_offset + slot.moved_bytes;
    if (request.op == IoOp::Read)
      io_uring_prep_read(sqe, request.fd, data, size, offset);
    else
      io_uring_prep_write(sqe, request.fd, data, size, offset);
    sqe->user_data = slot_index;
  }

  // Takes queued blocks into free slots.
  void refill() {
    IoBlock block;
    while (!free_slots_.empty() && queue_.pop(&block, /*wait=*/false)) {
      const int refused = io_block_start(block);  // the write checksum, right before submitting
      if (refused != 0) {
        io_block_finish(block, refused);
        continue;
      }
      const std::size_t slot_index = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot_index] = Slot{std::move(block), 0};
      prepare(slot_index);
      ++in_flight_;
    }
  }

  // io_uring_enter fails on a working ring only for a lack of kernel memory (EAGAIN) or a full
  // completion queue (EBUSY, impossible here: it holds twice the submission queue); both pass.
  void submit_prepared() {
    while (io_uring_sq_ready(ring_.get()) > 0) {
      const int result = io_uring_submit(ring_.get());
      if (result < 0 && result != -EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void complete(std::uint64_t tag, int result) {
    if (tag == kWakeTag) {
      std::uint64_t count = 0;
      const ssize_t got = ::read(wake_fd_.get(), &count, sizeof count);  // resets the count
      (void)got;
      arm_wake();
      return;
    }
    Slot& slot = slots_[tag];
    const bool writing = slot.block.ticket->request().op == IoOp::Write;
    const bool partial_write =
        writing && result > 0 && slot.moved_bytes + static_cast<std::size_t>(result) < slot.block.size_bytes;
    if (result == -EINTR || result == -EAGAIN || partial_write) {  // go on with the rest
      if (result > 0) slot.moved_bytes += static_cast<std::size_t>(result);
      prepare(tag);
      return;
    }
    // A short read is final: the kernel already retries buffered reads, so it means end of file.
    io_block_finish(slot.block, result < 0 ? result : static_cast<long long>(slot.moved_bytes) + result);
    slot = Slot{};
    free_slots_.push_back(tag);
    --in_flight_;
  }

  // Waits for at least one completion and handles all that are there.
  void reap() {
    io_uring_cqe* cqe = nullptr;
    int result;
    do {
      result = io_uring_wait_cqe(ring_.get(), &cqe);
    } while (result == -EINTR);
    if (result < 0) return;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(ring_.get(), head, cqe) {
      complete(cqe->user_data, cqe->res);
      ++seen;
    }
    io_uring_cq_advance(ring_.get(), seen);
  }

  void ring_loop() {
    arm_wake();
    for (;;) {
      refill();
      submit_prepared();
      if (in_flight_ == 0 && queue_.closed_and_empty()) return;
      reap();
    }
  }

  const std::size_t block_bytes_;
  const int queue_depth_;
  IoBlockQueue queue_;
  UringRing ring_;
  FileDescriptor wake_fd_;             // eventfd: submit() and the destructor bump it
  std::vector<Slot> slots_;            // queue_depth_ of them; ring thread only
  std::vector<std::size_t> free_slots_;  // ring thread only
  int in_flight_ = 0;                  // slots in use; ring thread only
  std::thread ring_thread_;
};

}  // namespace

std::unique_ptr<IoEngine> uring_io_engine_create(const IoEngineOptions& options, std::string* why_not) {
  auto engine = std::make_unique<UringIoEngine>(options);
  std::string problem = engine->start();
  if (problem.empty()) return engine;
  if (why_not != nullptr) *why_not = std::move(problem);
  return nullptr;
}

}  // namespace stratum
