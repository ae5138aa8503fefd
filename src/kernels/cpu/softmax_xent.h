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

// Note [online log-sum-exp]: the LM head sees the vocabulary one block of columns at a time
// (model/param_layout.h, Note [vocab blocks]). For each row r of logits (N, n), which hold
// columns [v0, v0 + n) of the full rows, xent_chunk_forward folds the block into a running max
// and sum of exp(logit - max) (rescaling the sum when the max grows) and records the target's
// logit when the target lies in the block. After the last block lse = max + log(sum). The
// blocks are visited in a fixed order, so the result does not depend on memory placement.
void xent_chunk_forward(ThreadPool& pool, float* run_max, float* run_sum, float* target_logit, const float* logits,
                        const std::int32_t* targets, int N, int n, int v0);
// dlogits (N, n) = (exp(logits - lse[r]) - onehot(targets[r] - v0)) * dloss; may alias logits.
// A row whose target is below 0 (no loss target, Note [loss mask] in data/token_file.h) gets zeros.
// softcap > 0: the logits are capped ones (logit_softcap) and dlogits is the raw logits' gradient
// (Note [final softcapping]).
void xent_chunk_backward(ThreadPool& pool, float* dlogits, const float* logits, const float* lse,
                         const std::int32_t* targets, int N, int n, int v0, float dloss, float softcap = 0.0f);

// Note [final softcapping]: Gemma 2 caps every logit l of its LM head at c = cap * tanh(l / cap)
// (final_logit_softcapping, 30; transformers' Gemma2ForCausalLM: divide, tanh, multiply; tanh by
// simd::tanh_f32). logit_softcap caps a block's logits in place right after the head's product
// (both training passes, inference, decoding), so the cross-entropy and sampling see the capped
// logits and the kept logits (Note [kept logits]) are capped ones; given the cap,
// xent_chunk_backward turns the capped logit's gradient g back through the cap as autograd does,
// ((g * cap) * (1 - t * t)) / cap, with t = c / cap recovered from the capped logit.
void logit_softcap(ThreadPool& pool, float* x, int rows, int n, int ld, float cap);

// lse (N) = run_max + log(run_sum) after the last block; returns the mean of lse - target_logit
// over the rows whose target is >= 0, summed in double in row order (0 when there are none;
// Ops::xent_loss_finish).
float xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                       const std::int32_t* targets, int N);
// probs (V) = softmax(logits / temperature) for one row (temperature > 0).
void softmax_row(float* probs, const float* logits, int V, float temperature);

}  // namespace stratum
