// Tests for src/kernels/cpu/embedding (token + position embedding): the forward is one float add
// per element and the backward a sum over positions in order, so both are checked bit-exactly
// against a sequential float reference and within rounding against float64; plus a
// finite-difference check in double for dwte and dwpe, repeated tokens, accumulation into
// non-zero gradients, untouched rows, and thread-count independence. There is no PyTorch golden
// file for this op (tools/make_golden.py does not write one); the whole-model gradient golden
// in tests/golden/tiny_gpt2 covers it end to end.
#include "kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "test_util.h"

namespace stratum {
namespace {

using test::expect_close;

struct EmbShape {
  int B, T, C, V;
  std::size_t rows() const { return static_cast<std::size_t>(B) * T; }
};

// Tokens drawn from a vocabulary larger than used, with forced repeats (same token at several
// positions of one sequence and across sequences).
std::vector<std::int32_t> tokens_with_repeats(test::TestRng& rng, EmbShape s) {
  std::vector<std::int32_t> tokens(s.rows());
  for (auto& t : tokens) t = rng.below(s.V - 1);  // token V-1 never appears
  tokens[0] = tokens[1] = tokens[2] = 3;
  tokens[s.rows() - 1] = 3;
  return tokens;
}

// The table in vocabulary blocks of `block_rows` rows (the last one shorter), as the executor
// streams it; block_rows >= V is the whole table at once.
std::vector<float> emb_forward(ThreadPool& pool, const std::vector<std::int32_t>& tokens, const std::vector<float>& wte,
                               const std::vector<float>& wpe, EmbShape s, int block_rows = 1 << 30) {
  std::vector<float> out(s.rows() * s.C, std::numeric_limits<float>::quiet_NaN());
  embedding_forward_positions(pool, out.data(), wpe.data(), s.B, s.T, s.C);
  for (int v0 = 0; v0 < s.V; v0 += block_rows)
    embedding_forward_block(pool, out.data(), tokens.data(), wte.data() + static_cast<std::size_t>(v0) * s.C, v0,
                            std::min(block_rows, s.V - v0), s.B, s.T, s.C);
  return out;
}

void emb_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout, const std::vector<std::int32_t>& tokens,
                  EmbShape s, int block_rows = 1 << 30) {
  embedding_backward_positions(pool, dwpe, dout, s.B, s.T, s.C);
  for (int v0 = 0; v0 < s.V; v0 += block_rows)
    embedding_backward_block(pool, dwte + static_cast<std::size_t>(v0) * s.C, dout, tokens.data(), v0,
                             std::min(block_rows, s.V - v0), s.B, s.T, s.C);
}

TEST(KernelEmbedding, ForwardIsTokenRowPlusPositionRow) {
  const EmbShape s{3, 17, 100, 13};
  test::TestRng rng(71);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  ThreadPool pool(2);
  const auto out = emb_forward(pool, tokens, wte, wpe, s);
  for (std::size_t r = 0; r < s.rows(); ++r)
    for (int c = 0; c < s.C; ++c)
      ASSERT_EQ(out[r * s.C + c], wte[static_cast<std::size_t>(tokens[r]) * s.C + c] + wpe[(r % s.T) * s.C + c])
          << "row " << r << " channel " << c;
}

// dwte[token] and dwpe[t] accumulate dout rows in position order, on top of what they held.
// Bit-exact against the same float order; vs float64: measured dwte 3.3e-7 (token 3 sums 4+
// rows), dwpe 1.6e-7.
// Bound 1e-6. Rows of tokens that never occur stay bit-identical.
TEST(KernelEmbedding, BackwardAccumulatesRepeatedTokensInOrder) {
  const EmbShape s{3, 17, 100, 13};
  test::TestRng rng(72);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto dout = rng.normal_f32(s.rows() * s.C);
  const auto dwte0 = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), dwpe0 = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  ThreadPool pool(2);
  emb_backward(pool, dwte.data(), dwpe.data(), dout.data(), tokens, s);

  std::vector<float> want_te = dwte0, want_pe = dwpe0;
  std::vector<double> ref_te(dwte0.begin(), dwte0.end()), ref_pe(dwpe0.begin(), dwpe0.end());
  for (std::size_t r = 0; r < s.rows(); ++r)
    for (int c = 0; c < s.C; ++c) {
      const std::size_t te = static_cast<std::size_t>(tokens[r]) * s.C + c, pe = (r % s.T) * s.C + c;
      want_te[te] += dout[r * s.C + c];
      want_pe[pe] += dout[r * s.C + c];
      ref_te[te] += dout[r * s.C + c];
      ref_pe[pe] += dout[r * s.C + c];
    }
  EXPECT_EQ(dwte, want_te) << "dwte must sum positions in order, on top of its old value";
  EXPECT_EQ(dwpe, want_pe) << "dwpe must sum batch rows in order, on top of its old value";
  expect_close(dwte, ref_te, 1e-6, "dwte");
  expect_close(dwpe, ref_pe, 1e-6, "dwpe");
  for (int c = 0; c < s.C; ++c) {
    const std::size_t i = static_cast<std::size_t>(s.V - 1) * s.C + c;
    ASSERT_EQ(dwte[i], dwte0[i]) << "row of an unused token changed at channel " << c;
  }
}

// J = sum w * out; out is linear in wte and wpe, so central differences have no truncation
// error and h = 0.25 leaves only the float rounding of J. Measured: dwte 2.2e-7, dwpe 2.8e-7.
// Bound 2e-5 (a missed repeat of a token loses a whole O(1) term).
TEST(KernelEmbedding, GradientsMatchFiniteDifferences) {
  const EmbShape s{2, 5, 12, 7};
  test::TestRng rng(73);
  const auto tokens = tokens_with_repeats(rng, s);
  auto wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  const auto w = rng.normal_f32(s.rows() * s.C);
  const std::vector<double> weights(w.begin(), w.end());
  ThreadPool pool(2);
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  emb_backward(pool, dwte.data(), dwpe.data(), w.data(), tokens, s);
  auto objective = [&] { return test::weighted_sum(emb_forward(pool, tokens, wte, wpe, s), weights); };
  test::expect_grad_matches_fd(wte, dwte, 0.25, 2e-5, "dwte", objective);
  test::expect_grad_matches_fd(wpe, dwpe, 0.25, 2e-5, "dwpe", objective);
}

// Forward: min 16 rows per range (51 rows); backward: min 16 channels per range (100 channels).
TEST(KernelEmbedding, ThreadCountIndependent) {
  const EmbShape s{3, 17, 100, 13};
  test::TestRng rng(74);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  const auto dout = rng.normal_f32(s.rows() * s.C);
  test::expect_thread_count_independent(
      [&](ThreadPool& pool) {
        const auto out = emb_forward(pool, tokens, wte, wpe, s);
        std::vector<float> dwte = wte, dwpe = wpe;  // non-zero starting gradients
        emb_backward(pool, dwte.data(), dwpe.data(), dout.data(), tokens, s);
        return test::concat({&out, &dwte, &dwpe});
      },
      "embedding");
}

// Note [vocab blocks]: streaming the table in blocks of rows gives the same bits as the whole table.
TEST(KernelEmbedding, VocabularyBlocksGiveTheSameBitsAsOneTable) {
  const EmbShape s{3, 17, 100, 13};
  test::TestRng rng(75);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  const auto dout = rng.normal_f32(s.rows() * s.C);
  ThreadPool pool(2);
  const auto whole = emb_forward(pool, tokens, wte, wpe, s);
  std::vector<float> dwte_whole = wte, dwpe_whole = wpe;
  emb_backward(pool, dwte_whole.data(), dwpe_whole.data(), dout.data(), tokens, s);
  for (int rows : {1, 4, 5}) {
    EXPECT_EQ(emb_forward(pool, tokens, wte, wpe, s, rows), whole) << rows << "-row blocks";
    std::vector<float> dwte = wte, dwpe = wpe;
    emb_backward(pool, dwte.data(), dwpe.data(), dout.data(), tokens, s, rows);
    EXPECT_EQ(dwte, dwte_whole) << rows << "-row blocks";
    EXPECT_EQ(dwpe, dwpe_whole) << rows << "-row blocks";
  }
}

// Note [bf16 weights]: bf16 rows are added as their exact fp32 widening, block by block.
TEST(KernelEmbedding, Bf16BlocksGiveTheBitsOfTheirWidening) {
  const EmbShape s{2, 9, 100, 13};
  test::TestRng rng(76);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto src = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
  const std::vector<std::uint16_t> h = test::bf16_truncate(src);
  std::vector<float> wide(src.size());
  bf16_widen(wide.data(), h.data(), h.size());
  ThreadPool pool(2);
  const auto want = emb_forward(pool, tokens, wide, wpe, s);
  for (int rows : {4, 13}) {
    std::vector<float> out(s.rows() * s.C);
    embedding_forward_positions(pool, out.data(), wpe.data(), s.B, s.T, s.C);
    for (int v0 = 0; v0 < s.V; v0 += rows)
      embedding_forward_block_bf16(pool, out.data(), tokens.data(), h.data() + static_cast<std::size_t>(v0) * s.C, v0,
                                   std::min(rows, s.V - v0), s.B, s.T, s.C);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << rows << "-row blocks";
  }
}

// Note [gemma]: a scale multiplies each token row as it is added (over zeros: the rounded product,
// torch's `embed(ids) * normalizer`), fp32 and bf16, in any blocking; the backward adds
// dout * scale, the product rounded before each add (torch's grad * normalizer, then its sum per
// token in position order).
TEST(KernelEmbedding, ScaledRowsAndGradientsAreTheRoundedProducts) {
  const EmbShape s{2, 9, 13, 100};
  test::TestRng rng(77);
  const auto tokens = tokens_with_repeats(rng, s);
  const auto wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C), dout = rng.normal_f32(s.rows() * s.C);
  const std::vector<std::uint16_t> h = test::bf16_truncate(wte);
  std::vector<float> wide(wte.size());
  bf16_widen(wide.data(), h.data(), h.size());
  const float scale = static_cast<float>(std::sqrt(13.0));
  ThreadPool pool(2);
  for (int rows : {7, 100}) {
    std::vector<float> out(s.rows() * s.C, 0.0f), out16(s.rows() * s.C, 0.0f), dwte(wte.size(), 0.0f);
    for (int v0 = 0; v0 < s.V; v0 += rows) {
      const int n = std::min(rows, s.V - v0);
      const std::size_t at = static_cast<std::size_t>(v0) * s.C;
      embedding_forward_block(pool, out.data(), tokens.data(), wte.data() + at, v0, n, s.B, s.T, s.C, scale);
      embedding_forward_block_bf16(pool, out16.data(), tokens.data(), h.data() + at, v0, n, s.B, s.T, s.C, scale);
      embedding_backward_block(pool, dwte.data() + at, dout.data(), tokens.data(), v0, n, s.B, s.T, s.C, scale);
    }
    std::vector<float> want_dwte(wte.size(), 0.0f);
    for (std::size_t r = 0; r < s.rows(); ++r)
      for (int c = 0; c < s.C; ++c) {
        const std::size_t row = static_cast<std::size_t>(tokens[r]) * s.C + c;
        ASSERT_EQ(out[r * s.C + c], wte[row] * scale) << rows << "-row blocks";
        ASSERT_EQ(out16[r * s.C + c], wide[row] * scale) << rows << "-row blocks";
        want_dwte[row] += dout[r * s.C + c] * scale;
      }
    EXPECT_EQ(dwte, want_dwte) << rows << "-row blocks";
  }
}

}  // namespace
}  // namespace stratum
