// CpuOps: forwards each op of the seam to the CPU kernel of the same name; see cpu_ops.h.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cstring>

#include "core/aligned_buffer.h"

#include "core/bf16.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/zo_update.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rowdot.h"
#include "kernels/cpu/softmax_xent.h"
#include "kernels/cpu/swiglu.h"

namespace stratum {

void* CpuOps::memory_alloc(std::size_t bytes) const { return aligned_memory_alloc(bytes); }

void CpuOps::memory_free(void* p, std::size_t bytes) const noexcept { aligned_memory_free(p, bytes); }

void CpuOps::upload(void* dst, const void* src_host, std::size_t bytes) const {
  if (bytes > 0) std::memcpy(dst, src_host, bytes);
}

void CpuOps::download(void* dst_host, const void* src, std::size_t bytes) const {
  if (bytes > 0) std::memcpy(dst_host, src, bytes);
}

void CpuOps::fill(float* x, float value, std::size_t n) const { std::fill(x, x + n, value); }

void CpuOps::copy(float* dst, const float* src, std::size_t n) const {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

float CpuOps::xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                               const std::int32_t* targets, int N) const {
  return stratum::xent_loss_finish(lse, run_max, run_sum, target_logit, targets, N);
}

void CpuOps::sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) const {
  gemm(pool_, precision_, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void CpuOps::sgemm_b16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                       const std::uint16_t* B, int ldb, float beta, float* C, int ldc, float* scratch) const {
  if (!sgemm_b16_widens()) {
    sgemm_bf16_b16(pool_, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int rows = trans_b ? N : K, cols = trans_b ? K : N;  // op(B) as stored
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r)
      bf16_widen(scratch + r * cols, B + r * static_cast<std::size_t>(ldb), static_cast<std::size_t>(cols));
  }, 64);
  gemm(pool_, precision_, trans_a, trans_b, M, N, K, alpha, A, lda, scratch, cols, beta, C, ldc);
}
bool CpuOps::sgemm_b16_widens() const { return !(precision_ == Precision::Bf16 && bf16_onednn()); }
bool CpuOps::bf16_rounded() const { return precision_ == Precision::Bf16 && bf16_onednn(); }
void CpuOps::bf16_round(std::uint16_t* dst, const float* src, int rows, int cols, int ld) const {
  STRATUM_ASSERT(bf16_rounded());
  stratum::bf16_round(pool_, dst, src, rows, cols, ld);
}
void CpuOps::sgemm_rounded(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const std::uint16_t* A,
                           const std::uint16_t* B, float beta, float* C, int ldc) const {
  STRATUM_ASSERT(bf16_rounded());
  sgemm_bf16_rounded(pool_, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, ldc);
}

void CpuOps::matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K,
                            int N) const {
  stratum::matmul_forward(pool_, precision_, out, inp, w, bias, M, K, N);
}
void CpuOps::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                             const float* w, int M, int K, int N, bool accumulate) const {
  stratum::matmul_backward(pool_, precision_, dinp, dw, dbias, dout, inp, w, M, K, N, accumulate);
}
void CpuOps::rowdot_nt(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M, int N,
                       int K) const {
  stratum::rowdot_nt(pool_, y, ldy, x, ldx, w, bias, M, N, K);
}
void CpuOps::rowdot_nt_bf16(float* y, int ldy, const float* x, int ldx, const std::uint16_t* w, const float* bias,
                            int M, int N, int K) const {
  stratum::rowdot_nt_bf16(pool_, y, ldy, x, ldx, w, bias, M, N, K);
}
void CpuOps::rowdot_kn(float* y, const float* x, const float* w, const float* bias, int M, int K, int N) const {
  stratum::rowdot_kn(pool_, y, x, w, bias, M, K, N);
}
void CpuOps::rowdot_kn_bf16(float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                            int N) const {
  stratum::rowdot_kn_bf16(pool_, y, x, w, bias, M, K, N);
}
void CpuOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                               const float* b, int N, int C, float eps) const {
  stratum::layernorm_forward(pool_, out, mean, rstd, inp, w, b, N, C, eps);
}
void CpuOps::layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                const float* w, const float* mean, const float* rstd, int N, int C,
                                bool accumulate_params) const {
  stratum::layernorm_backward(pool_, dinp, dw, db, dout, inp, w, mean, rstd, N, C, accumulate_params);
}
void CpuOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                             float eps) const {
  stratum::rmsnorm_forward(pool_, out, rstd, inp, w, N, C, eps);
}
void CpuOps::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                              const float* rstd, int N, int C, bool accumulate_params) const {
  stratum::rmsnorm_backward(pool_, dinp, dw, dout, inp, w, rstd, N, C, accumulate_params);
}
void CpuOps::rmsnorm_heads_forward(float* x, int ld, float* rstd, const float* w, int n, int heads, int hd,
                                   float eps) const {
  stratum::rmsnorm_heads_forward(pool_, x, ld, rstd, w, n, heads, hd, eps);
}
void CpuOps::rmsnorm_heads_backward(float* d, const float* x, int ld, float* dw, const float* w, const float* rstd,
                                    int n, int heads, int hd, bool accumulate_params) const {
  stratum::rmsnorm_heads_backward(pool_, d, x, ld, dw, w, rstd, n, heads, hd, accumulate_params);
}
std::size_t CpuOps::gemm_scratch_bytes(int rows, int width, int narrow) const {
  if (precision_ != Precision::Bf16) return 0;
  // The two per-thread copies grow to the largest op(A) (rows x width, or width x rows) and the
  // largest op(B) (narrow x width, or rows x width for a weight gradient); oneDNN's scratchpad
  // (packed panels) adds a quarter at most (measured: at most 9% on GPT-2's shapes). Without
  // oneDNN's bf16 the copies are fp32: twice the bytes.
  const std::size_t r = static_cast<std::size_t>(rows), w = static_cast<std::size_t>(width);
  const std::size_t elements = r * w + std::max(static_cast<std::size_t>(narrow) * w, r * w);
  return bf16_onednn() ? elements * 2 * 5 / 4 : elements * 4;
}

std::size_t CpuOps::attention_scratch_floats(int B, int T, int H, int KV, int hd) const {
  return stratum::attention_scratch_floats(B, T, H, KV, hd, pool_.num_threads());
}
void CpuOps::attention_forward(float* out, float* stats, float* scratch, const float* qkv, int B, int T, int H, int KV,
                               int hd, int r0, int n, AttentionScores scores) const {
  stratum::attention_forward(pool_, out, stats, scratch, qkv, B, T, H, KV, hd, r0, n, scores);
}
void CpuOps::attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* stats,
                                int B, int T, int H, int KV, int hd, int r0, int n, AttentionScores scores) const {
  stratum::attention_backward(pool_, dqkv, scratch, dout, qkv, stats, B, T, H, KV, hd, r0, n, scores);
}
std::size_t CpuOps::attention_cached_scratch_floats(int hd, int max_T) const {
  return stratum::attention_cached_scratch_floats(hd, max_T, pool_.num_threads());
}
void CpuOps::attention_cached(float* out, float* scratch, const float* q, const float* kcache, const float* vcache,
                              int B, int Tn, const int* past, int max_T, int H, int KV, int hd, AttentionScores scores) const {
  stratum::attention_cached(pool_, out, scratch, q, kcache, vcache, B, Tn, past, max_T, H, KV, hd, scores);
}
void CpuOps::rope_forward(float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                          const RopeTable& table) const {
  stratum::rope_forward(pool_, x, B, T, heads, hd, row_stride, pos0, table);
}
void CpuOps::rope_backward(float* dx, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                           const RopeTable& table) const {
  stratum::rope_backward(pool_, dx, B, T, heads, hd, row_stride, pos0, table);
}
void CpuOps::gelu_forward(float* out, const float* inp, std::size_t n) const {
  stratum::gelu_forward(pool_, out, inp, n);
}
void CpuOps::gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) const {
  stratum::gelu_backward(pool_, dinp, inp, dout, n);
}
void CpuOps::swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) const {
  stratum::swiglu_forward(pool_, out, gate, up, n);
}
void CpuOps::geglu_forward(float* out, const float* gate, const float* up, std::size_t n) const {
  stratum::geglu_forward(pool_, out, gate, up, n);
}
void CpuOps::geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                            std::size_t n) const {
  stratum::geglu_backward(pool_, dgate, dup, dout, gate, up, n);
}
void CpuOps::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                             std::size_t n) const {
  stratum::swiglu_backward(pool_, dgate, dup, dout, gate, up, n);
}
void CpuOps::add(float* out, const float* a, const float* b, std::size_t n) const {
  add_f32(pool_, out, a, b, n);
}
void CpuOps::sum_squares_many(double* out, const float* const* xs, const std::size_t* ns, std::size_t count) const {
  for (std::size_t i = 0; i < count; ++i) out[i] = stratum::sum_squares(pool_, xs[i], ns[i]);
}
void CpuOps::xent_chunk_forward(float* run_max, float* run_sum, float* target_logit, const float* logits,
                                const std::int32_t* targets, int N, int n, int v0) const {
  stratum::xent_chunk_forward(pool_, run_max, run_sum, target_logit, logits, targets, N, n, v0);
}
void CpuOps::xent_chunk_backward(float* dlogits, const float* logits, const float* lse, const std::int32_t* targets,
                                 int N, int n, int v0, float dloss, float softcap) const {
  stratum::xent_chunk_backward(pool_, dlogits, logits, lse, targets, N, n, v0, dloss, softcap);
}
void CpuOps::logit_softcap(float* x, int rows, int n, int ld, float cap) const {
  stratum::logit_softcap(pool_, x, rows, n, ld, cap);
}
void CpuOps::softmax_row(float* probs, const float* logits, int V, float temperature) const {
  stratum::softmax_row(probs, logits, V, temperature);
}
void CpuOps::embedding_forward_positions(float* out, const float* wpe, int B, int T, int C) const {
  stratum::embedding_forward_positions(pool_, out, wpe, B, T, C);
}
void CpuOps::embedding_forward_block(float* out, const std::int32_t* tokens, const float* wte_rows, int v0, int n,
                                     int B, int T, int C, float scale) const {
  stratum::embedding_forward_block(pool_, out, tokens, wte_rows, v0, n, B, T, C, scale);
}
void CpuOps::embedding_forward_block_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows,
                                          int v0, int n, int B, int T, int C, float scale) const {
  stratum::embedding_forward_block_bf16(pool_, out, tokens, wte_rows, v0, n, B, T, C, scale);
}
void CpuOps::embedding_backward_positions(float* dwpe, const float* dout, int B, int T, int C) const {
  stratum::embedding_backward_positions(pool_, dwpe, dout, B, T, C);
}
void CpuOps::embedding_backward_block(float* dwte_rows, const float* dout, const std::int32_t* tokens, int v0, int n,
                                      int B, int T, int C, float scale) const {
  stratum::embedding_backward_block(pool_, dwte_rows, dout, tokens, v0, n, B, T, C, scale);
}
void CpuOps::adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n, const AdamWHyper& hyper,
                          double weight_decay, float grad_scale) const {
  stratum::adamw_update(pool_, param, m, v, grad, n, hyper, weight_decay, grad_scale);
}

void CpuOps::zo_update(float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) const {
  stratum::zo_update(pool_, x, n, first, u);
}

void CpuOps::bf16_widen(float* out, const std::uint16_t* in, std::size_t n) const {
  bf16_widen_f32(pool_, out, in, n);
}

void CpuOps::dropout(float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key, float p,
                     bool accumulate) const {
  dropout_rows(pool_, y, ldy, x, ldx, M, n, key, p, accumulate);
}

}  // namespace stratum
