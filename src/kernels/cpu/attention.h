// Causal self-attention core (softmax(q k^T / sqrt(hd)) v) with grouped-query attention: H query
// heads share KV key/value heads, query head h reading kv head h / (H/KV). KV == H is ordinary
// multi-head attention (GPT-2). Also the cached variant used for generation, which attends new
// positions to a KV cache. Does not include the q/k/v/o projections (see matmul.h), does not
// apply RoPE (see rope.h) and does not own memory.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"
#include "ops/attention_rows.h"
#include "stratum/error.h"

namespace stratum {

// Floats of scratch both directions need on a pool of `threads`: per thread one (batch, kv
// head)'s keys and values packed in key tiles, 64 rows of (T) scores and its dk/dv sums:
// O(threads * T * hd), no (T, T) matrix at any point and nothing that grows with B or H.
std::size_t attention_scratch_floats(int B, int T, int H, int KV, int hd, int threads);

// qkv rows (B,T,(H+2*KV)*hd) = [q (H*hd) | k (KV*hd) | v (KV*hd)], head j of each part owns
// [j*hd, (j+1)*hd) of it; H % KV == 0. The queries are rows [r0, r0 + n) of the B*T rows (Note
// [attention row ranges]); out (n, H*hd) receives their outputs; stats (B,H,T,2) receives each
// of their softmax rows' {maximum scaled score, 1 / sum of exps}, from which the backward replays
// the probabilities bit for bit (Note [softmax row replay] in attention.cpp). Both directions take
// scratch of attention_scratch_floats(B, T, H, KV, hd, pool.num_threads()) floats.
//
// Note [attention row ranges]: a causal query row needs the keys and values of its sequence up to
// itself and nothing after, so the block forwards and backwards take the attention in the same
// row chunks as everything else (Note [row chunks] in model/block_policy.h), in increasing order:
// the attention output, its gradient and res2 then hold one chunk. qkv and dqkv keep every row.
// The forward's rows are independent: any partition gives every row the same bits. The backward
// writes the q part of its rows of dqkv; a key's dk and dv sum the query rows in increasing order,
// so a range continues the sums the earlier ranges left in dqkv for the keys before its first
// query row (q0) and starts its own keys' sums from 0 — with KV == H the bits of one whole-pass
// call for any partition. With grouped heads (KV < H) a key's sum runs over the group's heads
// within each range, so ranges that split a sequence change the order of its sums (the same math,
// other roundings); the partition is a function of B*T alone, so every budget and policy still
// gets the same bits.
// scores: a sliding window and soft-capping (Note [attention scores] in ops/attention_rows.h; Note
// [sliding window] and Note [softcapping] in attention.cpp); {}: plain causal attention.
void attention_forward(ThreadPool& pool, float* out, float* stats, float* scratch, const float* qkv, int B, int T,
                       int H, int KV, int hd, int r0, int n, AttentionScores scores = {});

// dqkv (B,T,(H+2*KV)*hd): the gradient w.r.t. qkv given dout (n, H*hd), the gradient of the
// outputs of query rows [r0, r0 + n), when every earlier row was passed in increasing order
// before (Note [attention row ranges]): writes q of rows [r0, r0 + n) and k, v of each touched
// sequence's rows up to the range's end. The dk/dv of a kv head sum its H/KV query heads'
// contributions in increasing head order. stats: the forward's.
void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, int B, int T, int H, int KV, int hd, int r0, int n, AttentionScores scores = {});

// Every row at once: rows [0, B*T).
inline void attention_forward(ThreadPool& pool, float* out, float* stats, float* scratch, const float* qkv, int B,
                              int T, int H, int KV, int hd) {
  attention_forward(pool, out, stats, scratch, qkv, B, T, H, KV, hd, 0, B * T);
}
inline void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* stats, int B, int T, int H, int KV, int hd) {
  attention_backward(pool, dqkv, scratch, dout, qkv, stats, B, T, H, KV, hd, 0, B * T);
}

// GPT-2 forms: qkv rows (B,T,3C) = [q (C) | k (C) | v (C)], H heads of C/H.
inline void attention_forward(ThreadPool& pool, float* out, float* stats, float* scratch, const float* qkv, int B,
                              int T, int C, int H) {
  STRATUM_CHECK(H > 0 && C % H == 0, "[kernels.attention] C must be a multiple of H, got C ", C, " H ", H);
  attention_forward(pool, out, stats, scratch, qkv, B, T, H, H, C / H);
}
inline void attention_backward(ThreadPool& pool, float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* stats, int B, int T, int C, int H) {
  STRATUM_CHECK(H > 0 && C % H == 0, "[kernels.attention] C must be a multiple of H, got C ", C, " H ", H);
  attention_backward(pool, dqkv, scratch, dout, qkv, stats, B, T, H, H, C / H);
}

// Floats of scratch attention_cached needs on a pool of `threads`, for any B and Tn: per thread
// a (batch, kv head)'s keys packed in tiles and 32 score rows of max_T.
std::size_t attention_cached_scratch_floats(int hd, int max_T, int threads);

// Causal attention of Tn new positions per sequence against a KV cache. q (B,Tn,H*hd) (RoPE
// already applied); kcache, vcache (B,KV,max_T,hd) hold positions 0..past[b]+Tn-1 of sequence b
// (the new positions' k/v already written); past (B). New position t of sequence b is at
// absolute position past[b]+t and attends to cache positions 0..past[b]+t (its last scores.window
// of them when that is > 0). out (B,Tn,H*hd).
// Note [cached attention bits]: same arithmetic in the same order as attention_forward, so each
// output row equals attention_forward's row for that position bit for bit.
void attention_cached(ThreadPool& pool, float* out, float* scratch, const float* q, const float* kcache,
                      const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV, int hd,
                      AttentionScores scores = {});

}  // namespace stratum
