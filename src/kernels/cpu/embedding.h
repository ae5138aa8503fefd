// GPT-2 input embedding: token embedding row + position embedding row. Does not own memory.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// out (B*T, C) = wte[tokens[b,t]] + wpe[t]
void embedding_forward(ThreadPool& pool, float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C);

// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t] (both accumulate). Channels are split
// across threads and positions visited in order, so repeated tokens sum deterministically.
void embedding_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, int B, int T, int C);

}  // namespace stratum
