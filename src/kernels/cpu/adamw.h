// AdamW update with torch.optim.AdamW semantics (bias-corrected moments, decoupled weight decay,
// same operation order as PyTorch's single-tensor CPU path). Does not own memory.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"
#include "ops/ops.h"  // AdamWHyper

namespace stratum {

// For i in [0, n): g = grad[i] * grad_scale (the clipping coefficient, 1 when not clipping);
// param *= 1 - lr*weight_decay; m = beta1 m + (1-beta1) g; v = beta2 v + (1-beta2) g g;
// param += -lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps).
void adamw_update(ThreadPool& pool, float* param, float* m, float* v, const float* grad, std::size_t n,
                  const AdamWHyper& hyper, double weight_decay, float grad_scale);

}  // namespace stratum
