// Linear policies and attention strategies of the block forwards; see block_policy.h.
#include "model/block_policy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/bf16.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// w is the (rows, cols) weight a product multiplies by ((N, K) for nt(), (K, N) for kn()): a
// matrix view must have that shape, a flat one at least that many elements (Note [typed views]).
void shape_check(const TensorView& w, int rows, int cols) {
  STRATUM_ASSERT(w.rank() == 1 ? w.elements() >= static_cast<std::size_t>(rows) * cols
                               : w.rows() == static_cast<std::size_t>(rows) && w.cols() == static_cast<std::size_t>(cols));
}
}  // namespace

WidenedVectors::WidenedVectors(const Ops& ops, float* scratch, float offset, std::size_t offset_floats)
    : ops_(ops), next_(scratch) {
  if (offset == 0.0f) return;
  STRATUM_ASSERT(scratch != nullptr && offset_floats > 0);
  ops_.fill(scratch, offset, offset_floats);
  offsets_ = scratch;
  offset_floats_ = offset_floats;
  next_ += offset_floats;
}

float* WidenedVectors::operator()(const TensorView& v) {
  if (v.data() == nullptr) return nullptr;  // a tensor the caller does not hold (Note [block halves])
  if (v.dtype() == DType::F32 && offsets_ == nullptr) return v.f32();
  STRATUM_ASSERT(next_ != nullptr && (offsets_ == nullptr || v.elements() <= offset_floats_));
  float* const at = next_;
  const float* w = at;  // the vector's fp32 values: its own, or widened into at
  if (v.dtype() == DType::F32)
    w = v.f32();
  else
    ops_.bf16_widen(at, v.bf16(), v.elements());
  if (offsets_ != nullptr) ops_.add(at, offsets_, w, v.elements());  // Note [gemma]: 1 + w
  next_ += v.elements();
  return at;
}

const float* norm_weight_offset(const Ops& ops, const float* w, std::size_t n, float offset, float* scratch) {
  if (offset == 0.0f) return w;
  // The view is only read (WidenedVectors writes the scratch).
  return WidenedVectors(ops, scratch, offset, n)(TensorView::of(const_cast<float*>(w), n));
}

const float* weight_f32(const Ops& ops, const TensorView& w, float* scratch) {
  if (w.dtype() == DType::F32) return w.f32();
  STRATUM_ASSERT(scratch != nullptr);
  ops.bf16_widen(scratch, w.bf16(), w.elements());
  return scratch;
}

void sgemm_w(const Ops& ops, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
             const TensorView& w, int ldw, float beta, float* C, int ldc, float* scratch, std::size_t scratch_floats) {
  if (w.dtype() == DType::F32) {
    ops.sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, w.f32(), ldw, beta, C, ldc);
    return;
  }
  if (!ops.sgemm_b16_widens()) {
    ops.sgemm_b16(trans_a, trans_b, M, N, K, alpha, A, lda, w.bf16(), ldw, beta, C, ldc, nullptr);
    return;
  }
  STRATUM_ASSERT(scratch != nullptr);
  // Note [widened in panels]: columns [n0, n0 + panel) of op(w) (K, N): rows of w (N, K) when
  // trans_b, else columns of w (K, N). As few panels as fit the scratch, of equal widths (the last
  // at most `panels` columns narrower), so each holds over half of it.
  const std::size_t whole = static_cast<std::size_t>(K) * N;
  int panel = N;
  if (whole > scratch_floats) {
    int panels = static_cast<int>((whole + scratch_floats - 1) / scratch_floats);
    while (static_cast<std::size_t>((N + panels - 1) / panels) * K > scratch_floats) ++panels;
    panel = (N + panels - 1) / panels;
  }
  for (int n0 = 0; n0 < N; n0 += panel) {
    const int n = std::min(panel, N - n0);
    const std::uint16_t* const b = w.bf16() + (trans_b ? static_cast<std::size_t>(n0) * ldw : static_cast<std::size_t>(n0));
    ops.sgemm_b16(trans_a, trans_b, M, n, K, alpha, A, lda, b, ldw, beta, C + n0, ldc, scratch);
  }
}

void GemmLinear::kn(const Ops& ops, float* y, const float* x, const TensorView& w, const float* bias, int M, int K,
                    int N) const {
  shape_check(w, K, N);
  ops.matmul_forward(y, x, weight_f32(ops, w, widen_), bias, M, K, N);
}

void GemmLinear::nt(const Ops& ops, float* y, int ldy, const float* x, int ldx, const TensorView& w, int M, int N,
                    int K) const {
  shape_check(w, N, K);
  sgemm_w(ops, false, true, M, N, K, 1.0f, x, ldx, w, K, 0.0f, y, ldy, widen_, widen_floats_);
}

void RowDotLinear::kn(const Ops& ops, float* y, const float* x, const TensorView& w, const float* bias, int M, int K,
                      int N) const {
  shape_check(w, K, N);
  if (w.dtype() == DType::BF16)
    ops.rowdot_kn_bf16(y, x, w.bf16(), bias, M, K, N);
  else
    ops.rowdot_kn(y, x, w.f32(), bias, M, K, N);
}

void RowDotLinear::nt(const Ops& ops, float* y, int ldy, const float* x, int ldx, const TensorView& w, int M, int N,
                      int K) const {
  shape_check(w, N, K);
  if (w.dtype() == DType::BF16)
    ops.rowdot_nt_bf16(y, ldy, x, ldx, w.bf16(), nullptr, M, N, K);
  else
    ops.rowdot_nt(y, ldy, x, ldx, w.f32(), nullptr, M, N, K);
}

void CausalAttention::attend(const Ops& ops, float* atty, float* stats, float* scratch, const float* qkv, int B, int T,
                             int H, int KV, int hd, int r0, int n, AttentionScores scores) const {
  ops.attention_forward(atty, stats, scratch, qkv, B, T, H, KV, hd, r0, n, scores);
}

void CachedAttention::attend(const Ops& ops, float* atty, float*, float* scratch, const float* qkv, int B, int T,
                             int H, int KV, int hd, int r0, int n, AttentionScores scores) const {
  STRATUM_ASSERT(r0 == 0 && n == B * T);  // by_row_chunks() is false: the whole pass at once
  const std::size_t Q = static_cast<std::size_t>(H) * hd, KVd = static_cast<std::size_t>(KV) * hd;
  const std::size_t W = Q + 2 * KVd;
  // Append the new keys and values to the cache; queries to a contiguous buffer.
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const std::size_t r = static_cast<std::size_t>(b) * T + t;
      const float* row = qkv + r * W;
      ops.copy(q_ + r * Q, row, Q);
      for (int j = 0; j < KV; ++j) {
        const std::size_t at = ((static_cast<std::size_t>(slot_[b]) * KV + j) * max_ctx_ + cache_past_[b] + t) * hd;
        ops.copy(kcache_ + at, row + Q + static_cast<std::size_t>(j) * hd, static_cast<std::size_t>(hd));
        ops.copy(vcache_ + at, row + Q + KVd + static_cast<std::size_t>(j) * hd, static_cast<std::size_t>(hd));
      }
    }
  // Slots run from 0 in the usual case (one call for the batch); otherwise sequence by sequence.
  bool identity = true;
  for (int b = 0; b < B; ++b) identity = identity && slot_[b] == b;
  if (identity) {
    ops.attention_cached(atty, scratch, q_, kcache_, vcache_, B, T, ops_cache_past_, max_ctx_, H, KV, hd, scores);
    return;
  }
  const std::size_t per_slot = KVd * max_ctx_;
  for (int b = 0; b < B; ++b) {
    const std::size_t r = static_cast<std::size_t>(b) * T;
    ops.attention_cached(atty + r * Q, scratch, q_ + r * Q, kcache_ + slot_[b] * per_slot,
                         vcache_ + slot_[b] * per_slot, 1, T, ops_cache_past_ + b, max_ctx_, H, KV, hd, scores);
  }
}

}  // namespace stratum
