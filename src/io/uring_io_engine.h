// The io_uring backend of IoEngine: one thread owns the ring, keeps up to queue_depth blocks
// submitted and refills as each completes (Note [io blocks]). Does not open files, register
// buffers or poll the submission queue from the kernel (no SQPOLL).
#pragma once

#include <memory>
#include <string>

#include "io/io_engine.h"

namespace stratum {

// `options` are already checked by IoEngine::create. Returns null, with the reason in *why_not,
// when the ring cannot be set up (old kernel, seccomp, io_uring disabled by sysctl).
std::unique_ptr<IoEngine> uring_io_engine_create(const IoEngineOptions& options, std::string* why_not);

}  // namespace stratum
