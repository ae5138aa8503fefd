// TieredSegmentStore; see tiered_segment_store.h, Note [unit states], Note [schedule eviction].
#include "store/tiered_segment_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/byte_size.h"
#include "core/file_util.h"
#include "stratum/error.h"

namespace stratum {

namespace {
constexpr const char* kLockFileName = "stratum-offload.lock";
// Note [own subdirectory]: the offload files live in a subdirectory of --offload-dir that is
// Stratum's (created, emptied and removed by the run holding the lock), so a user's own files
// in --offload-dir, whatever their names, are never overwritten or deleted.
constexpr const char* kSubdirName = "stratum-offload";


void file_preallocate(int fd, std::size_t bytes, const std::string& path) {
  STRATUM_CHECK(::ftruncate(fd, 0) == 0, "[store] cannot truncate ", path, ": ", std::strerror(errno));
  if (bytes == 0) return;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return;
  const int err = errno;
  STRATUM_CHECK(err != ENOSPC, "[store] no space left on the device of ", path, " for ", bytes,
                " bytes of offloaded state: free space under --offload-dir or choose another directory");
  STRATUM_CHECK(err == EOPNOTSUPP || err == ENOSYS, "[store] cannot allocate ", bytes, " bytes for ", path, ": ",
                std::strerror(err));
  STRATUM_CHECK(::ftruncate(fd, static_cast<off_t>(bytes)) == 0, "[store] cannot size ", path, ": ",
                std::strerror(errno));
}
// Calls visit(path, st) for each regular file (lstat: no links followed) directly in subdir.
template <class Visit>
void regular_files_visit(const std::string& subdir, Visit visit) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(subdir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) visit(it->path(), st);
  }
}
}  // namespace

void offload_disk_check(const std::string& dir, std::size_t free_bytes, std::size_t need_bytes) {
  STRATUM_CHECK(free_bytes >= need_bytes, "[store] --offload-dir ", dir, " has ", bytes_text(static_cast<double>(free_bytes)),
                " free but this run needs at least ", bytes_text(static_cast<double>(need_bytes)),
                " there for offloaded state: free space or choose another directory");
}

std::size_t offload_free_bytes(const std::string& dir) {
  std::size_t bytes = dir_free_bytes(dir, "--offload-dir");
  // A live run holds the lock (flock: released when its process ends): its files are its own.
  const int lock_fd = ::open((dir + "/" + kLockFileName).c_str(), O_RDONLY | O_CLOEXEC);
  if (lock_fd >= 0) {
    const bool held = ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0;
    ::close(lock_fd);  // and the probe's own lock with it
    if (held) return bytes;
  }
  regular_files_visit(dir + "/" + kSubdirName, [&](const std::filesystem::path&, const struct stat& st) {
    bytes += static_cast<std::size_t>(st.st_blocks) * 512;  // what unlinking it gives back
  });
  return bytes;
}

// Note [own subdirectory]: files in it when a run takes the lock are a dead run's (a live one
// holds the lock): removed, so their space is the new run's and no name is left behind forever.
static void stale_offload_files_remove(const std::string& subdir) {
  regular_files_visit(subdir, [](const std::filesystem::path& path, const struct stat&) { ::unlink(path.c_str()); });
}

TieredSegmentStore::TieredSegmentStore(UnitTable units_in, const TieredStoreOptions& options)
    : SegmentStore(std::move(units_in)),
      options_(options),
      entries_(static_cast<std::size_t>(units().count())),
      policy_(units().count()),
      training_thread_(std::this_thread::get_id()) {
  STRATUM_CHECK(options.prefetch_depth >= 0 && options.prefetch_depth <= 64, "[store] --prefetch must be in 0..64, got ",
                options.prefetch_depth);
  std::string dir = options.offload_dir;
  STRATUM_CHECK(!dir.empty(), "[store] --mem-budget needs --offload-dir DIR for what does not fit in the budget");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  options_.offload_dir = dir;
  const bool direct = io_direct_supported(dir) && options.direct_io;  // also checks dir exists, writable
  IoEngineOptions io = options.io;
  std::string notes;
  if (!direct) {
    if (io.backend == IoBackend::Auto) io.backend = IoBackend::Threads;
    notes += "; " + dir + " refuses O_DIRECT (tmpfs?), so I/O goes through the page cache";
  }

  const std::vector<bool> file_used = units().files_used(options.unused);  // Note [zero sharding]
  const std::size_t free_bytes =
      options.free_bytes_override > 0 ? options.free_bytes_override : offload_free_bytes(dir);
  offload_disk_check(dir, free_bytes, units().used_file_bytes(options.unused));

  lock_ = DirLock(dir, kLockFileName, "[store] another stratum run is using --offload-dir " + dir +
                                         "; give each run its own directory");
  try {
    // Reads and writes on separate engines (queues, ring threads): write-backs never sit in
    // front of the reads the next blocks wait for.
    read_engine_ = IoEngine::create(io, &notes);
    std::string write_notes;  // the same notes again
    write_engine_ = IoEngine::create(io, &write_notes);
    subdir_ = dir + "/" + kSubdirName;  // Note [own subdirectory]
    if (::mkdir(subdir_.c_str(), 0700) != 0 && errno != EEXIST)
      STRATUM_FAIL("[store] cannot create ", subdir_, ": ", std::strerror(errno), "; choose another --offload-dir");
    struct stat st {};
    STRATUM_CHECK(::stat(subdir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "[store] --offload-dir ", dir,
                  " holds a file named ", kSubdirName, " where Stratum keeps its offload files; move it or choose "
                  "another directory");
    stale_offload_files_remove(subdir_);
    for (int f = 0; f < units().file_count(); ++f) {
      if (!file_used[f]) {  // another rank's moments alone
        files_.emplace_back();
        paths_.emplace_back();
        continue;
      }
      const std::string path = subdir_ + "/" + units().file_name(f);
      files_.emplace_back(io_open_file(path, direct));
      paths_.push_back(path);  // only files this run opened are removed again
      file_preallocate(files_.back().get(), units().file_bytes(f), path);
    }
  } catch (...) {
    files_remove();
    throw;
  }
  const std::size_t block = read_engine_->block_bytes();
  for (int u = 0; u < units().count(); ++u)
    entries_[u].block_sums.assign((units().bytes(u) + block - 1) / block, 0);
  char text[256];
  std::snprintf(text, sizeof text, "%s%s, %zu KiB blocks, queue depth %d, prefetch %d", io_backend_name(read_engine_->backend()),
                direct ? ", O_DIRECT" : ", buffered", block / 1024, read_engine_->queue_depth(), options.prefetch_depth);
  describe_ = text + notes;
  streaming_ = units().used_bytes(options.unused) > options.budget_bytes;
  totals_.budget_bytes = options.budget_bytes;
  moving_pages_ = options.budget_bytes / AlignedBuffer::kBlockBytes <= kMovingMaxBlocks;
  if (streaming_) {
    try {
      refresher_ = std::thread([this] { refresher_run(); });
    } catch (...) {
      files_remove();
      throw;
    }
  }
}

void TieredSegmentStore::refresher_wake() {
  {
    std::lock_guard<std::mutex> wake(wake_mutex_);
    wake_pending_ = true;
  }
  wake_cv_.notify_one();
}

void TieredSegmentStore::refresher_run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> wake(wake_mutex_);
      wake_cv_.wait(wake, [this] { return wake_pending_ || wake_stop_; });
      if (wake_stop_) return;
      wake_pending_ = false;
    }
    Lock lock(mutex_);
    try {
      prefetch(lock);
    } catch (const std::exception&) {
      // Only a bug gets here (reap leaves failed tickets to the training thread); the training
      // thread's own prefetch or acquire meets the same state and reports it.
    }
  }
}

TieredSegmentStore::~TieredSegmentStore() {
  if (refresher_.joinable()) {
    {
      std::lock_guard<std::mutex> wake(wake_mutex_);
      wake_stop_ = true;
    }
    wake_cv_.notify_one();
    refresher_.join();
  }
  {
    Lock lock(mutex_);
    while (!in_flight_.empty()) {
      const int unit = in_flight_.back();
      in_flight_.pop_back();
      std::shared_ptr<IoTicket> ticket = std::move(entries_[unit].ticket);
      lock.unlock();
      try {
        ticket->wait();
      } catch (...) {  // shutting down: the error was (or will be) reported by whoever needed the data
      }
      lock.lock();
    }
  }
  read_engine_.reset();
  write_engine_.reset();
  files_remove();
}

void TieredSegmentStore::files_remove() {
  files_.clear();
  for (const std::string& path : paths_)
    if (!path.empty()) ::unlink(path.c_str());
  paths_.clear();
  if (!subdir_.empty()) ::rmdir(subdir_.c_str());  // stays only if something else was put there
  lock_.release();
}

std::string TieredSegmentStore::where(int unit) const {
  return units().name(unit) + " (" + paths_[units().file(unit)] + ")";
}

void TieredSegmentStore::unit_pin(int unit, int group, int delta) {
  Lock lock(mutex_);
  policy_.pin(unit, group, delta);
}

void TieredSegmentStore::unit_done_ahead(int unit, int group) {
  Lock lock(mutex_);
  policy_.done_ahead(unit, group);
}

void TieredSegmentStore::unit_prefetch(int unit) {
  // Depth 0 loads every unit on use, read-ahead included: what it reads then does not depend on
  // how the optimizer worker's timing falls against the schedule.
  if (options_.prefetch_depth == 0) return;
  Lock lock(mutex_);
  reap(lock);
  Entry& e = entries_[unit];
  if (e.state != State::Absent || !e.on_disk) return;
  const std::size_t bytes = units().held_bytes(unit);
  if (!space_make(lock, bytes, policy_.distance(unit), false, unit) || e.state != State::Absent) return;
  e.buffer = buffer_take(bytes);
  io_start(unit, IoOp::Read);
}

// Note [buffer pool]: buffers of evicted units stay in the pool (counted as held) and serve the
// next units whatever their sizes: an exact fit is taken as is, else the smallest that is large
// enough, else the largest. A fresh buffer costs page faults and a kernel zero fill of every page
// (3% of a GPT-2 run's CPU at a 10% budget, inside the reads' page pinning). Units are held in
// whole 2 MiB blocks (Note [whole huge pages] in store/unit_table.h), and between such buffers
// blocks move with their pages (Note [moving pages] in core/aligned_buffer.cpp): a larger buffer
// leaves the blocks it does not need in the pool, a smaller one takes what it lacks from the other
// pool buffers, and only the rest is fresh. Otherwise (small units, budgets past kMovingMaxBlocks)
// the buffer is remapped to the size asked (AlignedBuffer::resize), fresh pages for what it gains.
// Pool buffers are dropped, smallest first, only when what is held would pass the budget.
AlignedBuffer TieredSegmentStore::buffer_take(std::size_t bytes) {
  std::size_t pick = free_buffers_.size();  // exact fit, else smallest large enough, else largest
  for (std::size_t i = 0; i < free_buffers_.size(); ++i) {
    const std::size_t size = free_buffers_[i].size_bytes();
    if (size == bytes) {
      pick = i;
      break;
    }
    if (pick == free_buffers_.size()) {
      pick = i;
      continue;
    }
    const std::size_t best = free_buffers_[pick].size_bytes();
    if ((size > bytes && (best < bytes || size < best)) || (best < bytes && size > best)) pick = i;
  }
  if (pick == free_buffers_.size()) {
    STRATUM_ASSERT(held_bytes_ + bytes <= options_.budget_bytes);  // space_make() ran first
    held_bytes_ += bytes;
    peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
    made_bytes_ += bytes;
    return AlignedBuffer(bytes);
  }
  AlignedBuffer buffer = std::move(free_buffers_[pick]);
  free_buffers_.erase(free_buffers_.begin() + static_cast<std::ptrdiff_t>(pick));
  free_bytes_ -= buffer.size_bytes();
  const std::size_t had = buffer.size_bytes();
  if (had != bytes && moving_pages_ && buffer.whole_blocks() && bytes % AlignedBuffer::kBlockBytes == 0) {
    // Note [moving pages] in core/aligned_buffer.cpp: the blocks it does not need stay in the
    // pool; the blocks it lacks come from the other pool buffers, smallest first.
    if (bytes < had) {
      buffer_give(buffer.split(bytes));
    } else {
      std::vector<AlignedBuffer*> donors;
      for (AlignedBuffer& b : free_buffers_) donors.push_back(&b);
      std::sort(donors.begin(), donors.end(),
                [](const AlignedBuffer* a, const AlignedBuffer* b) { return a->size_bytes() < b->size_bytes(); });
      made_bytes_ += bytes - had - buffer.grow(bytes, donors);
      free_buffers_.erase(std::remove_if(free_buffers_.begin(), free_buffers_.end(),
                                         [](const AlignedBuffer& b) { return b.data() == nullptr; }),
                          free_buffers_.end());
      std::size_t left = 0;
      for (const AlignedBuffer& b : free_buffers_) left += b.size_bytes();
      held_bytes_ = held_bytes_ - (free_bytes_ - left) + (bytes - had);
      free_bytes_ = left;
      pool_trim();  // the fresh pages must fit too
    }
    peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
    return buffer;
  }
  // Growing it must stay within the budget: drop other pool buffers first, smallest first.
  held_bytes_ = held_bytes_ - had + bytes;
  pool_trim();
  if (had != bytes) made_bytes_ += buffer.resize(bytes) ? bytes - std::min(bytes, had) : bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  return buffer;
}

// Drops pool buffers, smallest first, until what is held fits the budget.
void TieredSegmentStore::pool_trim() {
  while (held_bytes_ > options_.budget_bytes) {
    STRATUM_ASSERT(!free_buffers_.empty());  // space_make() ran first: in use + bytes fits
    const auto smallest = std::min_element(free_buffers_.begin(), free_buffers_.end(),
                                           [](const AlignedBuffer& a, const AlignedBuffer& b) {
                                             return a.size_bytes() < b.size_bytes();
                                           });
    held_bytes_ -= smallest->size_bytes();
    free_bytes_ -= smallest->size_bytes();
    free_buffers_.erase(smallest);
  }
}

void TieredSegmentStore::buffer_give(AlignedBuffer buffer) {
  free_bytes_ += buffer.size_bytes();
  free_buffers_.push_back(std::move(buffer));
}

void TieredSegmentStore::io_start(int unit, IoOp op) {
  Entry& e = entries_[unit];
  e.state = op == IoOp::Read ? State::Loading : State::Writing;
  if (op == IoOp::Write) e.dirty = false;  // the buffer is not modified while it is written
  IoRequest request{op, files_[units().file(unit)].get(), units().file_offset_bytes(unit), e.buffer.data(),
                    units().bytes(unit), e.block_sums.data(), where(unit), nullptr};
  // A finished write-back makes room: prefetch again (Note [prefetch on write completion]).
  if (op == IoOp::Write && refresher_.joinable()) request.on_done = [this] { refresher_wake(); };
  e.ticket = (op == IoOp::Read ? read_engine_ : write_engine_)->submit(std::move(request));
  e.io_started = std::chrono::steady_clock::now();
  in_flight_.push_back(unit);
  (op == IoOp::Read ? totals_.read_bytes : totals_.write_bytes) += units().bytes(unit);
}

void TieredSegmentStore::complete(int unit) {
  Entry& e = entries_[unit];
  std::shared_ptr<IoTicket> ticket = std::move(e.ticket);
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), unit));
  released_.notify_all();
  if (trace_ != nullptr)
    trace_->span(e.state == State::Loading ? TraceRecorder::kRead : TraceRecorder::kWrite, "io", units().name(unit),
                 e.io_started, ticket->completed_at());
  if (e.state == State::Loading) {
    try {
      ticket->wait();
    } catch (...) {
      buffer_give(std::move(e.buffer));
      e.state = State::Absent;
      throw;
    }
    e.state = State::Resident;
    e.dirty = false;
    return;
  }
  STRATUM_ASSERT(e.state == State::Writing);
  try {
    ticket->wait();
  } catch (...) {
    e.state = State::Resident;
    e.dirty = true;
    throw;
  }
  e.on_disk = true;
  if (e.holds == 0 && !e.wanted) {
    buffer_give(std::move(e.buffer));
    e.state = State::Absent;
  } else {
    e.state = State::Resident;
  }
  e.wanted = false;
}

void TieredSegmentStore::reap(Lock&) {
  const bool refresher = std::this_thread::get_id() == refresher_.get_id();
  for (std::size_t i = 0; i < in_flight_.size();) {
    const IoTicket& ticket = *entries_[in_flight_[i]].ticket;
    if (ticket.done() && !(refresher && ticket.failed())) complete(in_flight_[i]);  // erases in_flight_[i]
    else ++i;
  }
}

void TieredSegmentStore::wait_ticket(Lock& lock, int unit) {
  std::shared_ptr<IoTicket> ticket = entries_[unit].ticket;
  lock.unlock();
  try {
    ticket->wait();
  } catch (...) {  // rethrown by complete() below, under the lock
  }
  lock.lock();
  reap(lock);
}

bool TieredSegmentStore::space_make(Lock& lock, std::size_t bytes, long beyond, bool block, int unit) {
  if (bytes > options_.budget_bytes)
    throw BugError(detail::concat("[store] bug: one unit (", bytes, " bytes) exceeds the budget of ",
                                  options_.budget_bytes, "; the minimum-budget check should have refused it"));
  for (;;) {
    reap(lock);
    if (unit >= 0 && entries_[unit].state != State::Absent) return true;  // Note [room for a unit once]
    // The pool serves any size (Note [buffer pool]): what counts is the memory in use.
    const std::size_t in_use = held_bytes_ - free_bytes_;
    if (in_use + bytes <= options_.budget_bytes) return true;

    std::size_t freeing = 0;  // bytes that come back when the write-backs in flight finish
    int writing = -1, loading = -1;
    for (int u : in_flight_) {
      const Entry& e = entries_[u];
      if (e.state == State::Writing) {
        writing = u;
        if (e.holds == 0 && !e.wanted) freeing += units().held_bytes(u);
      } else {
        loading = u;
      }
    }
    if (in_use - freeing + bytes > options_.budget_bytes) {
      auto evictable = [&](int u) {
        const Entry& e = entries_[u];
        return e.state == State::Resident && e.holds == 0 && !e.wanted;
      };
      // Note [room for a unit once]: distance 0 (the running group's, not yet acquired) last.
      int victim = policy_.victim(std::max(beyond, 0L), evictable);
      if (victim < 0 && beyond < 0 && writing < 0 && loading < 0) victim = policy_.victim(beyond, evictable);
      if (victim >= 0) {
        Entry& e = entries_[victim];
        if (e.dirty && !policy_.dead(victim)) {
          io_start(victim, IoOp::Write);
        } else {
          if (e.dirty) e.on_disk = false;  // dead data: the next use overwrites it
          e.dirty = false;
          // Recycled like a written-back unit's: a fresh AlignedBuffer costs a zero fill and
          // page faults under the lock, for every read when streaming read-only weights.
          buffer_give(std::move(e.buffer));
          e.state = State::Absent;
        }
        continue;
      }
    }
    if (!block) return false;
    if (writing >= 0 || loading >= 0) {
      wait_ticket(lock, writing >= 0 ? writing : loading);
      continue;
    }
    const bool training = std::this_thread::get_id() == training_thread_;
    if ((training ? holds_other_ : holds_training_) > 0) {
      released_.wait(lock);
      continue;
    }
    throw BugError(detail::concat("[store] bug: the RAM budget of ", options_.budget_bytes,
                                  " bytes cannot hold the units in use (", held_bytes_, " bytes held, ", bytes,
                                  " more needed); the minimum-budget check should have refused it"));
  }
}

void* TieredSegmentStore::acquire_unit(int unit, Access access) {
  STRATUM_ASSERT(unit >= 0 && unit < units().count() && !unit_unused(unit));
  Lock lock(mutex_);
  const bool training = std::this_thread::get_id() == training_thread_;
  reap(lock);
  Entry& e = entries_[unit];
  const bool ready = e.state == State::Resident;
  const auto t0 = std::chrono::steady_clock::now();
  while (e.state != State::Resident) {
    if (e.state == State::Loading || e.state == State::Writing) {
      e.wanted = true;
      wait_ticket(lock, unit);
      continue;
    }
    const std::size_t bytes = units().held_bytes(unit);
    space_make(lock, bytes, -1, true, unit);
    if (e.state != State::Absent) continue;  // the other thread got to it while we waited
    const bool overwrite = access == Access::Overwrite || access == Access::Scratch;
    const bool load = !overwrite && e.on_disk;
    e.buffer = buffer_take(bytes);
    if (load) {
      io_start(unit, IoOp::Read);
      continue;
    }
    if (!overwrite) std::memset(e.buffer.data(), 0, bytes);  // never written: zeros
    e.state = State::Resident;
    e.dirty = false;
  }
  e.wanted = false;
  // A stale unit (Note [discarded holds]) is taken again only by the caller that redoes the
  // dropped changes, which writes it.
  if (e.stale && access == Access::Read)
    throw BugError("[store] bug: " + units().name(unit) + " is stale after a discarded hold and was acquired to read");
  if (e.holds == 0) e.clean_on_disk_at_acquire = !e.dirty && e.on_disk;
  ++e.holds;
  policy_.used(unit);
  ++(training ? holds_training_ : holds_other_);
  if (access == Access::Scratch) e.dirty = false;  // dead before and after: nothing to write back
  else if (access != Access::Read) e.dirty = true;
  if (!ready && training) {
    const auto t1 = std::chrono::steady_clock::now();
    totals_.stall_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (trace_ != nullptr && t1 - t0 > std::chrono::microseconds(100))
      trace_->span(TraceRecorder::kCompute, "stall", "wait for " + units().name(unit), t0, t1);
  }
  return e.buffer.as_f32();
}

bool TieredSegmentStore::unit_stale(int unit) const {
  Lock lock(mutex_);
  return entries_[unit].stale;
}

void TieredSegmentStore::release_unit(int unit) { release(unit, false); }

void TieredSegmentStore::release_unit_discard(int unit) { release(unit, true); }

void TieredSegmentStore::release(int unit, bool discard) {
  Lock lock(mutex_);
  Entry& e = entries_[unit];
  STRATUM_ASSERT(e.holds > 0);
  // Note [discarded holds]: the file holds what the hold began with, so the changes can go.
  const bool drop =
      discard && streaming_ && e.holds == 1 && e.clean_on_disk_at_acquire && e.state == State::Resident && !e.stale;
  --e.holds;
  const bool training = std::this_thread::get_id() == training_thread_;
  --(training ? holds_training_ : holds_other_);
  if (drop) {
    buffer_give(std::move(e.buffer));
    e.state = State::Absent;
    e.dirty = false;
    e.stale = true;
    ++totals_.discarded_holds;
  } else {
    e.stale = false;  // the hold that took it stale has redone the changes
    // Note [write-behind] (store/eviction_policy.h).
    if (streaming_ && e.holds == 0 && e.state == State::Resident && e.dirty &&
        policy_.write_behind(unit, options_.prefetch_depth))
      io_start(unit, IoOp::Write);
  }
  released_.notify_all();
}

void TieredSegmentStore::schedule_set(const StepSchedule* schedule) {
  Lock lock(mutex_);
  policy_.schedule_set(schedule);
}

void TieredSegmentStore::schedule_at(int group) {
  Lock lock(mutex_);
  policy_.at(group);
  prefetch(lock);
}

void TieredSegmentStore::schedule_refresh() {
  Lock lock(mutex_);
  prefetch(lock);
}

void TieredSegmentStore::prefetch(Lock& lock) {
  reap(lock);
  const StepSchedule* schedule = policy_.schedule();
  if (schedule == nullptr) return;
  const int group = policy_.now();
  const int groups = schedule->group_count();
  // Note [prefetch window]: the current group's and the next prefetch_depth groups' units are
  // loaded in schedule order as far as the budget allows without evicting anything needed
  // sooner. Units the window will overwrite get their buffer now too (no read), so the space
  // is made while compute runs rather than when the acquire comes.
  for (int d = 0, window = 0; window <= options_.prefetch_depth && d < groups; ++d) {
    if (d > 0 && schedule->group_optional((group + d) % groups)) continue;  // Note [optional groups]
    ++window;
    for (const UnitUse& use : schedule->group((group + d) % groups)) {
      // The running group's own uses that it has made already are done: the unit holds what that
      // use wrote (a refresh from another thread comes after them; taking an Overwrite use for
      // one still to come would drop live data).
      if (d == 0 && policy_.used_now(use.unit)) continue;
      // Likewise a use a consumer ahead of the position has made (Note [done ahead]).
      if (policy_.done_ahead_in(use.unit, (group + d) % groups)) continue;
      Entry& e = entries_[use.unit];
      if (e.state == State::Writing && use.access != Access::Overwrite) e.wanted = true;
      if (e.state != State::Absent) continue;
      const bool load = use.access != Access::Overwrite && e.on_disk;
      if (!load && use.access != Access::Overwrite) continue;  // zeros: nothing to move
      // A pinned unit's data is still needed by a consumer behind the schedule position (the
      // optimizer worker, whose queued update reads these gradients): never taken for dead here,
      // it is loaded on its next acquire.
      if (!load && policy_.pinned(use.unit)) continue;
      if (!space_make(lock, units().held_bytes(use.unit), d, false, use.unit)) return;
      if (e.state != State::Absent) continue;
      e.buffer = buffer_take(units().held_bytes(use.unit));
      if (load) {
        io_start(use.unit, IoOp::Read);
      } else {  // its next use overwrites it: what it held is dead
        e.state = State::Resident;
        e.dirty = false;
        e.on_disk = false;
      }
    }
  }
}

StoreStats TieredSegmentStore::stats() const {
  Lock lock(mutex_);
  StoreStats s = totals_;
  s.read_busy_ms = read_engine_->stats().read_busy_ms;
  s.write_busy_ms = write_engine_->stats().write_busy_ms;
  s.held_bytes = held_bytes_;
  s.peak_held_bytes = peak_held_bytes_;
  s.made_bytes = made_bytes_;
  return s;
}

void TieredSegmentStore::stats_reset_peak() {
  Lock lock(mutex_);
  peak_held_bytes_ = held_bytes_;
}

}  // namespace stratum
