// STRATUM_HOST_DEVICE marks a small inline function that CPU kernels and CUDA kernels both call
// (one definition, so both backends compute its bits the same way: simd::exp_f32, the dropout
// mask, the zo noise). Empty outside nvcc. Does nothing else.
#pragma once

#ifdef __CUDACC__
#define STRATUM_HOST_DEVICE __host__ __device__
#else
#define STRATUM_HOST_DEVICE
#endif
