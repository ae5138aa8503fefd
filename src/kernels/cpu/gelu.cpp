// GELU forward/backward, elementwise over fixed contiguous ranges; see gelu.h.
#include "kernels/cpu/gelu.h"

#include "core/simd.h"

namespace stratum {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

STRATUM_SIMD_CLONES
void gelu_forward_range(float* out, const float* inp, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + simd::tanh_f32(u));
  }
}

STRATUM_SIMD_CLONES
void gelu_backward_range(float* dinp, const float* inp, const float* dout, std::size_t i0, std::size_t i1) {
  for (std::size_t i = i0; i < i1; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = simd::tanh_f32(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    dinp[i] = dout[i] * grad;
  }
}
}  // namespace

void gelu_forward(ThreadPool& pool, float* out, const float* inp, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { gelu_forward_range(out, inp, i0, i1); }, 4096);
}

void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, std::size_t n) {
  pool.parallel_for(n, [&](std::size_t i0, std::size_t i1) { gelu_backward_range(dinp, inp, dout, i0, i1); },
                    4096);
}

}  // namespace stratum
