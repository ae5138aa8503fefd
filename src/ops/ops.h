// The ops seam (Note [ops seam]): every kernel the model, executor and decoder run, as one
// abstract interface. Model, train, exec and infer code call kernels only through an `Ops`, never
// by including a kernels/ header; a backend implements `Ops` (kernels/cpu/cpu_ops.h is the
// reference that defines the semantics, documented op by op in the kernels/cpu headers) and
// `ops_make` (backend/backend.h) hands one out. An `Ops` is bound to where it runs (the CPU
// backend: one ThreadPool), so a caller with two pools (the executor and its optimizer worker)
// holds two. Pointers are in the memory the backend computes in (RAM for the CPU backend).
// Does not allocate, own or move data.
// Note [ops seam]: the contract every backend keeps: each op gives every output element to one
// work item and runs every reduction in a fixed order, so the bits do not depend on the number
// of threads (or blocks) or on where the inputs came from; sizes of scratch buffers are asked of
// the backend (attention_scratch_floats) because they are its business.
// Note [ops memory]: every buffer an op reads or writes comes from the Ops that runs it
// (memory_alloc, through OpsBuffer), so model and exec code allocate the same way on every
// backend; host code touches tensor data only where host_memory() is true or through
// upload/download (tokens in, losses and norms out, the store's state across the tiers).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/attention_rows.h"
#include "ops/rope_table.h"
#include "stratum/error.h"

namespace stratum {

// What an Ops computes its matrix products in (sgemm, matmul_forward/backward; Note [bf16
// products] in kernels/cpu/matmul_bf16.h): Fp32, or Bf16 (operands rounded to bfloat16, products
// summed in fp32, results fp32). Norms, softmax, attention, the loss and AdamW are fp32 in both.
enum class Precision { Fp32, Bf16 };
inline const char* precision_name(Precision p) { return p == Precision::Bf16 ? "bf16" : "fp32"; }

// AdamW hyper-parameters of one update.
struct AdamWHyper {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  long step = 1;  // 1-based step count used for bias correction
};

// One zeroth-order update of a tensor's elements (Note [zo noise] in core/zo_noise.h, Note
// [zeroth-order step] in exec/executor.h). For each element p with flat index `first + i` in its
// Hugging Face tensor, in fp32 and in this order:
//   with `update`: z = z(update_key); p = p + z * eps; p = p - lr * (g * z + weight_decay * p)
//   with `perturb`: z = z(perturb_key); p = p + z * scale
// (the restore of step t's last perturbation and MeZO's update, then step t+1's perturbation).
struct ZoUpdate {
  bool update = false;
  std::uint64_t update_key = 0;
  float eps = 0.0f, lr = 0.0f, g = 0.0f, weight_decay = 0.0f;
  bool perturb = false;
  std::uint64_t perturb_key = 0;
  float scale = 0.0f;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // Memory (Note [ops memory]). host_memory: the pointers ops take are host RAM (the CPU backend),
  // so host code may read them and no copies are needed. memory_alloc: `bytes` of the memory this
  // Ops computes in, zero-filled, at least 64-byte aligned (ops/ops_buffer.h owns it);
  // memory_free takes the same size back. upload / download: host RAM <-> that memory; download
  // waits for the ops queued before it.
  virtual bool host_memory() const = 0;
  virtual void* memory_alloc(std::size_t bytes) const = 0;
  virtual void memory_free(void* p, std::size_t bytes) const noexcept = 0;
  virtual void upload(void* dst, const void* src_host, std::size_t bytes) const = 0;
  virtual void download(void* dst_host, const void* src, std::size_t bytes) const = 0;
  // Note [queued frees]: memory made and given back in the compute queue's order, for buffers
  // that come and go while the device computes (the device tier's units). memory_alloc_queued:
  // as memory_alloc, but only the compute queue may use it before an event recorded there after
  // this call has passed (the transfer queues wait for one). memory_free_queued: the memory goes
  // back once the compute queued so far has run; the caller guarantees that no transfer queued
  // or in flight uses it. Neither waits for the device. By default memory_alloc / memory_free.
  virtual void* memory_alloc_queued(std::size_t bytes) const { return memory_alloc(bytes); }
  virtual void memory_free_queued(void* p, std::size_t bytes) const noexcept { memory_free(p, bytes); }
  // Note [ops transfers]: copies between host RAM and this Ops' memory that run beside the
  // compute (the device tier's prefetch and write-back, Note [device tier] in
  // store/device_segment_store.h). An event (event_create; OpsEvent owns one) marks a point in one
  // of the Ops' queues; transfers run on two copy queues of their own, one per direction (in order
  // within a direction; an upload never waits for a download queued before it, nor the reverse):
  //   event_record(e): e = everything queued for compute so far;
  //   transfer(dst, src, bytes, to_device, after, done): on its direction's queue once event `after`
  //     (may be null) has passed; records `done` (may be null) when the copy has finished;
  //   compute_wait(e): compute queued from now on waits for e (the host does not);
  //   event_done(e) / event_sync(e): has e passed / the host waits until it has.
  // Host memory a transfer reads or writes must stay valid until its `done` has passed. host_pin
  // page-locks host memory (true when it did) so transfers from and to it are asynchronous;
  // pageable host memory is staged before transfer() returns (uploads) or copied by then
  // (downloads). These defaults are a backend computing in host memory: copies done at once,
  // every event passed.
  virtual void* event_create() const { return nullptr; }
  virtual void event_destroy(void* /*event*/) const noexcept {}
  virtual void event_record(void* /*event*/) const {}
  virtual void transfer(void* dst, const void* src, std::size_t bytes, bool to_device, void* /*after*/,
                        void* /*done*/) const {
    if (to_device) upload(dst, src, bytes);
    else download(dst, src, bytes);
  }
  virtual void compute_wait(void* /*event*/) const {}
  virtual bool event_done(void* /*event*/) const { return true; }
  virtual void event_sync(void* /*event*/) const {}
  virtual bool host_pin(void* /*p*/, std::size_t /*bytes*/) const { return false; }
  virtual void host_unpin(void* /*p*/) const noexcept {}
  // Note [device timeline]: fn(arg) runs on a thread of the backend's once everything queued on
  // `queue` before this call has finished (a host backend: at once, here); fn must not call into
  // the Ops. For --trace: each call pauses its queue briefly.
  enum class Queue { Compute, Upload, Download };
  virtual void queue_call(Queue /*queue*/, void (*fn)(void*), void* arg) const { fn(arg); }
  // x (n) = value; dst (n) = src (n) (not overlapping).
  virtual void fill(float* x, float value, std::size_t n) const = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) const = 0;

  // GEMM. C (M,N) = alpha * op(A) @ op(B) + beta * C, row-major (kernels/cpu/matmul.h).
  virtual void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                     const float* B, int ldb, float beta, float* C, int ldc) const = 0;
  // sgemm with B given in bfloat16 (a weight kept as stored, Note [frozen bf16 base] in
  // model/block_policy.h): the bits of sgemm on B's exact fp32 widening. scratch: room for op(B)
  // widened (K*N floats) where sgemm_b16_widens(), else unused (may be null).
  virtual void sgemm_b16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                         const std::uint16_t* B, int ldb, float beta, float* C, int ldc, float* scratch) const = 0;
  // Whether sgemm_b16 widens B into its scratch (callers then hand it panels of columns, Note
  // [widened in panels] in model/block_policy.h), or multiplies bf16 as it is.
  virtual bool sgemm_b16_widens() const { return true; }
  // Note [rounded operands]: where bf16_rounded() (the CPU's bf16 products through oneDNN), an
  // operand used in several products may be rounded once (bf16_round) and multiplied as it is
  // (sgemm_rounded): the bits of sgemm on its fp32 source, since sgemm rounds it the same way and
  // the products are the same. The LM head rounds its normed input once a step and each block's
  // logit gradients once for their two products, instead of in every product (a third of a bf16
  // step's rounding). Elsewhere these two are never called (a bug).
  virtual bool bf16_rounded() const { return false; }
  // dst (rows, cols), dense = src (rows, cols; leading dimension ld) rounded to bf16.
  virtual void bf16_round(std::uint16_t* /*dst*/, const float* /*src*/, int /*rows*/, int /*cols*/, int /*ld*/) const {
    throw BugError("[ops] bug: bf16_round on a backend without bf16_rounded()");
  }
  // sgemm on operands bf16_round made: op(A) and op(B) dense as stored (A: M x K, K x M when
  // transposed; B: K x N, N x K when transposed).
  virtual void sgemm_rounded(bool /*trans_a*/, bool /*trans_b*/, int /*M*/, int /*N*/, int /*K*/, float /*alpha*/,
                             const std::uint16_t* /*A*/, const std::uint16_t* /*B*/, float /*beta*/, float* /*C*/,
                             int /*ldc*/) const {
    throw BugError("[ops] bug: sgemm_rounded on a backend without bf16_rounded()");
  }
  // out (M,N) = inp (M,K) @ w (K,N) + bias (N) (Conv1D layout), and its backward.
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int M, int K,
                              int N) const = 0;
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                               const float* w, int M, int K, int N, bool accumulate) const = 0;
  // Row dot products for decoding (Note [row dot products] in kernels/cpu/rowdot.h): y = x @ w^T
  // for w (N,K), and y = x @ w + bias for w (K,N), fp32 or bf16.
  virtual void rowdot_nt(float* y, int ldy, const float* x, int ldx, const float* w, const float* bias, int M, int N,
                         int K) const = 0;
  virtual void rowdot_nt_bf16(float* y, int ldy, const float* x, int ldx, const std::uint16_t* w, const float* bias,
                              int M, int N, int K) const = 0;
  virtual void rowdot_kn(float* y, const float* x, const float* w, const float* bias, int M, int K, int N) const = 0;
  virtual void rowdot_kn_bf16(float* y, const float* x, const std::uint16_t* w, const float* bias, int M, int K,
                              int N) const = 0;

  // Norms (N rows of C).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                 const float* b, int N, int C, float eps) const = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                  const float* w, const float* mean, const float* rstd, int N, int C,
                                  bool accumulate_params) const = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                               float eps) const = 0;
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                                const float* rstd, int N, int C, bool accumulate_params) const = 0;
  // Per-head RMSNorm in place (Qwen3's q_norm and k_norm, Note [qk norm] in model/llama_block.h):
  // n token rows ld floats apart, each `heads` vectors of hd floats normed with the same w (hd);
  // rstd (n * heads). The backward turns d (same layout) from d out into d in, in place, from the
  // forward's input x; dw (hd) = (or +=) its gradient, each column summed over the vectors in order.
  virtual void rmsnorm_heads_forward(float* x, int ld, float* rstd, const float* w, int n, int heads, int hd,
                                     float eps) const = 0;
  virtual void rmsnorm_heads_backward(float* d, const float* x, int ld, float* dw, const float* w, const float* rstd,
                                      int n, int heads, int hd, bool accumulate_params) const = 0;

  // Causal grouped-query attention over a (B,T,H*hd + 2*KV*hd) qkv buffer (kernels/cpu/attention.h);
  // the forward keeps (B,H,T,2) softmax row statistics for the backward, never a (T,T) matrix
  // (a backend may hold score blocks of bounded size in its scratch: CUDA's, Note [cuda attention
  // products]). Both take the query rows [r0, r0 + n) of the B*T rows: out and dout hold those n
  // rows; the backward is called for ranges in increasing order (Note [attention row ranges]).
  // The training attention's sequences a backend may run side by side, each with its own part of
  // the scratch (Note [attention lanes] in kernels/cuda/cuda_context.cuh): a run under a device
  // memory budget takes 1, so the scratch leaves the budget's room to the state. Set before
  // attention_scratch_floats sizes anything; the bits do not depend on it. The CPU has none.
  virtual void attention_lanes_limit(int lanes) { (void)lanes; }
  virtual std::size_t attention_scratch_floats(int B, int T, int H, int KV, int hd) const = 0;
  // Bytes the backend keeps for its matrix products when no dimension exceeds `rows` (the
  // tokens of a step) or `width` (the widest layer), and every weight is at most narrow x width
  // (bf16 products keep rounded copies of the operands).
  virtual std::size_t gemm_scratch_bytes(int rows, int width, int narrow) const = 0;
  // scores: a sliding window and soft-capping (Note [attention scores] in ops/attention_rows.h);
  // {} for plain causal attention, which is all a backend without them (CUDA) takes.
  virtual void attention_forward(float* out, float* stats, float* scratch, const float* qkv, int B, int T, int H,
                                 int KV, int hd, int r0, int n, AttentionScores scores) const = 0;
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* stats, int B, int T, int H, int KV, int hd, int r0, int n,
                                  AttentionScores scores) const = 0;
  // Attention of Tn new queries per sequence against a KV cache (bit-identical to the full forward
  // on the CPU; to rounding on CUDA, Note [cuda attention rows]).
  virtual std::size_t attention_cached_scratch_floats(int hd, int max_T) const = 0;
  virtual void attention_cached(float* out, float* scratch, const float* q, const float* kcache,
                                const float* vcache, int B, int Tn, const int* past, int max_T, int H, int KV,
                                int hd, AttentionScores scores) const = 0;
  // Rotary embedding in place (rotate-half), and its transpose.
  virtual void rope_forward(float* x, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                            const RopeTable& table) const = 0;
  virtual void rope_backward(float* dx, int B, int T, int heads, int hd, std::size_t row_stride, const int* pos0,
                             const RopeTable& table) const = 0;

  // Activations and elementwise.
  virtual void gelu_forward(float* out, const float* inp, std::size_t n) const = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) const = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) const = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                               std::size_t n) const = 0;
  // GeGLU (Gemma's MLP, Note [gemma] in model/model_config.h): gelu_tanh(gate) * up, and its
  // gradients, in swiglu's layout and aliasing. Backends without it are refused Gemma
  // (GptConfig::backend_check) before any call.
  virtual void geglu_forward(float* /*out*/, const float* /*gate*/, const float* /*up*/, std::size_t /*n*/) const {
    throw BugError("[ops] bug: geglu_forward on a backend without GeGLU kernels");
  }
  virtual void geglu_backward(float* /*dgate*/, float* /*dup*/, const float* /*dout*/, const float* /*gate*/,
                              const float* /*up*/, std::size_t /*n*/) const {
    throw BugError("[ops] bug: geglu_backward on a backend without GeGLU kernels");
  }
  virtual void add(float* out, const float* a, const float* b, std::size_t n) const = 0;
  // Dropout (Note [dropout mask] in core/dropout_mask.h): y (M,n) (row stride ldy) = x (M,n) (row
  // stride ldx) with key's mask and drop probability p applied, or added to y with accumulate.
  virtual void dropout(float* y, int ldy, const float* x, int ldx, int M, int n, std::uint64_t key, float p,
                       bool accumulate) const = 0;
  // out[i] = the sum of xs[i][0 .. ns[i])^2, each in double in one fixed order (the CPU's, on every
  // backend: Note [fixed chunks] in kernels/cpu/elementwise.h). Many vectors at once, so a device
  // runs their chunks side by side in one pass (a gradient norm's tensors: Note [norm in one pass]
  // in exec/executor.h); returns when out is written.
  virtual void sum_squares_many(double* out, const float* const* xs, const std::size_t* ns,
                                std::size_t count) const = 0;
  double sum_squares(const float* x, std::size_t n) const {
    double out = 0.0;
    sum_squares_many(&out, &x, &n, 1);
    return out;
  }
  // out (n) = in (n) widened from bfloat16 (exact; Note [frozen bf16 base] in model/block_policy.h).
  virtual void bf16_widen(float* out, const std::uint16_t* in, std::size_t n) const = 0;

  // Cross-entropy over vocabulary chunks (Note [online log-sum-exp]).
  virtual void xent_chunk_forward(float* run_max, float* run_sum, float* target_logit, const float* logits,
                                  const std::int32_t* targets, int N, int n, int v0) const = 0;
  // softcap > 0: logits are capped ones and dlogits the raw logits' gradient (Note [final
  // softcapping] in kernels/cpu/softmax_xent.h); 0, the only value a backend without it (CUDA) takes.
  virtual void xent_chunk_backward(float* dlogits, const float* logits, const float* lse,
                                   const std::int32_t* targets, int N, int n, int v0, float dloss,
                                   float softcap) const = 0;
  // x (rows, n), row stride ld, in place: cap * tanh(x / cap) (Note [final softcapping]; Gemma 2's
  // LM head). A backend without it throws a BugError: backend_check refuses Gemma 2 there first.
  virtual void logit_softcap(float* /*x*/, int /*rows*/, int /*n*/, int /*ld*/, float /*cap*/) const {
    throw BugError("[ops] bug: logit_softcap on a backend without soft-capping kernels");
  }
  // The end of the cross-entropy (Note [online log-sum-exp]): lse (N) = run_max + log(run_sum)
  // (float), and the mean of lse - target_logit over the rows whose target is >= 0, summed in
  // double in row order (0 when none is). A target below 0 is no loss target (Note [loss mask] in
  // data/token_file.h): xent_chunk_backward gives its row zeros.
  virtual float xent_loss_finish(float* lse, const float* run_max, const float* run_sum, const float* target_logit,
                                 const std::int32_t* targets, int N) const = 0;
  // probs (V) = softmax(logits / temperature) of one row (sampling; temperature > 0).
  virtual void softmax_row(float* probs, const float* logits, int V, float temperature) const = 0;

  // Embeddings: position rows, token rows of one vocabulary block (fp32 or bf16), and backward.
  // scale: the token rows times scale as they are added, and d wte += scale * d out (Gemma's
  // sqrt(hidden_size), Note [gemma] in model/model_config.h); 1 everywhere else, the only value a
  // backend without Gemma accepts.
  virtual void embedding_forward_positions(float* out, const float* wpe, int B, int T, int C) const = 0;
  virtual void embedding_forward_block(float* out, const std::int32_t* tokens, const float* wte_rows, int v0, int n,
                                       int B, int T, int C, float scale) const = 0;
  virtual void embedding_forward_block_bf16(float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows,
                                            int v0, int n, int B, int T, int C, float scale) const = 0;
  virtual void embedding_backward_positions(float* dwpe, const float* dout, int B, int T, int C) const = 0;
  virtual void embedding_backward_block(float* dwte_rows, const float* dout, const std::int32_t* tokens, int v0,
                                        int n, int B, int T, int C, float scale) const = 0;

  // AdamW on n elements (fp32 master weights), gradient scaled by grad_scale first.
  virtual void adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                            const AdamWHyper& hyper, double weight_decay, float grad_scale) const = 0;
  // Zeroth-order perturbation and update of x[0, n), elements first .. first + n - 1 of their tensor.
  virtual void zo_update(float* x, std::size_t n, std::uint64_t first, const ZoUpdate& u) const = 0;
};

}  // namespace stratum
