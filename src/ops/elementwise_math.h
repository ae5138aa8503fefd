// The per-element arithmetic of the ops that both backends compute with the same expression
// (AdamW, the zeroth-order update, the rotary rotation, GELU, SwiGLU): one definition,
// STRATUM_HOST_DEVICE, so the CPU kernels (kernels/cpu) and the CUDA kernels (kernels/cuda) give
// the same bits by construction (Note [cuda determinism] in kernels/cuda/cuda_ops.h). Scalar
// code, no loops: each backend loops its own way. Does not touch memory beyond its arguments.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "core/simd.h"
#include "core/zo_noise.h"
#include "ops/ops.h"

namespace stratum {

// AdamW's per-step constants in float (kernels/cpu/adamw.h), computed on the host in double the
// way torch.optim.AdamW does and rounded once.
struct AdamWScalars {
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps, grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWHyper& h, double weight_decay, float grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  AdamWScalars s{};
  s.decay_factor = static_cast<float>(1.0 - h.lr * weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(h.eps);
  s.grad_scale = grad_scale;
  return s;
}

// One element: g = grad * grad_scale; param *= decay; m, v updated; param += step * m / denom.
STRATUM_HOST_DEVICE inline void adamw_element(float& param, float& m, float& v, float grad, const AdamWScalars& s) {
  const float g = grad * s.grad_scale;
  float p = param * s.decay_factor;
  const float mi = m * s.beta1 + s.one_minus_beta1 * g;
  const float vi = v * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  p = p + s.neg_step_size * mi / denom;
  m = mi;
  v = vi;
  param = p;
}

// ZoUpdate (ops/ops.h) on one element p whose flat index in its tensor is i, z from `table`
// (Note [zo noise]).
STRATUM_HOST_DEVICE inline float zo_element(float p, const float* table, std::uint64_t i, const ZoUpdate& u) {
  if (u.update) {
    const float z = zo_z(table, u.update_key, i);
    p = p + z * u.eps;
    p = p - u.lr * (u.g * z + u.weight_decay * p);
  }
  if (u.perturb) p = p + zo_z(table, u.perturb_key, i) * u.scale;
  return p;
}

// GELU, tanh form (kernels/cpu/gelu.h): forward, and dout * gelu'(x), with simd::tanh_f32.
STRATUM_HOST_DEVICE inline float gelu_element(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + simd::tanh_f32(u));
}
STRATUM_HOST_DEVICE inline float gelu_grad_element(float x, float dout) {
  const float k = 0.7978845608028654f, c = 0.044715f;
  const float u = k * (x + c * x * x * x);
  const float t = simd::tanh_f32(u);
  const float du = k * (1.0f + 3.0f * c * x * x);
  const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  return dout * grad;
}

// SwiGLU (kernels/cpu/swiglu.h): silu(gate) * up, and its gradients in torch's silu_backward order
// (dy read before either output is written, so they may alias dout).
STRATUM_HOST_DEVICE inline float swiglu_element(float gate, float up) {
  return gate / (1.0f + simd::exp_f32(-gate)) * up;
}
STRATUM_HOST_DEVICE inline void swiglu_grad_element(float dy, float x, float u, float& dgate, float& dup) {
  const float denom = 1.0f + simd::exp_f32(-x);
  const float sig = 1.0f / denom;
  const float silu = x / denom;  // the forward's value
  dup = dy * silu;
  dgate = (dy * u) * sig * (1.0f + x * (1.0f - sig));
}

// GeGLU (Gemma's MLP, kernels/cpu/swiglu.h): gelu_tanh(gate) * up, and its gradients as torch's
// autograd takes them: d up = dy * gelu(gate), d gate = gelu'(gate) * (dy * up).
STRATUM_HOST_DEVICE inline float geglu_element(float gate, float up) { return gelu_element(gate) * up; }
STRATUM_HOST_DEVICE inline void geglu_grad_element(float dy, float x, float u, float& dgate, float& dup) {
  dup = dy * gelu_element(x);
  dgate = gelu_grad_element(x, dy * u);
}

// The rotate-half rotation of one (lo, hi) pair by cos c, sin s, or by its transpose (kernels/cpu/rope.h).
STRATUM_HOST_DEVICE inline void rope_rotate(float& lo, float& hi, float c, float s, bool transpose) {
  const float a = lo, b = hi;
  if (!transpose) {
    lo = a * c - b * s;
    hi = b * c + a * s;
  } else {
    lo = a * c + b * s;
    hi = b * c - a * s;
  }
}

}  // namespace stratum
