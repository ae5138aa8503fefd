// The pread/pwrite backend of IoEngine: queue_depth worker threads, each taking the next block
// from the engine's queue and moving it with blocking calls (Note [io blocks]). Used where
// io_uring is unavailable or when asked for. Does not open files or batch system calls.
#pragma once

#include <memory>

#include "io/io_engine.h"

namespace stratum {

// `options` are already checked by IoEngine::create.
std::unique_ptr<IoEngine> thread_io_engine_create(const IoEngineOptions& options);

}  // namespace stratum
