// Picks a compute backend: hands out the `Ops` (ops/ops.h) that code above the seam calls, and
// the process-wide settings of the backend's libraries. The only place that names a backend's
// kernels; model, exec, train and infer code include this, never a kernels/ header. A second
// backend (kernels/cuda) adds a Backend value and a branch here, nothing else above the seam.
// Does not run kernels itself.
#pragma once

#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "ops/ops.h"

namespace stratum {

enum class Backend { Cpu, Cuda };
const char* backend_name(Backend backend);  // "cpu", "cuda"
// "cpu" or "cuda"; anything else throws Error naming --backend.
Backend backend_parse(const std::string& name);

// Whether `backend` can run here: Cpu always; Cuda when this binary was built with it
// (-DSTRATUM_CUDA, CMakeLists.txt) and a usable GPU is present. false: *why says why, in one
// line (e.g. "this build has no CUDA backend: ...").
bool backend_available(Backend backend, std::string* why = nullptr);
// One line naming the backends this binary has and the device each would run on, e.g.
// "cpu; cuda: NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or "cpu; cuda: built, no GPU (...)".
std::string backend_inventory();

// An Ops bound to `pool` (the CPU backend runs its kernels on it; the CUDA backend runs on the
// current GPU and ignores it), computing its matrix products in `precision`. The pool must
// outlive it. A backend that is not available throws Error with backend_available's reason.
std::unique_ptr<Ops> ops_make(ThreadPool& pool, Precision precision = Precision::Fp32, Backend backend = Backend::Cpu);

// Whether `precision` runs at full speed here; false: a line for the user saying why not.
std::string backend_precision_note(Precision precision);

// Threads the backend's GEMM library uses (OpenBLAS on the CPU), and its one-line description
// ("OpenBLAS 0.3.21 (Cooperlake, 2 threads)").
void backend_set_threads(int threads);
// Once at the start of main, before any thread: the backend libraries' process settings
// (OpenBLAS's environment, kernels/cpu/matmul.h); may re-exec the process with them.
void backend_prepare_process(char** argv);
// What a run on `backend` computes with, for its header line: the CPU's BLAS (a CUDA build adds
// that this run is on the CPU, said once, without starting the driver), or the GPU.
std::string backend_describe(Backend backend = Backend::Cpu);

}  // namespace stratum
