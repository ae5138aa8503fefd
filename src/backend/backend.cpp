// ops_make and the backends' library settings; see backend.h.
#include "backend/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "stratum/error.h"
#ifdef STRATUM_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace stratum {

#ifdef STRATUM_WITH_CUDA
namespace {
// libstratum_cuda.so beside the running executable (or $STRATUM_CUDA_LIB), loaded once on first
// use; null with *why when it cannot be (no CUDA runtime libraries on this machine, say).
const CudaBackendApi* cuda_api(std::string* why) {
  static std::once_flag once;
  static const CudaBackendApi* api = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    std::string path;
    if (const char* env = std::getenv("STRATUM_CUDA_LIB"); env != nullptr && *env != '\0') {
      path = env;
    } else {
      char exe[4096];
      const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
      std::string dir = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string();
      dir = dir.substr(0, dir.find_last_of('/') + 1);
      path = dir + "libstratum_cuda.so";
    }
    if (::access(path.c_str(), R_OK) != 0) {
      failure = "[backend.cuda] this build's CUDA backend " + path +
                " is missing: keep libstratum_cuda.so beside the stratum binary (or set STRATUM_CUDA_LIB), or use "
                "--backend cpu";
      return;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      failure = "[backend.cuda] cannot load the CUDA backend " + path + " (" + (err ? err : "unknown error") +
                "): install the CUDA runtime libraries it was built with (cuBLAS), or use --backend cpu";
      return;
    }
    using Entry = const CudaBackendApi* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "stratum_cuda_api"));
    const CudaBackendApi* a = entry != nullptr ? entry() : nullptr;
    if (a == nullptr || a->version != CudaBackendApi::kVersion) {
      failure = "[backend.cuda] " + path + " is not this build's CUDA backend: rebuild Stratum";
      return;
    }
    api = a;
  });
  if (api == nullptr && why != nullptr) *why = failure;
  return api;
}

const CudaBackendApi& cuda_api_or_throw() {
  std::string why;
  const CudaBackendApi* api = cuda_api(&why);
  if (api == nullptr) throw Error(why);
  return *api;
}
}  // namespace
#endif

const char* backend_name(Backend backend) { return backend == Backend::Cuda ? "cuda" : "cpu"; }

Backend backend_parse(const std::string& name) {
  if (name == "cpu") return Backend::Cpu;
  if (name == "cuda") return Backend::Cuda;
  STRATUM_FAIL("[cli] --backend must be 'cpu' or 'cuda', got '", name, "'");
}

bool backend_available(Backend backend, std::string* why) {
  if (backend == Backend::Cpu) return true;
#ifdef STRATUM_WITH_CUDA
  const CudaBackendApi* api = cuda_api(why);
  return api != nullptr && api->available(why);
#else
  if (why)
    *why = "[backend] this build has no CUDA backend: rebuild on a machine with the CUDA toolkit "
           "(cmake -DSTRATUM_CUDA=ON) or use the CPU";
  return false;
#endif
}

std::string backend_inventory() {
#ifdef STRATUM_WITH_CUDA
  std::string why;
  if (backend_available(Backend::Cuda, &why)) return "cpu; cuda: " + cuda_api_or_throw().describe();
  return "cpu; cuda: built, not usable here (" + why + ")";
#else
  return "cpu; cuda: not built";
#endif
}

std::unique_ptr<Ops> ops_make(ThreadPool& pool, Precision precision, Backend backend) {
  if (backend == Backend::Cuda) {
    std::string why;
    if (!backend_available(backend, &why)) throw Error(why);
#ifdef STRATUM_WITH_CUDA
    return std::unique_ptr<Ops>(cuda_api_or_throw().make_ops(precision));
#endif
  }
  return std::make_unique<CpuOps>(pool, precision);
}

std::string backend_precision_note(Precision precision) {
  if (precision != Precision::Bf16 || bf16_native()) return "";
  return "this CPU has no native bf16 (AVX-512 BF16 or AMX): --precision bf16 gives bf16's results at fp32's speed "
         "or slower here";
}

void backend_set_threads(int threads) { blas_set_threads(threads); }

void backend_prepare_process(char** argv) { blas_prepare_process(argv); }

std::string backend_describe(Backend backend) {
#ifdef STRATUM_WITH_CUDA
  if (backend == Backend::Cuda) return "CUDA on " + cuda_api_or_throw().describe();
  // No probe for a CPU run: loading the CUDA backend maps cuBLAS (`stratum version` probes).
  return blas_describe() + "; CUDA backend built, this run computes on the CPU (--backend cuda for the GPU)";
#else
  (void)backend;
  return blas_describe();
#endif
}

}  // namespace stratum
