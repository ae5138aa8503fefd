// Dropout with a regenerated mask (Ops::dropout; Note [dropout mask] in core/dropout_mask.h):
// elementwise over fixed row ranges, so any partition gives the same bits. Does not own memory.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// For x (M, n), row stride ldx: y (M, n), row stride ldy, = (or += with accumulate) x with the
// mask of `key` and drop probability p applied (element (m, j) has index m * n + j).
void dropout_rows(ThreadPool& pool, float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key,
                  float p, bool accumulate);

}  // namespace stratum
