// Cross-backend tests of the CUDA row ops: layernorm, rmsnorm, softmax cross-entropy over vocabulary
// blocks, softmax_row and the embeddings (src/kernels/cuda/{layernorm,rmsnorm,softmax_xent,
// embedding}.cu), each against the CPU backend (the reference, Note [ops seam]) on the same random
// inputs, with odd shapes, both accumulate modes, null optional outputs and in-place calls; plus
// run-to-run bit identity (Note [cuda determinism] in src/kernels/cuda/cuda_ops.h). Outputs an op
// must overwrite start as NaN on the device. Skipped where this build or machine has no CUDA.
// Tolerances (scaled error |got - ref| / (1 + |ref|)):
//  - norms and softmax-xent: 1e-5. The GPU sums rows by a block tree, the CPU by SIMD lanes, and
//    the GPU's expf is not the CPU's polynomial exp: a few ulp per term, summed over <= 1000 terms
//    (about 1e-6 expected). The column sums dw/db run over rows in order on both, so they are
//    close to bit-exact given the same mean/rstd (both backward passes get the CPU's).
//  - maxima and target logits: 0 (exact selections).
//  - embeddings: 0. The forward is one float add per element and the backward adds each output
//    element's terms in the CPU's order (positions, batch rows increasing), so the bits are equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cross_backend_util.h"
#include "test_util.h"

namespace stratum {
namespace {

using test::CrossBackend;
using test::DeviceVec;
using test::expect_close;
using test::expect_same_bits;
using test::TestRng;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kTol = 1e-5;

template <class T>
DeviceVec<T> up(const std::vector<T>& host) {
  return CrossBackend::up(host);
}
DeviceVec<float> nans(std::size_t n) { return CrossBackend::filled<float>(n, kNaN); }
std::vector<float> down(const DeviceVec<float>& v) { return CrossBackend::down(v); }

std::string shape_tag(const char* op, int N, int C) {
  return std::string(op) + " N=" + std::to_string(N) + " C=" + std::to_string(C);
}

// ---- layernorm ---------------------------------------------------------------------------------

TEST(CudaLayernorm, ForwardAndBackwardMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(101);
  const float eps = 1e-5f;
  for (int N : {1, 7, 130, 600}) {  // 600: three steps of the column-sum staging (row_reduce.cuh)
    for (int C : {3, 768, 1000}) {
      const std::string tag = shape_tag("layernorm", N, C);
      const std::size_t NC = static_cast<std::size_t>(N) * C;
      const std::vector<float> inp = rng.normal_f32(NC, 2.0, 0.5);  // an offset: the mean matters
      const std::vector<float> w = rng.normal_f32(C, 0.5, 1.0);
      const std::vector<float> b = rng.normal_f32(C, 0.5);
      std::vector<float> out(NC), mean(N), rstd(N);
      xb.cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C, eps);
      const auto d_inp = up(inp), d_w = up(w), d_b = up(b);
      const auto d_out = nans(NC), d_mean = nans(N), d_rstd = nans(N);
      xb.gpu().layernorm_forward(d_out.d(), d_mean.d(), d_rstd.d(), d_inp.d(), d_w.d(), d_b.d(), N, C, eps);
      expect_close(down(d_out), out, kTol, tag + " out");
      expect_close(down(d_mean), mean, kTol, tag + " mean");
      expect_close(down(d_rstd), rstd, kTol, tag + " rstd");

      // Backward with the CPU's statistics on both sides.
      const std::vector<float> dout = rng.normal_f32(NC);
      const auto d_dout = up(dout), d_cmean = up(mean), d_crstd = up(rstd);
      for (bool frozen : {false, true}) {
        for (bool accumulate : {false, true}) {
          if (frozen && accumulate) continue;  // no parameter gradients either way
          const std::string btag = tag + (frozen ? " frozen" : accumulate ? " accumulate" : " overwrite");
          const std::vector<float> dinp0 = rng.normal_f32(NC);  // dinp always accumulates
          const std::vector<float> dw0 = accumulate ? rng.normal_f32(C) : std::vector<float>(C, kNaN);
          const std::vector<float> db0 = accumulate ? rng.normal_f32(C) : std::vector<float>(C, kNaN);
          std::vector<float> dinp = dinp0, dw = dw0, db = db0;
          xb.cpu().layernorm_backward(dinp.data(), frozen ? nullptr : dw.data(), frozen ? nullptr : db.data(),
                                      dout.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C, accumulate);
          const auto g_dinp = up(dinp0), g_dw = up(dw0), g_db = up(db0);
          xb.gpu().layernorm_backward(g_dinp.d(), frozen ? nullptr : g_dw.d(), frozen ? nullptr : g_db.d(),
                                      d_dout.d(), d_inp.d(), d_w.d(), d_cmean.d(), d_crstd.d(), N, C, accumulate);
          expect_close(down(g_dinp), dinp, kTol, btag + " dinp");
          if (frozen) {
            expect_same_bits(down(g_dw), dw0, btag + " dw untouched");
          } else {
            expect_close(down(g_dw), dw, kTol, btag + " dw");
            expect_close(down(g_db), db, kTol, btag + " db");
          }
        }
      }
    }
  }
}

TEST(CudaLayernorm, BackwardIsBitReproducible) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(102);
  const int N = 600, C = 1000;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  const auto inp = up(rng.normal_f32(NC, 1.5, 0.2)), w = up(rng.normal_f32(C, 0.5, 1.0));
  const auto b = up(rng.normal_f32(C)), dout = up(rng.normal_f32(NC));
  const auto out = nans(NC), mean = nans(N), rstd = nans(N);
  xb.gpu().layernorm_forward(out.d(), mean.d(), rstd.d(), inp.d(), w.d(), b.d(), N, C, 1e-5f);
  const std::vector<float> dinp0 = rng.normal_f32(NC), dw0 = rng.normal_f32(C), db0 = rng.normal_f32(C);
  for (bool accumulate : {false, true}) {
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      const auto dinp = up(dinp0), dw = up(dw0), db = up(db0);
      xb.gpu().layernorm_backward(dinp.d(), dw.d(), db.d(), dout.d(), inp.d(), w.d(), mean.d(), rstd.d(), N, C,
                                  accumulate);
      std::vector<float> all = down(dinp), part = down(dw);
      all.insert(all.end(), part.begin(), part.end());
      part = down(db);
      all.insert(all.end(), part.begin(), part.end());
      if (run == 0)
        first = std::move(all);
      else
        expect_same_bits(all, first, std::string("layernorm_backward rerun") + (accumulate ? " accumulate" : ""));
    }
  }
}

// ---- rmsnorm -----------------------------------------------------------------------------------

TEST(CudaRmsnorm, ForwardAndBackwardMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(201);
  const float eps = 1e-6f;
  for (int N : {1, 7, 130, 600}) {  // 600: three steps of the column-sum staging (row_reduce.cuh)
    for (int C : {3, 768, 1000}) {
      const std::string tag = shape_tag("rmsnorm", N, C);
      const std::size_t NC = static_cast<std::size_t>(N) * C;
      const std::vector<float> inp = rng.normal_f32(NC, 2.0, 0.3);
      const std::vector<float> w = rng.normal_f32(C, 0.5, 1.0);
      std::vector<float> out(NC), rstd(N);
      xb.cpu().rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
      const auto d_inp = up(inp), d_w = up(w);
      const auto d_out = nans(NC), d_rstd = nans(N);
      xb.gpu().rmsnorm_forward(d_out.d(), d_rstd.d(), d_inp.d(), d_w.d(), N, C, eps);
      expect_close(down(d_out), out, kTol, tag + " out");
      expect_close(down(d_rstd), rstd, kTol, tag + " rstd");

      const std::vector<float> dout = rng.normal_f32(NC);
      const auto d_dout = up(dout), d_crstd = up(rstd);
      for (bool frozen : {false, true}) {
        for (bool accumulate : {false, true}) {
          if (frozen && accumulate) continue;
          const std::string btag = tag + (frozen ? " frozen" : accumulate ? " accumulate" : " overwrite");
          const std::vector<float> dinp0 = rng.normal_f32(NC);
          const std::vector<float> dw0 = accumulate ? rng.normal_f32(C) : std::vector<float>(C, kNaN);
          std::vector<float> dinp = dinp0, dw = dw0;
          xb.cpu().rmsnorm_backward(dinp.data(), frozen ? nullptr : dw.data(), dout.data(), inp.data(), w.data(),
                                    rstd.data(), N, C, accumulate);
          const auto g_dinp = up(dinp0), g_dw = up(dw0);
          xb.gpu().rmsnorm_backward(g_dinp.d(), frozen ? nullptr : g_dw.d(), d_dout.d(), d_inp.d(), d_w.d(),
                                    d_crstd.d(), N, C, accumulate);
          expect_close(down(g_dinp), dinp, kTol, btag + " dinp");
          if (frozen)
            expect_same_bits(down(g_dw), dw0, btag + " dw untouched");
          else
            expect_close(down(g_dw), dw, kTol, btag + " dw");
        }
      }
    }
  }
}

// ---- softmax cross-entropy ---------------------------------------------------------------------

// Logits (N, V) held as vocabulary chunks (N, n_k), targets anywhere in [0, V): the forward folds
// the chunks in order, lse = max + log(sum) is formed on the host from the CPU's state, and the
// backward of each chunk is compared (out of place, and in place on the GPU).
void check_xent_chunks(const CrossBackend& xb, TestRng& rng, int N, const std::vector<int>& chunk_sizes) {
  int V = 0;
  for (int n : chunk_sizes) V += n;
  const std::string tag = "xent N=" + std::to_string(N) + " V=" + std::to_string(V);
  std::vector<std::vector<float>> chunks;
  for (std::size_t k = 0; k < chunk_sizes.size(); ++k) {
    std::vector<float> x = rng.normal_f32(static_cast<std::size_t>(N) * chunk_sizes[k], 3.0);
    // Odd rows: the later chunk holds the larger logits, so the running max grows and the sum is
    // rescaled; even rows: the first chunk does.
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < chunk_sizes[k]; ++i)
        x[static_cast<std::size_t>(r) * chunk_sizes[k] + i] += (r % 2 == 1) == (k > 0) ? 4.0f : 0.0f;
    chunks.push_back(std::move(x));
  }
  std::vector<std::int32_t> targets(N);
  for (int r = 0; r < N; ++r) targets[r] = rng.below(V);
  targets[0] = V - 1;         // in the last chunk
  if (N > 1) targets[1] = 0;  // in the first chunk
  if (N > 2 && chunk_sizes.size() > 1) targets[2] = chunk_sizes.front();  // the second chunk's first column
  const auto d_targets = up(targets);

  std::vector<float> run_max(N, kNaN), run_sum(N, 0.0f), target_logit(N, kNaN);
  const auto g_max = nans(N), g_sum = CrossBackend::filled<float>(N, 0.0f), g_tl = nans(N);
  std::vector<DeviceVec<float>> d_chunks;
  int v0 = 0;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    xb.cpu().xent_chunk_forward(run_max.data(), run_sum.data(), target_logit.data(), chunks[k].data(),
                                targets.data(), N, chunk_sizes[k], v0);
    d_chunks.push_back(up(chunks[k]));
    xb.gpu().xent_chunk_forward(g_max.d(), g_sum.d(), g_tl.d(), d_chunks[k].d(), d_targets.d(), N, chunk_sizes[k],
                                v0);
    v0 += chunk_sizes[k];
  }
  expect_close(down(g_max), run_max, 0.0, tag + " run_max");
  expect_close(down(g_sum), run_sum, kTol, tag + " run_sum");
  expect_close(down(g_tl), target_logit, 0.0, tag + " target_logit");

  std::vector<float> lse(N);
  for (int r = 0; r < N; ++r) lse[r] = run_max[r] + std::log(run_sum[r]);
  const auto d_lse = up(lse);
  const float dloss = 1.0f / static_cast<float>(N) * 1.3f;
  v0 = 0;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const int n = chunk_sizes[k];
    const std::string ctag = tag + " chunk " + std::to_string(k) + " dlogits";
    std::vector<float> dlogits(static_cast<std::size_t>(N) * n);
    xb.cpu().xent_chunk_backward(dlogits.data(), chunks[k].data(), lse.data(), targets.data(), N, n, v0, dloss, 0.0f);
    const auto g_d = nans(dlogits.size());
    xb.gpu().xent_chunk_backward(g_d.d(), d_chunks[k].d(), d_lse.d(), d_targets.d(), N, n, v0, dloss, 0.0f);
    const std::vector<float> got = down(g_d);
    expect_close(got, dlogits, kTol, ctag);
    // In place: dlogits aliases logits.
    xb.gpu().xent_chunk_backward(d_chunks[k].d(), d_chunks[k].d(), d_lse.d(), d_targets.d(), N, n, v0, dloss, 0.0f);
    expect_same_bits(down(d_chunks[k]), got, ctag + " in place");
    v0 += n;
  }
}

TEST(CudaSoftmaxXent, TwoVocabChunksMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(301);
  for (int N : {1, 7, 130}) check_xent_chunks(xb, rng, N, {613, 387});
  check_xent_chunks(xb, rng, 7, {3, 1000});       // a chunk narrower than a warp
  check_xent_chunks(xb, rng, 7, {25000, 25257});  // GPT-2's vocabulary in two blocks
  check_xent_chunks(xb, rng, 130, {1000});        // one chunk: the whole vocabulary
}

TEST(CudaSoftmaxXent, SoftmaxRowMatchesCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(302);
  const float temperature = 0.7f;
  for (int V : {1, 7, 1000, 150000}) {
    const std::string tag = "softmax_row V=" + std::to_string(V);
    const std::vector<float> logits = rng.normal_f32(V, 4.0, 1.0);
    std::vector<float> probs(V);
    xb.cpu().softmax_row(probs.data(), logits.data(), V, temperature);
    const auto d_logits = up(logits);
    const auto d_probs = nans(V);
    xb.gpu().softmax_row(d_probs.d(), d_logits.d(), V, temperature);
    const std::vector<float> got = down(d_probs);
    expect_close(got, probs, kTol, tag);
    double total = 0.0;
    for (float p : got) total += p;
    EXPECT_NEAR(total, 1.0, 1e-4) << tag;
    xb.gpu().softmax_row(d_logits.d(), d_logits.d(), V, temperature);  // in place
    expect_same_bits(down(d_logits), got, tag + " in place");
  }
}

// ---- embeddings --------------------------------------------------------------------------------

struct EmbCase {
  int B, T, C, V;
  std::size_t rows() const { return static_cast<std::size_t>(B) * T; }
};

// Tokens in [0, V + 3) (those >= V lie in no block), half of them from a few values near the
// block boundary (repeats within and across sequences), plus fixed ones at the boundaries.
std::vector<std::int32_t> emb_tokens(TestRng& rng, const EmbCase& s, int boundary) {
  std::vector<std::int32_t> tokens(s.rows());
  for (auto& t : tokens) {
    t = rng.below(2) == 0 ? boundary - 3 + rng.below(8) : rng.below(s.V + 3);  // some >= V: in no block
    if (t < 0) t = 0;
  }
  tokens[0] = boundary;  // the first row of the second block
  if (tokens.size() < 6) return tokens;
  tokens[1] = tokens[s.rows() - 1] = boundary;
  tokens[2] = tokens[3] = boundary - 1;  // the last row of the first block
  tokens[4] = s.V - 1;
  tokens[5] = 0;
  return tokens;
}

TEST(CudaEmbedding, ForwardAndBackwardMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(401);
  // Blocks [0, boundary) and [boundary, V); the 1200-position case spans two token tiles of the
  // backward kernel and a block wider than its 128 row slices.
  for (const EmbCase s : {EmbCase{3, 7, 3, 300}, EmbCase{3, 7, 768, 300}, EmbCase{3, 7, 1000, 300},
                          EmbCase{4, 300, 768, 400}, EmbCase{1, 1, 5, 2}}) {
    const std::string tag = "embedding B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                            " C=" + std::to_string(s.C) + " V=" + std::to_string(s.V);
    const int boundary = s.V / 2 - 9 > 1 ? s.V / 2 - 9 : 1;
    const int blocks[2][2] = {{0, boundary}, {boundary, s.V - boundary}};  // {v0, n}
    const std::size_t BTC = s.rows() * s.C;
    const std::vector<std::int32_t> tokens = emb_tokens(rng, s, boundary);
    const std::vector<float> wpe = rng.normal_f32(static_cast<std::size_t>(s.T) * s.C);
    const std::vector<float> wte = rng.normal_f32(static_cast<std::size_t>(s.V) * s.C);
    const std::vector<std::uint16_t> wte_bf16 = test::bf16_truncate(wte, 7);
    const auto d_tokens = up(tokens);
    const auto d_wpe = up(wpe), d_wte = up(wte);
    const auto d_wte_bf16 = up(wte_bf16);

    // Forward: positions, then each block's rows, fp32 and bf16.
    for (bool bf16 : {false, true}) {
      const std::string ftag = tag + (bf16 ? " forward bf16" : " forward");
      std::vector<float> out(BTC);
      const auto g_out = nans(BTC);
      xb.cpu().embedding_forward_positions(out.data(), wpe.data(), s.B, s.T, s.C);
      xb.gpu().embedding_forward_positions(g_out.d(), d_wpe.d(), s.B, s.T, s.C);
      expect_close(down(g_out), out, 0.0, ftag + " positions");
      for (const auto& blk : blocks) {
        const std::size_t off = static_cast<std::size_t>(blk[0]) * s.C;
        if (bf16) {
          xb.cpu().embedding_forward_block_bf16(out.data(), tokens.data(), wte_bf16.data() + off, blk[0], blk[1], s.B,
                                                s.T, s.C, 1.0f);
          xb.gpu().embedding_forward_block_bf16(g_out.d(), d_tokens.d(), d_wte_bf16.d() + off, blk[0], blk[1], s.B,
                                                s.T, s.C, 1.0f);
        } else {
          xb.cpu().embedding_forward_block(out.data(), tokens.data(), wte.data() + off, blk[0], blk[1], s.B, s.T,
                                           s.C, 1.0f);
          xb.gpu().embedding_forward_block(g_out.d(), d_tokens.d(), d_wte.d() + off, blk[0], blk[1], s.B, s.T, s.C, 1.0f);
        }
        expect_close(down(g_out), out, 0.0, ftag + " after block v0=" + std::to_string(blk[0]));
      }
    }

    // Backward: both accumulate into non-zero gradients.
    const std::vector<float> dout = rng.normal_f32(BTC);
    const auto d_dout = up(dout);
    std::vector<float> dwpe = rng.normal_f32(wpe.size());
    const auto g_dwpe = up(dwpe);
    xb.cpu().embedding_backward_positions(dwpe.data(), dout.data(), s.B, s.T, s.C);
    xb.gpu().embedding_backward_positions(g_dwpe.d(), d_dout.d(), s.B, s.T, s.C);
    expect_close(down(g_dwpe), dwpe, 0.0, tag + " dwpe");
    for (const auto& blk : blocks) {
      std::vector<float> dwte = rng.normal_f32(static_cast<std::size_t>(blk[1]) * s.C);
      const auto g_dwte = up(dwte);
      xb.cpu().embedding_backward_block(dwte.data(), dout.data(), tokens.data(), blk[0], blk[1], s.B, s.T, s.C, 1.0f);
      xb.gpu().embedding_backward_block(g_dwte.d(), d_dout.d(), d_tokens.d(), blk[0], blk[1], s.B, s.T, s.C, 1.0f);
      expect_close(down(g_dwte), dwte, 0.0, tag + " dwte block v0=" + std::to_string(blk[0]));
    }
  }
}

TEST(CudaEmbedding, BackwardBlockIsBitReproducible) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend xb;
  TestRng rng(402);
  const EmbCase s{4, 300, 768, 400};
  const int v0 = 50, n = 300;
  const std::vector<std::int32_t> tokens = emb_tokens(rng, s, 191);
  const auto d_tokens = up(tokens);
  const auto d_dout = up(rng.normal_f32(s.rows() * s.C));
  const std::vector<float> dwte0 = rng.normal_f32(static_cast<std::size_t>(n) * s.C);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    const auto dwte = up(dwte0);
    xb.gpu().embedding_backward_block(dwte.d(), d_dout.d(), d_tokens.d(), v0, n, s.B, s.T, s.C, 1.0f);
    if (run == 0)
      first = down(dwte);
    else
      expect_same_bits(down(dwte), first, "embedding_backward_block rerun");
  }
}

}  // namespace
}  // namespace stratum
