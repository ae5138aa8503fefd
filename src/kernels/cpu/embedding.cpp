// Embedding forward/backward; see embedding.h.
#include "kernels/cpu/embedding.h"

#include <cstddef>

#include "kernels/cpu/simd.h"

namespace stratum {

namespace {
STRATUM_SIMD_CLONES
void embedding_forward_rows(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                            std::size_t r0, std::size_t r1, int T, int C) {
  for (std::size_t r = r0; r < r1; ++r) {
    const float* te = wte + static_cast<std::size_t>(tokens[r]) * C;
    const float* pe = wpe + (r % T) * static_cast<std::size_t>(C);
    float* y = out + r * C;
    for (int c = 0; c < C; ++c) y[c] = te[c] + pe[c];
  }
}

STRATUM_SIMD_CLONES
void embedding_backward_cols(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                             std::size_t c0, std::size_t c1, int BT, int T, int C) {
  for (int r = 0; r < BT; ++r) {
    const float* dy = dout + static_cast<std::size_t>(r) * C;
    float* dte = dwte + static_cast<std::size_t>(tokens[r]) * C;
    float* dpe = dwpe + static_cast<std::size_t>(r % T) * C;
    for (std::size_t c = c0; c < c1; ++c) {
      dte[c] += dy[c];
      dpe[c] += dy[c];
    }
  }
}
}  // namespace

void embedding_forward(ThreadPool& pool, float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C) {
  pool.parallel_for(static_cast<std::size_t>(B) * T, [&](std::size_t r0, std::size_t r1) {
    embedding_forward_rows(out, tokens, wte, wpe, r0, r1, T, C);
  }, 16);
}

void embedding_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, int B, int T, int C) {
  pool.parallel_for(static_cast<std::size_t>(C), [&](std::size_t c0, std::size_t c1) {
    embedding_backward_cols(dwte, dwpe, dout, tokens, c0, c1, B * T, T, C);
  }, 16);
}

}  // namespace stratum
