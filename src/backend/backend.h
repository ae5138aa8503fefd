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

enum class Backend { Cpu };

// An Ops bound to `pool` (the CPU backend runs its kernels on it), computing its matrix products
// in `precision`. The pool must outlive it.
std::unique_ptr<Ops> ops_make(ThreadPool& pool, Precision precision = Precision::Fp32, Backend backend = Backend::Cpu);
// Whether `precision` runs at full speed here; false: a line for the user saying why not.
std::string backend_precision_note(Precision precision);

// Threads the backend's GEMM library uses (OpenBLAS on the CPU), and its one-line description
// ("OpenBLAS 0.3.21 (Cooperlake, 2 threads)").
void backend_set_threads(int threads);
// Once at the start of main, before any thread: the backend libraries' process settings
// (OpenBLAS's environment, kernels/cpu/matmul.h); may re-exec the process with them.
void backend_prepare_process(char** argv);
std::string backend_describe();

}  // namespace stratum
