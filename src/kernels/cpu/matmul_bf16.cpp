// bf16 products through oneDNN; see matmul_bf16.h, Note [bf16 products].
#include "kernels/cpu/matmul_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/simd.h"
#include "kernels/cpu/matmul.h"
#include "stratum/error.h"

namespace stratum {

namespace {
// The calling thread's scratch (Note [bf16 products]): grown to the largest call's, never freed.
struct Bf16Scratch {
  std::vector<std::uint16_t> a16, b16;  // the rounded copies, dense as stored
  std::vector<float> a32, b32;          // the same widened back (no oneDNN bf16)
  AlignedBuffer pad;                    // oneDNN's scratchpad
  std::size_t bytes() const {
    return (a16.capacity() + b16.capacity()) * sizeof(std::uint16_t) + (a32.capacity() + b32.capacity()) * sizeof(float) +
           pad.size_bytes();
  }
};
thread_local Bf16Scratch t_scratch;
}  // namespace

std::size_t bf16_scratch_bytes_held() { return t_scratch.bytes(); }

namespace {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// f32_to_bf16's bits, written without branches so that the row loops below vectorise.
inline std::uint32_t bf16_bits(const float* in) {
  std::uint32_t u;
  std::memcpy(&u, in, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// A row rounded to bf16 (the run-time clones of core/simd.h): as bf16, or widened back to fp32
// (exact) for the OpenBLAS fallback.
STRATUM_SIMD_CLONES
void round_row(std::uint16_t* out, const float* in, int n) {
  for (int c = 0; c < n; ++c) out[c] = static_cast<std::uint16_t>(bf16_bits(in + c));
}
STRATUM_SIMD_CLONES
void round_row(float* out, const float* in, int n) {
  for (int c = 0; c < n; ++c) {
    const std::uint32_t widened = bf16_bits(in + c) << 16;
    std::memcpy(out + c, &widened, sizeof widened);
  }
}

// rows x cols of `src` (leading dimension ld) rounded to bf16 into dst (rows x cols, dense), on
// the pool in fixed row ranges (each element on its own: any split gives the same bits).
template <class Out>
void round_rows(ThreadPool& pool, Out* dst, const float* src, int rows, int cols, int ld) {
  pool.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r)
      round_row(dst + r * static_cast<std::size_t>(cols), src + r * static_cast<std::size_t>(ld), cols);
  }, 16);
}

// Whether oneDNN multiplies bf16 on this machine at all (AVX-512 or better; ONEDNN_MAX_CPU_ISA
// may lower it): decided once per process by a fixed probe, so every product of a run, and of
// every run on the machine, takes the same path.
bool onednn_has_bf16() {
  static const bool ok = [] {
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a({16, 16}, dt::bf16, dnnl::memory::format_tag::ab);
    const dnnl::memory::desc c({16, 16}, dt::f32, dnnl::memory::format_tag::ab);
    try {
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

// op(A) and op(B) of a product rounded into a and b, each dense as stored: A is M x K (K x M
// when transposed), B is K x N (N x K when transposed).
template <class Out>
void round_operands(ThreadPool& pool, std::vector<Out>& a, std::vector<Out>& b, bool trans_a, bool trans_b, int M,
                    int N, int K, const float* A, int lda, const float* B, int ldb) {
  a.resize(static_cast<std::size_t>(M) * K);
  b.resize(static_cast<std::size_t>(K) * N);
  if (trans_a) round_rows(pool, a.data(), A, K, M, lda);
  else round_rows(pool, a.data(), A, M, K, lda);
  if (trans_b) round_rows(pool, b.data(), B, N, K, ldb);
  else round_rows(pool, b.data(), B, K, N, ldb);
}

// Without oneDNN's bf16 (Note [bf16 products]): the rounded operands widened back to fp32 (exact)
// and multiplied by OpenBLAS: bf16 x bf16 products are exact in fp32, so this is the same math,
// summed in OpenBLAS's order, at fp32 speed.
void sgemm_rounded_fp32(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  std::vector<float>& a32 = t_scratch.a32;
  std::vector<float>& b32 = t_scratch.b32;
  round_operands(pool, a32, b32, trans_a, trans_b, M, N, K, A, lda, B, ldb);
  sgemm(trans_a, trans_b, M, N, K, alpha, a32.data(), trans_a ? M : K, b32.data(), trans_b ? K : N, beta, C, ldc);
}

}  // namespace

bool bf16_native() {
  if (!onednn_has_bf16()) return false;
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

bool bf16_onednn() { return onednn_has_bf16(); }

namespace {
// C = alpha op(a16) op(b16) + beta C through oneDNN: a16 dense as stored, b16 as stored with
// leading dimension ldb (bf16 both).
void onednn_matmul(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const std::uint16_t* a16, const std::uint16_t* b16, int ldb, float beta, float* C, int ldc) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a_desc(dims{M, K}, dt::bf16, trans_a ? dims{1, M} : dims{K, 1});
  const dnnl::memory::desc b_desc(dims{K, N}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c_desc(dims{M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  // The primitive's scratchpad (its packed panels) is ours, kept per thread and counted by
  // CpuOps::gemm_scratch_bytes, not an allocation of oneDNN's on every call.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const dnnl::engine& engine = cpu_engine();
  // oneDNN keeps created primitives in its own cache: a repeated shape costs a lookup.
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_desc, b_desc, c_desc), attr, engine);
  } catch (const dnnl::error& e) {  // the probe found bf16: a shape it cannot do is a surprise
    STRATUM_FAIL("[kernels] oneDNN cannot multiply bf16 operands of ", M, "x", K, " by ", K, "x", N, " (",
                 e.what(), "); use --precision fp32");
  }
  const dnnl::matmul matmul(pd);
  const dnnl::memory::desc pad_desc = pd.scratchpad_desc();
  AlignedBuffer& pad = t_scratch.pad;
  if (pad.size_bytes() < pad_desc.get_size()) pad = AlignedBuffer(pad_desc.get_size());
  dnnl::memory a_mem(a_desc, engine, const_cast<std::uint16_t*>(a16)),
      b_mem(b_desc, engine, const_cast<std::uint16_t*>(b16)), c_mem(c_desc, engine, C);
  dnnl::memory pad_mem(pad_desc, engine, pad.data());
  dnnl::stream stream(engine);
  omp_set_num_threads(pool.num_threads());  // the partition depends on it: the pool's count, always
  matmul.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem},
                          {DNNL_ARG_SCRATCHPAD, pad_mem}});
  stream.wait();
}
}  // namespace

void sgemm_bf16(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  STRATUM_ASSERT(M > 0 && N > 0 && K > 0);
  if (!onednn_has_bf16()) {
    sgemm_rounded_fp32(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  std::vector<std::uint16_t>& a16 = t_scratch.a16;
  std::vector<std::uint16_t>& b16 = t_scratch.b16;
  round_operands(pool, a16, b16, trans_a, trans_b, M, N, K, A, lda, B, ldb);
  onednn_matmul(pool, trans_a, trans_b, M, N, K, alpha, a16.data(), b16.data(), trans_b ? K : N, beta, C, ldc);
}

void matmul_backward_bf16(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                          int M, int K, int N, bool accumulate) {
  STRATUM_ASSERT(M > 0 && N > 0 && K > 0 && onednn_has_bf16());
  // dout rounded once for both products (Note [bf16 backward operands]); then w (for dinp) and
  // inp (for dw) in turn in the second buffer.
  std::vector<std::uint16_t>& d16 = t_scratch.a16;
  std::vector<std::uint16_t>& o16 = t_scratch.b16;
  d16.resize(static_cast<std::size_t>(M) * N);
  round_rows(pool, d16.data(), dout, M, N, N);
  o16.resize(std::max(static_cast<std::size_t>(K) * N, static_cast<std::size_t>(M) * K));
  // dinp (M, K) = dout (M, N) @ w^T, w stored (K, N)
  round_rows(pool, o16.data(), w, K, N, N);
  onednn_matmul(pool, false, true, M, K, N, 1.0f, d16.data(), o16.data(), N, 0.0f, dinp, K);
  // dw (K, N) (+)= inp^T @ dout, inp stored (M, K)
  round_rows(pool, o16.data(), inp, M, K, K);
  onednn_matmul(pool, true, false, K, N, M, 1.0f, o16.data(), d16.data(), N, accumulate ? 1.0f : 0.0f, dw, N);
}

void bf16_round(ThreadPool& pool, std::uint16_t* dst, const float* src, int rows, int cols, int ld) {
  round_rows(pool, dst, src, rows, cols, ld);
}

void sgemm_bf16_rounded(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const std::uint16_t* A, const std::uint16_t* B, float beta, float* C, int ldc) {
  STRATUM_ASSERT(M > 0 && N > 0 && K > 0 && onednn_has_bf16());
  onednn_matmul(pool, trans_a, trans_b, M, N, K, alpha, A, B, trans_b ? K : N, beta, C, ldc);
}

void sgemm_bf16_b16(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, const std::uint16_t* B, int ldb, float beta, float* C, int ldc) {
  STRATUM_ASSERT(M > 0 && N > 0 && K > 0 && onednn_has_bf16());
  std::vector<std::uint16_t>& a16 = t_scratch.a16;  // op(A) rounded, dense as stored
  a16.resize(static_cast<std::size_t>(M) * K);
  if (trans_a) round_rows(pool, a16.data(), A, K, M, lda);
  else round_rows(pool, a16.data(), A, M, K, lda);
  onednn_matmul(pool, trans_a, trans_b, M, N, K, alpha, a16.data(), B, ldb, beta, C, ldc);
}

}  // namespace stratum
