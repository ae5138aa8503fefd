// Fused softmax + cross-entropy over a block of rows of logits. Does not own memory; does not
// materialise probabilities beyond the dlogits rows it is given.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// For each row r of logits (N,V): losses[r] = logsumexp(logits[r]) - logits[r][targets[r]].
// If dlogits is not null it receives (softmax(logits[r]) - onehot(targets[r])) * dloss; it may
// alias logits (in place). targets must be in [0, V).
void softmax_xent(ThreadPool& pool, float* losses, float* dlogits, const float* logits,
                  const std::int32_t* targets, int N, int V, float dloss);

// probs (V) = softmax(logits / temperature) for one row (temperature > 0).
void softmax_row(float* probs, const float* logits, int V, float temperature);

}  // namespace stratum
