// The CUDA backend of the ops seam (ops/ops.h): each op runs the kernel of the same name in this
// folder (one .cu per op, cuBLAS for the matrix products) on one CUDA stream of the current
// device. Pointers are device memory (Ops::memory_alloc, Note [ops memory]), the integer index
// arrays (tokens, targets, past, pos0) included; AdamWHyper, ZoUpdate and RopeTable stay host
// values (the rope and z tables are copied to the device once and cached). Ops are queued in call
// order on the stream and return before they finish, except sum_squares_many (it returns values).
// Tested op by op against CpuOps (tests/cuda_ops_test.cpp). Plain C++: no CUDA header here, so
// code above the seam may include it through backend.cpp only.
// Note [cuda determinism]: as on the CPU (Note [ops seam]), every output element belongs to one
// thread and every reduction runs in a fixed order (warp trees of fixed shape, column sums over
// rows in order), nothing uses atomics on floats, and cuBLAS runs in its default fp32 math
// (no TF32: CUBLAS_DEFAULT_MATH with reduced-precision reductions disallowed) with a fixed
// workspace on one stream, which NVIDIA documents as bitwise reproducible on one GPU model.
// Compiled with -fmad=false and no fast math. So the bits depend only on the GPU model, not on
// the run. Ops whose CPU arithmetic is a fixed expression or order share it (simd::exp_f32 and
// tanh_f32, ops/elementwise_math.h, the dropout mask, the zo noise; the same per-element orders in
// rowdot, column sums, embeddings, sum_squares) and give the CPU's bits; the rest (cuBLAS,
// attention, norm rows, cross-entropy) sum in other orders, within the tolerances the op tests
// state.
#pragma once

#include <memory>

#include "ops/ops.h"

namespace stratum {

struct CudaContext;  // stream, cuBLAS handle, cached tables (cuda_context.cuh)

class CudaOps final : public Ops {
 public:
  explicit CudaOps(Precision precision = Precision::Fp32);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;
  const char* name() const override { return "cuda"; }
  CudaContext& context() const { return *ctx_; }
  bool host_memory() const override { return false; }
  void* memory_alloc(std::size_t bytes) const override;  // cudaMalloc, zeroed on the stream
  // cudaMallocAsync / cudaFreeAsync on the compute stream, from the device's default pool, which
  // keeps what is given back (Note [queued frees]).
  void* memory_alloc_queued(std::size_t bytes) const override;
  void memory_free_queued(void* p, std::size_t bytes) const noexcept override;
  void memory_free(void* p, std::size_t bytes) const noexcept override;
  void upload(void* dst, const void* src_host, std::size_t bytes) const override;
  void download(void* dst_host, const void* src, std::size_t bytes) const override;
  void* event_create() const override;  // Note [ops transfers]: cudaEvent_t without timing
  void event_destroy(void* event) const noexcept override;
  void event_record(void* event) const override;
  void transfer(void* dst, const void* src, std::size_t bytes, bool to_device, void* after,
                void* done) const override;
  void compute_wait(void* event) const override;
  bool event_done(void* event) const override;
  void event_sync(void* event) const override;
  bool host_pin(void* p, std::size_t bytes) const override;  // cudaHostRegister
  void queue_call(Queue queue, void (*fn)(void*), void* arg) const override;  // cudaLaunchHostFunc
  void host_unpin(void* p) const noexcept override;
  void fill(float* x, float value, std::size_t n) const override;
  void copy(float* dst, const float* src, std::size_t n) const override;
  // lse on the device; the double sum on the host over the downloaded rows (the CPU's order).
  // Targets below 0 (Note [loss mask]) are refused: the backward kernel has no mask yet.
  float xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                         const std::int32_t* targets, int N) const override;

  void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
             int ldb, float beta, float* C, int ldc) const override;
  void sgemm_b16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const std::uint16_t* B, int ldb, float beta, float* C, int ldc, float* scratch) const override;
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K,
                      int N) const override;
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       int M, int K, int N, bool accumulate) const override;
  void rowdot_nt(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M, int N,
                 int K) const override;
  void rowdot_nt_bf16(float* y, int ldy, const float* x, int ldx, const std::uint16_t* w, const float* bias, int M,
                      int N, int K) const override;
  void rowdot_kn(float* y, const float* x, const float* w, const float* bias, int M, int K, int N) const override;
  void rowdot_kn_bf16(float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                      int N) const override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                         int C, float eps) const override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C, bool accumulate_params) const override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) const override;
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C, bool accumulate_params) const override;
  void rmsnorm_heads_forward(float* x, int ld, float* rstd, const float* w, int n, int heads, int hd,
                             float eps) const override;
  void rmsnorm_heads_backward(float* d, const float* x, int ld, float* dw, const float* w, const float* rstd, int n,
                              int heads, int hd, bool accumulate_params) const override;
  void attention_lanes_limit(int lanes) override;
  std::size_t attention_scratch_floats(int B, int T, int H, int KV, int hd) const override;
  std::size_t gemm_scratch_bytes(int rows, int width, int narrow) const override;
  void attention_forward(float* out, float* stats, float* scratch, const float* qkv, int B, int T, int H, int KV,
                         int hd, int r0, int n, AttentionScores scores) const override;
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* stats, int B,
                          int T, int H, int KV, int hd, int r0, int n, AttentionScores scores) const override;
  std::size_t attention_cached_scratch_floats(int hd, int max_T) const override;
  void attention_cached(float* out, float* scratch, const float* q, const float* kcache, const float* vcache, int B,
                        int Tn, const int* past, int max_T, int H, int KV, int hd, AttentionScores scores) const override;
  void rope_forward(float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                    const RopeTable& table) const override;
  void rope_backward(float* dx, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                     const RopeTable& table) const override;
  void gelu_forward(float* out, const float* inp, std::size_t n) const override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) const override;
  void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) const override;
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       std::size_t n) const override;
  void add(float* out, const float* a, const float* b, std::size_t n) const override;
  void sum_squares_many(double* out, const float* const* xs, const std::size_t* ns,
                        std::size_t count) const override;
  void xent_chunk_forward(float* run_max, float* run_sum, float* target_logit, const float* logits,
                          const std::int32_t* targets, int N, int n, int v0) const override;
  void xent_chunk_backward(float* dlogits, const float* logits, const float* lse, const std::int32_t* targets, int N,
                           int n, int v0, float dloss, float softcap) const override;
  void softmax_row(float* probs, const float* logits, int V, float temperature) const override;
  void embedding_forward_positions(float* out, const float* wpe, int B, int T, int C) const override;
  void embedding_forward_block(float* out, const std::int32_t* tokens, const float* wte_rows, int v0, int n, int B,
                               int T, int C, float scale) const override;
  void embedding_forward_block_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows, int v0,
                                    int n, int B, int T, int C, float scale) const override;
  void embedding_backward_positions(float* dwpe, const float* dout, int B, int T, int C) const override;
  void embedding_backward_block(float* dwte_rows, const float* dout, const std::int32_t* tokens, int v0, int n, int B,
                                int T, int C, float scale) const override;
  void adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n, const AdamWHyper& hyper,
                    double weight_decay, float grad_scale) const override;
  void zo_update(float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) const override;
  void bf16_widen(float* out, const std::uint16_t* in, std::size_t n) const override;
  void dropout(float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key, float p,
               bool accumulate) const override;

 private:
  std::unique_ptr<CudaContext> ctx_;
  Precision precision_;
};

}  // namespace stratum
