// CudaOps' life cycle and shared context, and the device API of cuda_device.h.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/zo_noise.h"
#include "kernels/cuda/cuda_context.cuh"
#include "kernels/cuda/cuda_device.h"
#include "ops/rope_table.h"

namespace stratum {

namespace {

constexpr std::size_t kBlasWorkspaceBytes = 32u << 20;  // fixed, so cuBLAS picks the same algorithms every run

__global__ void probe_kernel(int* out) { *out = 42; }

struct DeviceProbe {
  bool ok = false;
  std::string why;
  std::string describe;
};

const DeviceProbe& probe() {
  static const DeviceProbe p = [] {
    DeviceProbe r;
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {  // no driver at all reads as "insufficient"
      r.why = "[backend.cuda] no NVIDIA GPU or driver found: run on a machine with one, or with --backend cpu";
      cudaGetLastError();
      return r;
    }
    if (err != cudaSuccess) {
      r.why = std::string("[backend.cuda] the CUDA driver does not answer (") + cudaGetErrorString(err) +
              "): check nvidia-smi";
      cudaGetLastError();  // clear the sticky error of a missing driver
      return r;
    }
    if (count == 0) {
      r.why = "[backend.cuda] no CUDA device found";
      return r;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      r.why = "[backend.cuda] could not read the properties of CUDA device 0";
      return r;
    }
    // This build's kernels are machine code for one architecture family (CMAKE_CUDA_ARCHITECTURES);
    // a kernel that cannot load fails at its first launch: run one now.
    int* probe_mem = nullptr;
    if (cudaMalloc(&probe_mem, 256) != cudaSuccess) {
      r.why = std::string("[backend.cuda] CUDA device 0 (") + prop.name + ") cannot allocate memory";
      cudaGetLastError();
      return r;
    }
    int seen = 0;
    probe_kernel<<<1, 1>>>(probe_mem);
    const cudaError_t launched = cudaGetLastError();
    if (launched == cudaSuccess) cudaMemcpy(&seen, probe_mem, sizeof seen, cudaMemcpyDeviceToHost);
    cudaFree(probe_mem);
    if (launched != cudaSuccess || seen != 42) {
      char text[320];
      std::snprintf(text, sizeof text,
                    "[backend.cuda] %s (sm_%d%d) cannot run this build's kernels (%s): rebuild with "
                    "-DCMAKE_CUDA_ARCHITECTURES=%d%d",
                    prop.name, prop.major, prop.minor,
                    launched != cudaSuccess ? cudaGetErrorString(launched) : "the probe kernel wrote nothing",
                    prop.major, prop.minor);
      r.why = text;
      cudaGetLastError();
      return r;
    }
    int driver = 0;
    cudaDriverGetVersion(&driver);
    char text[256];
    std::snprintf(text, sizeof text, "%s (sm_%d%d, %.1f GiB, driver CUDA %d.%d)", prop.name, prop.major, prop.minor,
                  static_cast<double>(prop.totalGlobalMem) / (1ull << 30), driver / 1000, (driver % 1000) / 10);
    r.describe = text;
    r.ok = true;
    return r;
  }();
  return p;
}

}  // namespace

bool cuda_device_available(std::string* why) {
  const DeviceProbe& p = probe();
  if (!p.ok && why) *why = p.why;
  return p.ok;
}

std::string cuda_device_describe() { return probe().describe; }

void* cuda_alloc(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    STRATUM_FAIL("[backend.cuda] cannot allocate ", bytes, " bytes of GPU memory (", free_bytes,
                 " free): lower --batch/--seq or the model size, or run with --backend cpu --mem-budget (",
                 cudaGetErrorString(err), ")");
  }
  return p;
}

const CudaContext::RopeCopy& CudaContext::rope_copy(const RopeTable& table) {
  std::lock_guard<std::mutex> lock(tables_mutex);
  const int half = table.head_dim() / 2;
  const float probe_value = table.max_pos() > 0 && half > 0 ? table.cos(table.max_pos() - 1)[half - 1] : 0.0f;
  auto it = rope.find(&table);
  if (it != rope.end()) {
    const RopeCopy& c = it->second;
    if (c.head_dim == table.head_dim() && c.max_pos == table.max_pos() &&
        std::memcmp(&c.probe, &probe_value, sizeof probe_value) == 0)
      return c;
    cudaFree(c.cos);
    cudaFree(c.sin);
    rope.erase(it);
  }
  RopeCopy c;
  c.head_dim = table.head_dim();
  c.max_pos = table.max_pos();
  c.probe = probe_value;
  const std::size_t bytes = static_cast<std::size_t>(table.max_pos()) * half * sizeof(float);
  c.cos = static_cast<float*>(cuda_alloc(bytes > 0 ? bytes : 4));
  c.sin = static_cast<float*>(cuda_alloc(bytes > 0 ? bytes : 4));
  if (bytes > 0) {
    // The host table's rows are contiguous (RopeTable: (max_pos, head_dim/2) each).
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(c.cos, table.cos(0), bytes, cudaMemcpyHostToDevice, stream));
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(c.sin, table.sin(0), bytes, cudaMemcpyHostToDevice, stream));
    STRATUM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return rope.emplace(&table, c).first->second;
}

const float* CudaContext::zo_normal_table() {
  std::lock_guard<std::mutex> lock(tables_mutex);
  if (!zo_table) {
    zo_table = static_cast<float*>(cuda_alloc(65536 * sizeof(float)));
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(zo_table, ::stratum::zo_normal_table(), 65536 * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
    STRATUM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return zo_table;
}

void* CudaOps::memory_alloc(std::size_t bytes) const {
  if (bytes == 0) return nullptr;
  void* p = cuda_alloc(bytes);
  STRATUM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream));
  return p;
}

void* CudaOps::memory_alloc_queued(std::size_t bytes) const {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, bytes, ctx_->stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    STRATUM_FAIL("[backend.cuda] cannot allocate ", bytes, " bytes of GPU memory (", free_bytes,
                 " free): lower --gpu-mem-budget or --batch/--seq (", cudaGetErrorString(err), ")");
  }
  STRATUM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream));
  return p;
}

// Note [queued frees] (ops/ops.h): cudaFree waits for the whole device. The device tier gave its
// pool buffers back that way whenever a unit of another size needed their room: under
// --gpu-mem-budget 4300M the ~1.1B Llama's forward uploaded each chunk only after every copy and
// kernel queued before had finished (a --trace of one step: 583 ms of kernels, 822 ms with the
// compute queue idle, most of it before each layer's update).
void CudaOps::memory_free_queued(void* p, std::size_t) const noexcept {
  if (p != nullptr) cudaFreeAsync(p, ctx_->stream);
}

void CudaOps::memory_free(void* p, std::size_t) const noexcept {
  if (p == nullptr) return;
  cudaStreamSynchronize(ctx_->stream);  // no queued op or copy may still use it
  cudaStreamSynchronize(ctx_->upload_stream);
  cudaStreamSynchronize(ctx_->download_stream);
  cudaFree(p);
}

void* CudaOps::event_create() const {
  cudaEvent_t e = nullptr;
  STRATUM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaOps::event_destroy(void* event) const noexcept {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void CudaOps::event_record(void* event) const {
  STRATUM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), ctx_->stream));
}

void CudaOps::transfer(void* dst, const void* src, std::size_t bytes, bool to_device, void* after, void* done) const {
  cudaStream_t s = to_device ? ctx_->upload_stream : ctx_->download_stream;
  if (after != nullptr) STRATUM_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(after), 0));
  if (bytes > 0)
    STRATUM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
  if (done != nullptr) STRATUM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done), s));
}

void CudaOps::queue_call(Queue queue, void (*fn)(void*), void* arg) const {
  cudaStream_t s = queue == Queue::Upload ? ctx_->upload_stream : queue == Queue::Download ? ctx_->download_stream : ctx_->stream;
  STRATUM_CUDA_CHECK(cudaLaunchHostFunc(s, fn, arg));
}

void CudaOps::compute_wait(void* event) const {
  if (event != nullptr) STRATUM_CUDA_CHECK(cudaStreamWaitEvent(ctx_->stream, static_cast<cudaEvent_t>(event), 0));
}

bool CudaOps::event_done(void* event) const {
  if (event == nullptr) return true;
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  STRATUM_CUDA_CHECK(e);
  return true;
}

void CudaOps::event_sync(void* event) const {
  if (event != nullptr) STRATUM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

// A failed registration (not enough lockable memory, say) leaves the memory pageable: the copies
// stay correct, only not asynchronous.
bool CudaOps::host_pin(void* p, std::size_t bytes) const {
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
  cudaGetLastError();  // take the failed call's error off the thread's last-error slot
  return false;
}

void CudaOps::host_unpin(void* p) const noexcept { cudaHostUnregister(p); }

// Pageable host memory: cudaMemcpyAsync on the stream stages it before returning, so the host
// buffer may be reused at once, and the copy is ordered with the ops around it.
void CudaOps::upload(void* dst, const void* src_host, std::size_t bytes) const {
  if (bytes == 0) return;
  STRATUM_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, ctx_->stream));
}

void CudaOps::download(void* dst_host, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;
  STRATUM_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream));
  STRATUM_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
}

// Note [attention lanes] (cuda_context.cuh).
void CudaContext::lanes_fork(int n) {
  if (fork_ == nullptr) STRATUM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  STRATUM_CUDA_CHECK(cudaEventRecord(fork_, stream));
  for (int i = 1; i < n; ++i) {
    Lane& l = lanes_[i - 1];
    if (l.stream == nullptr) {
      STRATUM_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
      STRATUM_CUBLAS_CHECK(cublasCreate(&l.blas));
      STRATUM_CUBLAS_CHECK(cublasSetStream(l.blas, l.stream));
      STRATUM_CUBLAS_CHECK(cublasSetMathMode(  // as the main handle's (Note [cuda determinism])
          l.blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
      lane_workspace_[i - 1] = cuda_alloc(kBlasWorkspaceBytes);
      STRATUM_CUBLAS_CHECK(cublasSetWorkspace(l.blas, lane_workspace_[i - 1], kBlasWorkspaceBytes));
      STRATUM_CUDA_CHECK(cudaEventCreateWithFlags(&joined_[i - 1], cudaEventDisableTiming));
    }
    STRATUM_CUDA_CHECK(cudaStreamWaitEvent(l.stream, fork_, 0));
  }
}

void CudaContext::lanes_join(int n) {
  for (int i = 1; i < n; ++i) {
    STRATUM_CUDA_CHECK(cudaEventRecord(joined_[i - 1], lanes_[i - 1].stream));
    STRATUM_CUDA_CHECK(cudaStreamWaitEvent(stream, joined_[i - 1], 0));
  }
}

CudaContext::~CudaContext() {
  for (int i = 0; i < kLanes - 1; ++i) {
    if (lanes_[i].stream != nullptr) cudaStreamSynchronize(lanes_[i].stream);
    if (lanes_[i].blas != nullptr) cublasDestroy(lanes_[i].blas);
    cudaFree(lane_workspace_[i]);
    if (lanes_[i].stream != nullptr) cudaStreamDestroy(lanes_[i].stream);
    if (joined_[i] != nullptr) cudaEventDestroy(joined_[i]);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
}

CudaOps::CudaOps(Precision precision) : ctx_(std::make_unique<CudaContext>()), precision_(precision) {
  std::string why;
  if (!cuda_device_available(&why)) throw Error(why);
  STRATUM_CHECK(precision == Precision::Fp32,
                "[backend.cuda] --precision bf16 is not implemented on the CUDA backend yet: use fp32 there");
  // Note [cuda sync yields]: a host thread waiting for the GPU (a synchronize, a value read back)
  // yields its core instead of spinning on it (CUDA's default with fewer contexts than cores).
  // Beside the device tier's host optimizer, which runs AdamW on one thread per other core, a
  // spinning training thread made the ~1.1B Llama's step at --gpu-mem-budget 4300M vary: 1614,
  // 1265 and 1311 ms in three runs of one H200 lease, against 1281, 1275 and 1281 ms yielding
  // (1796 against 1253 ms in another lease; blocking 1334 ms). GPT-2 small in GPU memory: 134.2 ms
  // spinning, 134.0 yielding, 146.3 blocking (docs/benchmarks.md). Set before the context exists;
  // where another library made the context first, it keeps that context's setting.
  if (cudaSetDeviceFlags(cudaDeviceScheduleYield) != cudaSuccess) cudaGetLastError();
  STRATUM_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->stream, cudaStreamNonBlocking));
  {  // the queued allocations' pool keeps what they give back (Note [queued frees])
    int device = 0;
    cudaMemPool_t pool = nullptr;
    std::uint64_t keep = ~std::uint64_t{0};
    STRATUM_CUDA_CHECK(cudaGetDevice(&device));
    STRATUM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    STRATUM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  STRATUM_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->upload_stream, cudaStreamNonBlocking));
  STRATUM_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->download_stream, cudaStreamNonBlocking));
  STRATUM_CUBLAS_CHECK(cublasCreate(&ctx_->blas));
  STRATUM_CUBLAS_CHECK(cublasSetStream(ctx_->blas, ctx_->stream));
  // Exact fp32: no TF32 tensor-op math, no reduced-precision reductions (Note [cuda determinism]).
  STRATUM_CUBLAS_CHECK(cublasSetMathMode(
      ctx_->blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  ctx_->blas_workspace = cuda_alloc(kBlasWorkspaceBytes);
  STRATUM_CUBLAS_CHECK(cublasSetWorkspace(ctx_->blas, ctx_->blas_workspace, kBlasWorkspaceBytes));
  ctx_->scalars = static_cast<double*>(cuda_alloc(CudaContext::kScalarSlots * sizeof(double)));
  ctx_->sq_jobs = cuda_alloc(CudaContext::kScalarSlots * 2 * sizeof(void*));  // SqJob: a pointer and a size
}

CudaOps::~CudaOps() {
  // Nothing queued may run after (a queue_call's function may use what its caller frees next).
  if (ctx_->stream) cudaStreamSynchronize(ctx_->stream);
  if (ctx_->upload_stream) cudaStreamSynchronize(ctx_->upload_stream);
  if (ctx_->download_stream) cudaStreamSynchronize(ctx_->download_stream);
  for (auto& [table, c] : ctx_->rope) {
    cudaFree(c.cos);
    cudaFree(c.sin);
  }
  cudaFree(ctx_->zo_table);
  cudaFree(ctx_->scalars);
  cudaFree(ctx_->sq_jobs);
  if (ctx_->blas) cublasDestroy(ctx_->blas);
  cudaFree(ctx_->blas_workspace);
  if (ctx_->stream) cudaStreamDestroy(ctx_->stream);
  if (ctx_->upload_stream) cudaStreamDestroy(ctx_->upload_stream);
  if (ctx_->download_stream) cudaStreamDestroy(ctx_->download_stream);
}

}  // namespace stratum

namespace {
stratum::Ops* make_cuda_ops(stratum::Precision precision) { return new stratum::CudaOps(precision); }
const stratum::CudaBackendApi kApi{stratum::CudaBackendApi::kVersion,
                                   stratum::cuda_device_available,
                                   stratum::cuda_device_describe, make_cuda_ops};
}  // namespace

extern "C" __attribute__((visibility("default"))) const stratum::CudaBackendApi* stratum_cuda_api() { return &kApi; }
