// Communicator over Open MPI; see communicator.h and Note [mpi lifetime].
#include "dist/communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "stratum/error.h"

namespace stratum {

namespace {
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  STRATUM_FAIL("[dist] ", what, " failed: ", std::string(text, static_cast<std::size_t>(len)));
}

int count_of(std::size_t bytes) {
  STRATUM_ASSERT(bytes <= static_cast<std::size_t>(INT_MAX));  // messages are segment chunks: a few MB
  return static_cast<int>(bytes);
}
}  // namespace

struct Communicator::Pending {
  std::vector<unsigned char> bytes;
  MPI_Request request = MPI_REQUEST_NULL;
};

Communicator::Communicator(int rank, int size) : rank_(rank), size_(size) {}

bool Communicator::launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Communicator> Communicator::world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::unique_ptr<Communicator> comm(new Communicator(rank, size));
  MPI_Comm node;  // the ranks that share this machine's memory
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  MPI_Comm_size(node, &comm->node_size_);
  MPI_Comm_free(&node);
  return comm;
}

Communicator::~Communicator() {
  try {
    sends_wait();
  } catch (...) {  // finalising anyway
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

void Communicator::send(int to, int tag, const void* data, std::size_t bytes) {
  progress();
  auto p = std::make_unique<Pending>();
  p->bytes.resize(bytes);
  if (bytes > 0) std::memcpy(p->bytes.data(), data, bytes);
  mpi_check(MPI_Isend(p->bytes.data(), count_of(bytes), MPI_BYTE, to, tag, MPI_COMM_WORLD, &p->request), "MPI_Isend");
  sent_bytes_ += bytes;
  pending_.push_back(std::move(p));
}

void Communicator::recv(int from, int tag, void* data, std::size_t bytes) {
  MPI_Status status;
  const auto t0 = std::chrono::steady_clock::now();
  mpi_check(MPI_Recv(data, count_of(bytes), MPI_BYTE, from, tag, MPI_COMM_WORLD, &status), "MPI_Recv");
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  STRATUM_ASSERT(static_cast<std::size_t>(got) == bytes);
}

void Communicator::progress() {
  std::size_t kept = 0;
  for (auto& p : pending_) {
    int done = 0;
    mpi_check(MPI_Test(&p->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done == 0) pending_[kept++] = std::move(p);
  }
  pending_.resize(kept);
}

void Communicator::sends_wait() {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& p : pending_) mpi_check(MPI_Wait(&p->request, MPI_STATUS_IGNORE), "MPI_Wait");
  pending_.clear();
  wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Communicator::allgather(const void* mine, std::size_t bytes, void* all) {
  mpi_check(MPI_Allgather(mine, count_of(bytes), MPI_BYTE, all, count_of(bytes), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgather");
}

void Communicator::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; in case it does
}

}  // namespace stratum
