// Embedding forward/backward; see embedding.h.
#include "kernels/cpu/embedding.h"

#include <cstddef>
#include <cstring>

#include "core/bf16.h"
#include "core/simd.h"

namespace stratum {

namespace {
// The scaled forms round the product before the add (-ffp-contract=off: no fused multiply-add).
template <typename E>  // float, or std::uint16_t for bf16 rows widened as they are added
STRATUM_SIMD_CLONES void embedding_add_rows(float* out, const std::int32_t* tokens, const E* wte_rows, int v0, int n,
                                            std::size_t r0, std::size_t r1, int C, float scale) {
  for (std::size_t r = r0; r < r1; ++r) {
    const int row = tokens[r] - v0;
    if (row < 0 || row >= n) continue;
    const E* te = wte_rows + static_cast<std::size_t>(row) * C;
    float* y = out + r * C;
    if (scale == 1.0f) {
      for (int c = 0; c < C; ++c) y[c] = to_f32(te[c]) + y[c];
    } else {
      for (int c = 0; c < C; ++c) y[c] = to_f32(te[c]) * scale + y[c];
    }
  }
}

STRATUM_SIMD_CLONES
void embedding_backward_cols(float* dwte_rows, const float* dout, const std::int32_t* tokens, int v0, int n,
                             std::size_t c0, std::size_t c1, int BT, int C, float scale) {
  for (int r = 0; r < BT; ++r) {
    const int row = tokens[r] - v0;
    if (row < 0 || row >= n) continue;
    const float* dy = dout + static_cast<std::size_t>(r) * C;
    float* dte = dwte_rows + static_cast<std::size_t>(row) * C;
    if (scale == 1.0f) {
      for (std::size_t c = c0; c < c1; ++c) dte[c] += dy[c];
    } else {
      for (std::size_t c = c0; c < c1; ++c) dte[c] += dy[c] * scale;
    }
  }
}

STRATUM_SIMD_CLONES
void embedding_positions_cols(float* dwpe, const float* dout, std::size_t c0, std::size_t c1, int BT, int T, int C) {
  for (int r = 0; r < BT; ++r) {
    const float* dy = dout + static_cast<std::size_t>(r) * C;
    float* dpe = dwpe + static_cast<std::size_t>(r % T) * C;
    for (std::size_t c = c0; c < c1; ++c) dpe[c] += dy[c];
  }
}
}  // namespace

void embedding_forward_positions(ThreadPool& pool, float* out, const float* wpe, int B, int T, int C) {
  pool.parallel_for(static_cast<std::size_t>(B) * T, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r)
      std::memcpy(out + r * C, wpe + (r % T) * static_cast<std::size_t>(C), sizeof(float) * C);
  }, 16);
}

void embedding_forward_block(ThreadPool& pool, float* out, const std::int32_t* tokens, const float* wte_rows, int v0,
                             int n, int B, int T, int C, float scale) {
  pool.parallel_for(static_cast<std::size_t>(B) * T, [&](std::size_t r0, std::size_t r1) {
    embedding_add_rows(out, tokens, wte_rows, v0, n, r0, r1, C, scale);
  }, 16);
}

void embedding_forward_block_bf16(ThreadPool& pool, float* out, const std::int32_t* tokens, const std::uint16_t* wte_rows,
                                  int v0, int n, int B, int T, int C, float scale) {
  pool.parallel_for(static_cast<std::size_t>(B) * T, [&](std::size_t r0, std::size_t r1) {
    embedding_add_rows(out, tokens, wte_rows, v0, n, r0, r1, C, scale);
  }, 16);
}

void embedding_backward_positions(ThreadPool& pool, float* dwpe, const float* dout, int B, int T, int C) {
  pool.parallel_for(static_cast<std::size_t>(C), [&](std::size_t c0, std::size_t c1) {
    embedding_positions_cols(dwpe, dout, c0, c1, B * T, T, C);
  }, 16);
}

void embedding_backward_block(ThreadPool& pool, float* dwte_rows, const float* dout, const std::int32_t* tokens,
                              int v0, int n, int B, int T, int C, float scale) {
  pool.parallel_for(static_cast<std::size_t>(C), [&](std::size_t c0, std::size_t c1) {
    embedding_backward_cols(dwte_rows, dout, tokens, v0, n, c0, c1, B * T, C, scale);
  }, 16);
}

}  // namespace stratum
