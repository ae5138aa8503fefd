// bf16 matrix products with fp32 accumulation for the CPU backend (Note [bf16 products]), through
// oneDNN's matmul (Debian's libdnnl: avx512_core_bf16 kernels where the CPU has them).
// Does not decide where bf16 is used: CpuOps does, by its Precision (ops/ops.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"

namespace stratum {

// Note [bf16 products]: C (M,N) = alpha * op(A) @ op(B) + beta * C, row-major, op = transpose
// when trans_* is true, where op(A) and op(B) are first rounded to bfloat16 (nearest, ties to
// even; the conversion runs on `pool`, element by element) and the products are summed in fp32;
// C stays fp32. This is PyTorch's CPU autocast for a matrix product, except that the result is
// not rounded to bf16 again. The rounded copies and oneDNN's scratchpad live in per-thread
// buffers that grow to the largest call's (bf16_gemm_scratch_bytes, plus at most a quarter for
// the scratchpad) and are reused, never freed per call. oneDNN runs on OpenMP threads, as many as the
// pool has; its work partition depends only on the shapes and that count, so the bits do too.
void sgemm_bf16(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc);

// The same product with B given in bfloat16 (a weight kept as stored, Note [frozen bf16 base] in
// model/block_policy.h), op(B) stored with leading dimension ldb: the bits of sgemm_bf16 on B's
// fp32 widening (rounding a bf16 value is the identity), without the rounding pass over B. Needs
// bf16_onednn().
void sgemm_bf16_b16(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const std::uint16_t* B, int ldb, float beta, float* C, int ldc);

// Rounding once, multiplying several times (Note [rounded operands] in ops/ops.h): dst (rows, cols)
// dense = src (leading dimension ld) rounded as sgemm_bf16 rounds its operands; and the product of
// operands so rounded, op(A) and op(B) dense as stored: the bits of sgemm_bf16 on their sources.
// Need bf16_onednn().
void bf16_round(ThreadPool& pool, std::uint16_t* dst, const float* src, int rows, int cols, int ld);
void sgemm_bf16_rounded(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const std::uint16_t* A, const std::uint16_t* B, float beta, float* C, int ldc);

// Note [bf16 backward operands]: a linear layer's backward, dinp = dout @ w^T (dinp non-null) and
// dw (+)= inp^T @ dout, with dout rounded once for both products (sgemm_bf16 would round it in
// each): the same rounded operands in the same layouts, so the bits of the two sgemm_bf16 calls,
// with a quarter less rounding (which reads its fp32 source from memory: 15-35% of a bf16
// product's time). Its scratch is the larger of the two calls'. Needs bf16_onednn().
void matmul_backward_bf16(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                          int M, int K, int N, bool accumulate);

// Bytes the calling thread's scratch holds now: what its largest call so far grew it to.
std::size_t bf16_scratch_bytes_held();

// Bytes of the rounded copies one call of these sizes keeps (for the engine's memory budget).
inline std::size_t bf16_gemm_scratch_bytes(int M, int N, int K) {
  return (static_cast<std::size_t>(M) * K + static_cast<std::size_t>(K) * N) * 2;
}

// Whether the CPU multiplies bf16 natively (AVX-512 BF16 or AMX); false: no speed-up (said once
// by whoever chose bf16). bf16_onednn: whether oneDNN does the products at all (AVX-512); where
// it does not, the rounded operands are widened back to fp32 and multiplied by OpenBLAS (the
// same math, another summation order: each machine's bits are its own).
bool bf16_native();
bool bf16_onednn();

}  // namespace stratum
