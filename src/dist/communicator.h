// The messages of data-parallel training between the ranks of one `mpirun` job (Open MPI):
// point-to-point sends and receives of byte ranges, an all-gather and an abort. Sends copy the
// bytes and return at once (MPI_Isend on the copy); receives block. Does not decide what is sent
// where (exec/executor.h, Note [data parallel]).
// Note [mpi lifetime]: MPI is initialised only by Communicator::world(), which `stratum train`
// calls only when the process was started by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE, or PMIx's
// PMIX_RANK, in the environment); plain runs and the test binary never load MPI's state. Only the
// training thread calls into MPI (MPI_THREAD_FUNNELED). The destructor completes every send and
// finalises; a failing rank calls abort() instead, which ends every rank of the job at once, so
// no peer waits forever on a message that will not come.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace stratum {

// The tags of every message a run sends (one list, so that no two uses share one).
enum CommTag : int {
  kTagGradSum = 1,     // the running sum of micro-batches 0 .. k-1, to the next rank
  kTagGradFinal = 2,   // the step's gradients, from the rank that completed them
  kTagParams = 3,      // a segment's updated parameters, from its owner
  kTagCheckpoint = 4,  // a checkpoint's temporary directory (from rank 0) and each shard's outcome
};

class Communicator {
 public:
  // True when this process is a rank of an mpirun job (Note [mpi lifetime]).
  static bool launched_by_mpirun();
  // Initialises MPI (once per process) and returns the job's communicator.
  static std::unique_ptr<Communicator> world();
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int node_size() const { return node_size_; }  // the ranks on this machine (this one included)

  // Sends bytes [data, data + bytes) to rank `to` with `tag`; the bytes are copied, so the caller
  // may reuse its buffer at once. Messages between two ranks with one tag arrive in send order.
  void send(int to, int tag, const void* data, std::size_t bytes);
  // Receives exactly `bytes` from rank `from` with `tag` into data (blocking); a message of another
  // size is a bug (both sides derive sizes from the same layout).
  void recv(int from, int tag, void* data, std::size_t bytes);
  // Waits until every send so far has been received (and frees their copies).
  void sends_wait();
  // Lets MPI move the sends in flight (and frees the copies of finished ones) without waiting:
  // without a single-copy transport a large send advances only inside MPI calls, so the executor
  // calls this between schedule groups.
  void progress();
  // all (size() * bytes) = every rank's `mine` (bytes), in rank order.
  void allgather(const void* mine, std::size_t bytes, void* all);
  // Ends every rank of the job with `code` (MPI_Abort); for a rank that failed.
  [[noreturn]] void abort(int code);

  // Since the communicator was made: bytes sent, and milliseconds the caller spent blocked in
  // recv() and sends_wait() (waiting for peers; what the compute did not hide).
  std::uint64_t sent_bytes() const { return sent_bytes_; }
  double wait_ms() const { return wait_ms_; }

 private:
  Communicator(int rank, int size);
  struct Pending;
  int rank_, size_;
  int node_size_ = 1;
  std::uint64_t sent_bytes_ = 0;
  double wait_ms_ = 0.0;
  std::vector<std::unique_ptr<Pending>> pending_;
};

}  // namespace stratum
