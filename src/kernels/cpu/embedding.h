// GPT-2 input embedding: token embedding row + position embedding row. The token table is seen
// one vocabulary block of rows at a time (Note [vocab blocks] in model/param_layout.h); a
// single block [0, V) is the whole table. Does not own memory.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// out (B*T, C) = wpe[t]: the position part, before the token rows are added block by block.
void embedding_forward_positions(ThreadPool& pool, float* out, const float* wpe, int B, int T, int C);
// out[b,t] += wte_rows[tokens[b,t] - v0] for the positions whose token lies in [v0, v0 + n)
// (wte_rows: (n, C)). With out = wpe[t] this is wpe[t] + wte[token], one rounding, the same bits
// whichever block holds the token. scale != 1 (Gemma's, Note [gemma] in model/model_config.h):
// out[b,t] += wte_rows[...] * scale, the product rounded before the add (over zeros: the product).
void embedding_forward_block(ThreadPool& pool, float* out, const std::int32_t* tokens, const float* wte_rows, int v0,
                             int n, int B, int T, int C, float scale = 1.0f);
// embedding_forward_block with bf16 rows, each widened exactly: the same bits as on their fp32
// widening (Note [bf16 weights] in infer/decoder.h).
void embedding_forward_block_bf16(ThreadPool& pool, float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows,
                                  int v0, int n, int B, int T, int C, float scale = 1.0f);

// dwpe[t] += dout[b,t] (accumulates, batch rows in order).
void embedding_backward_positions(ThreadPool& pool, float* dwpe, const float* dout, int B, int T, int C);
// dwte_rows[tokens[b,t] - v0] += dout[b,t] for tokens in [v0, v0 + n) (accumulates). Channels
// are split across threads and positions visited in order, so repeated tokens sum
// deterministically and the same way whatever the blocking. scale != 1: += dout[b,t] * scale,
// the product rounded before the add (torch's grad * scale, then its index add).
void embedding_backward_block(ThreadPool& pool, float* dwte_rows, const float* dout, const std::int32_t* tokens,
                              int v0, int n, int B, int T, int C, float scale = 1.0f);

}  // namespace stratum
