// The zeroth-order perturbation and update (ZoUpdate in ops/ops.h, Note [zo noise] in
// core/zo_noise.h): elementwise over fixed contiguous ranges, so any partition gives the same bits.
// Does not own memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "ops/ops.h"

namespace stratum {

void zo_update(ThreadPool& pool, float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u);

}  // namespace stratum
