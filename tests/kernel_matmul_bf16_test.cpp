// Tests for src/kernels/cpu/matmul_bf16 (Note [bf16 products]): f32_to_bf16's rounding (ties to
// even, NaN, overflow); sgemm_bf16 against a float64 product of the bf16-rounded operands for
// every transpose, leading dimensions wider than the matrix, alpha and beta; run-to-run bits;
// that the operands really are rounded (the result differs from fp32 sgemm); a bf16 weight
// given as it is gives the bits of its widening, also widened in panels (sgemm_w); operands rounded
// once and multiplied several times (Note [rounded operands], Note [bf16 backward operands]), also
// in the LM head, give the bits of rounding them in every product.
#include "kernels/cpu/matmul_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul.h"
#include "model/block_policy.h"
#include "model/gpt2_head.h"
#include "model/param_layout.h"
#include "core/tensor_view.h"

namespace stratum {
namespace {

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // halfway, to the even 1.0
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // halfway, to the even 1.015625
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway: up
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // beyond bf16's range: inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  const float tiny_nan = std::bit_cast<float>(0x7f800001u);  // payload only in the low bits
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(tiny_nan))));
}

float rounded(float x) { return bf16_to_f32(f32_to_bf16(x)); }

TEST(MatmulBf16, EqualsTheProductOfRoundedOperandsSummedInFp32) {
  ThreadPool pool(2);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int M = 37, N = 29, K = 301, pad = 5;
  for (int trans_a = 0; trans_a < 2; ++trans_a)
    for (int trans_b = 0; trans_b < 2; ++trans_b)
      for (const float alpha : {1.0f, 0.5f})
        for (const float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(testing::Message() << "trans_a " << trans_a << " trans_b " << trans_b << " alpha " << alpha
                                          << " beta " << beta);
          const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
          const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
          const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
          std::vector<float> A(static_cast<std::size_t>(a_rows) * lda), B(static_cast<std::size_t>(b_rows) * ldb);
          std::vector<float> C(static_cast<std::size_t>(M) * ldc);
          for (float& x : A) x = dist(rng);
          for (float& x : B) x = dist(rng);
          for (float& x : C) x = dist(rng);
          const std::vector<float> C0 = C;
          sgemm_bf16(pool, trans_a, trans_b, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          const auto a = [&](int m, int k) { return rounded(trans_a ? A[k * lda + m] : A[m * lda + k]); };
          const auto b = [&](int k, int n) { return rounded(trans_b ? B[n * ldb + k] : B[k * ldb + n]); };
          for (int m = 0; m < M; ++m) {
            for (int n = 0; n < N; ++n) {
              double exact = 0, magnitude = 0;
              for (int k = 0; k < K; ++k) {
                exact += static_cast<double>(a(m, k)) * b(k, n);
                magnitude += std::fabs(static_cast<double>(a(m, k)) * b(k, n));
              }
              const double want = alpha * exact + beta * C0[m * ldc + n];
              // fp32 accumulation over K terms: at most K units of rounding of the magnitude.
              const double tol = K * 0x1p-24 * (std::fabs(alpha) * magnitude + std::fabs(beta * C0[m * ldc + n])) + 1e-6;
              ASSERT_NEAR(C[m * ldc + n], want, tol) << "m " << m << " n " << n;
            }
            for (int n = N; n < ldc; ++n) ASSERT_EQ(C[m * ldc + n], C0[m * ldc + n]) << "padding was written";
          }
        }
}

TEST(MatmulBf16, SameBitsEveryRunAndOperandsAreRounded) {
  ThreadPool pool(2);
  const int M = 64, N = 96, K = 128;
  std::vector<float> A(M * K), B(K * N);
  for (int i = 0; i < M * K; ++i) A[i] = std::sin(0.37f * i) * 1.001f;
  for (int i = 0; i < K * N; ++i) B[i] = std::cos(0.11f * i) * 0.999f;
  std::vector<float> C1(M * N), C2(M * N), F(M * N);
  sgemm_bf16(pool, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C1.data(), N);
  sgemm_bf16(pool, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C2.data(), N);
  EXPECT_EQ(std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)), 0);
  sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, F.data(), N);
  double differ = 0;
  for (int i = 0; i < M * N; ++i) differ += C1[i] != F[i];
  EXPECT_GT(differ, M * N / 2) << "bf16 operands must give other results than fp32 ones";
}

// sgemm_bf16_b16 (a weight kept bf16, Note [frozen bf16 base]) gives the bits of sgemm_bf16 on
// the weight's fp32 widening, for both transposes of B, alpha and beta; and CpuOps::sgemm_b16 in
// fp32 the bits of sgemm on the widening.
TEST(MatmulBf16, Bf16WeightGivesTheBitsOfItsWidening) {
  ThreadPool pool(2);
  const int M = 48, N = 80, K = 112;
  std::vector<float> A(M * K), C0(M * N);
  for (int i = 0; i < M * K; ++i) A[i] = std::sin(0.37f * i) * 1.001f;
  for (int i = 0; i < M * N; ++i) C0[i] = std::cos(0.05f * i);
  std::vector<std::uint16_t> B16(K * N);
  std::vector<float> Bw(K * N);
  for (int i = 0; i < K * N; ++i) {
    B16[i] = f32_to_bf16(std::cos(0.11f * i) * 0.999f);
    Bw[i] = bf16_to_f32(B16[i]);
  }
  for (bool trans_b : {false, true}) {
    const int ldb = trans_b ? K : N;
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want = C0, got = C0;
      if (bf16_onednn()) {
        sgemm_bf16(pool, false, trans_b, M, N, K, 0.5f, A.data(), K, Bw.data(), ldb, beta, want.data(), N);
        sgemm_bf16_b16(pool, false, trans_b, M, N, K, 0.5f, A.data(), K, B16.data(), ldb, beta, got.data(), N);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << trans_b << " " << beta;
      }
      for (Precision precision : {Precision::Fp32, Precision::Bf16}) {
        std::vector<float> w2 = C0, g2 = C0, scratch(K * N);
        const CpuOps ops(pool, precision);
        ops.sgemm(false, trans_b, M, N, K, 0.5f, A.data(), K, Bw.data(), ldb, beta, w2.data(), N);
        ops.sgemm_b16(false, trans_b, M, N, K, 0.5f, A.data(), K, B16.data(), ldb, beta, g2.data(), N,
                      scratch.data());
        EXPECT_EQ(std::memcmp(w2.data(), g2.data(), w2.size() * sizeof(float)), 0)
            << precision_name(precision) << " " << trans_b << " " << beta;
      }
    }
  }
}

// Note [rounded operands]: op(A) and op(B) rounded once by bf16_round (from sources with leading
// dimensions wider than the matrix) give sgemm's bits through sgemm_rounded, for every transpose,
// alpha and beta; an fp32 CpuOps has no rounded operands and says so.
TEST(MatmulBf16, RoundedOperandsGiveTheBitsOfSgemm) {
  ThreadPool pool(2);
  const CpuOps fp32(pool, Precision::Fp32), ops(pool, Precision::Bf16);
  EXPECT_FALSE(fp32.bf16_rounded());
  std::uint16_t one = 0;
  const float x = 1.0f;
  EXPECT_THROW(fp32.bf16_round(&one, &x, 1, 1, 1), BugError);
  EXPECT_EQ(ops.bf16_rounded(), bf16_onednn());
  if (!ops.bf16_rounded()) GTEST_SKIP() << "oneDNN has no bf16 products on this CPU";
  const int M = 40, N = 72, K = 96, pad = 5;
  std::vector<float> src(static_cast<std::size_t>(K + pad) * (K + pad) * 2), C0(M * N);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.31f * i) * 1.0007f;
  for (int i = 0; i < M * N; ++i) C0[i] = std::cos(0.07f * i);
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        // op(A) stored (M, K) or (K, M), op(B) (K, N) or (N, K), each with 5 columns of padding
        const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
        const float* A = src.data();
        const float* B = src.data() + src.size() / 2;
        std::vector<float> want = C0, got = C0;
        ops.sgemm(trans_a, trans_b, M, N, K, 0.75f, A, a_cols + pad, B, b_cols + pad, beta, want.data(), N);
        std::vector<std::uint16_t> a16(static_cast<std::size_t>(M) * K), b16(static_cast<std::size_t>(K) * N);
        ops.bf16_round(a16.data(), A, a_rows, a_cols, a_cols + pad);
        ops.bf16_round(b16.data(), B, b_rows, b_cols, b_cols + pad);
        for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(a16[i], f32_to_bf16(A[i]));
        ops.sgemm_rounded(trans_a, trans_b, M, N, K, 0.75f, a16.data(), b16.data(), beta, got.data(), N);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << trans_a << trans_b << " beta " << beta;
      }
}

// Note [bf16 backward operands]: a linear layer's bf16 backward, rounding the output gradient once,
// gives the bits of its two products rounded separately, with and without accumulation and bias.
TEST(MatmulBf16, BackwardRoundingTheGradientOnceGivesTheBitsOfTwoProducts) {
  if (!bf16_onednn()) GTEST_SKIP() << "oneDNN has no bf16 products on this CPU";
  ThreadPool pool(2);
  const int M = 64, K = 48, N = 80;
  std::vector<float> dout(M * N), inp(M * K), w(K * N), dw0(K * N), db0(N);
  for (int i = 0; i < M * N; ++i) dout[i] = std::sin(0.13f * i);
  for (int i = 0; i < M * K; ++i) inp[i] = std::cos(0.17f * i) * 1.0003f;
  for (int i = 0; i < K * N; ++i) w[i] = std::sin(0.019f * i + 1.0f);
  for (int i = 0; i < K * N; ++i) dw0[i] = std::cos(0.029f * i);
  for (int i = 0; i < N; ++i) db0[i] = 0.5f * i;
  for (bool accumulate : {false, true}) {
    std::vector<float> dinp_want(M * K), dinp_got(M * K), dw_want = dw0, dw_got = dw0, db_want = db0, db_got = db0;
    sgemm_bf16(pool, false, true, M, K, N, 1.0f, dout.data(), N, w.data(), N, 0.0f, dinp_want.data(), K);
    sgemm_bf16(pool, true, false, K, N, M, 1.0f, inp.data(), K, dout.data(), N, accumulate ? 1.0f : 0.0f,
               dw_want.data(), N);
    matmul_backward(pool, Precision::Fp32, nullptr, nullptr, db_want.data(), dout.data(), inp.data(), w.data(), M, K, N,
                    accumulate);  // the bias: fp32 in both
    matmul_backward(pool, Precision::Bf16, dinp_got.data(), dw_got.data(), db_got.data(), dout.data(), inp.data(),
                    w.data(), M, K, N, accumulate);
    EXPECT_EQ(std::memcmp(dinp_want.data(), dinp_got.data(), dinp_want.size() * sizeof(float)), 0) << accumulate;
    EXPECT_EQ(std::memcmp(dw_want.data(), dw_got.data(), dw_want.size() * sizeof(float)), 0) << accumulate;
    EXPECT_EQ(std::memcmp(db_want.data(), db_got.data(), db_want.size() * sizeof(float)), 0) << accumulate;
  }
}

// Note [rounded operands] in the LM head: a bf16 head that rounds its normed input once, each
// block's rows once per pass and each chunk's logit gradients once gives the bits of one that
// rounds them in every product (its rounded buffers nulled), with logits kept or recomputed.
TEST(MatmulBf16, TheHeadsRoundedOperandsGiveTheBitsOfRoundingInEveryProduct) {
  if (!bf16_onednn()) GTEST_SKIP() << "oneDNN has no bf16 products on this CPU";
  ThreadPool pool(2);
  const CpuOps ops(pool, Precision::Bf16);
  GptConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.n_ctx = 64;
  cfg.vocab_size = 3000;
  const int BT = 1100, C = cfg.n_embd, n = vocab_block_rows(cfg), V = cfg.vocab_size;  // 2 row chunks of 1024
  std::vector<float> x(static_cast<std::size_t>(BT) * C), wte(static_cast<std::size_t>(V) * C), lnf_w(C, 1.1f),
      lnf_b(C, 0.05f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.011f * i) + 0.1f * std::cos(0.7f * i);
  for (std::size_t i = 0; i < wte.size(); ++i) wte[i] = 0.02f * std::sin(0.0031f * i + 0.3f);
  std::vector<std::int32_t> targets(BT);
  for (int i = 0; i < BT; ++i) targets[i] = (i * 37) % V;
  for (bool keep : {false, true}) {
    std::vector<float> dwte[2], dx[2];
    float loss[2];
    for (int r = 0; r < 2; ++r) {
      Gpt2HeadScratch s(ops, cfg, BT, Precision::Bf16, keep);
      ASSERT_NE(s.lnf16, nullptr);
      if (r == 0) s.lnf16 = s.w16 = s.d16 = nullptr;  // every product rounds its own operands
      gpt2_head_begin(ops, cfg, lnf_w.data(), lnf_b.data(), x.data(), BT, s);
      for (int v0 = 0; v0 < V; v0 += n)
        gpt2_head_lse_block(ops, cfg, wte.data() + static_cast<std::size_t>(v0) * C, v0, std::min(n, V - v0),
                            targets.data(), BT, s);
      loss[r] = gpt2_head_loss_finish(ops, targets.data(), BT, s);
      dwte[r].assign(wte.size(), 0.0f);
      for (int v0 = 0; v0 < V; v0 += n)
        gpt2_head_backward_block(ops, cfg, wte.data() + static_cast<std::size_t>(v0) * C,
                                 dwte[r].data() + static_cast<std::size_t>(v0) * C, v0, std::min(n, V - v0),
                                 targets.data(), BT, v0 == 0, s, BT);
      std::vector<float> dlnf_w(C), dlnf_b(C);
      dx[r].assign(x.size(), 0.0f);
      gpt2_head_backward_finish(ops, cfg, lnf_w.data(), x.data(), dx[r].data(), dlnf_w.data(), dlnf_b.data(), BT, s);
    }
    EXPECT_EQ(std::memcmp(&loss[0], &loss[1], sizeof(float)), 0) << keep;
    EXPECT_EQ(std::memcmp(dwte[0].data(), dwte[1].data(), dwte[0].size() * sizeof(float)), 0) << keep;
    EXPECT_EQ(std::memcmp(dx[0].data(), dx[1].data(), dx[0].size() * sizeof(float)), 0) << keep;
  }
}

// Note [widened in panels]: sgemm_w widens a bf16 weight panel by panel into a scratch smaller than
// the matrix and gives the bits of one sgemm on the whole widening: both transposes, beta 0 and 1,
// a last panel narrower than the others, widths not a multiple of 64, a few rows, and the ~1.1B
// Llama's MLP shapes at its row chunk (1024 rows) with the real scratch (kWidenPanelFloats).
TEST(MatmulBf16, PanelsGiveTheBitsOfOneWidening) {
  ThreadPool pool(2);
  struct Shape {
    int M, N, K;
    std::size_t scratch;
  };
  const Shape shapes[] = {{16, 1000, 512, 512 * 300},    {3, 1300, 4096, 4096 * 500},
                          {1, 2048, 5632, kWidenPanelFloats}, {1024, 5632, 2048, kWidenPanelFloats},
                          {1024, 2048, 5632, kWidenPanelFloats}};
  for (const Shape& sh : shapes) {
    const int M = sh.M, N = sh.N, K = sh.K;
    std::vector<float> A(static_cast<std::size_t>(M) * K), C0(static_cast<std::size_t>(M) * N);
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * static_cast<float>(i % 100003)) * 1.001f;
    for (std::size_t i = 0; i < C0.size(); ++i) C0[i] = std::cos(0.05f * static_cast<float>(i % 10007));
    std::vector<std::uint16_t> B16(static_cast<std::size_t>(K) * N);
    std::vector<float> Bw(B16.size());
    for (std::size_t i = 0; i < B16.size(); ++i) {
      B16[i] = f32_to_bf16(std::cos(0.11f * static_cast<float>(i % 100019)) * 0.02f);
      Bw[i] = bf16_to_f32(B16[i]);
    }
    for (Precision precision : {Precision::Fp32, Precision::Bf16}) {
      const CpuOps ops(pool, precision);
      if (!ops.sgemm_b16_widens()) continue;  // oneDNN takes the bf16 weight as it is
      for (bool trans_b : {false, true}) {
        if (M == 1024 && !trans_b && N == 2048) continue;  // one large case per product the block runs
        const int ldb = trans_b ? K : N;
        const TensorView w = TensorView(B16.data(), DType::BF16, B16.size()).matrix(trans_b ? N : K, trans_b ? K : N);
        for (float beta : {0.0f, 1.0f}) {
          if (M == 1024 && beta != 0.0f) continue;
          std::vector<float> want = C0, got = C0, scratch(sh.scratch);
          ops.sgemm(false, trans_b, M, N, K, 0.5f, A.data(), K, Bw.data(), ldb, beta, want.data(), N);
          sgemm_w(ops, false, trans_b, M, N, K, 0.5f, A.data(), K, w, ldb, beta, got.data(), N, scratch.data(),
                  scratch.size());
          EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << precision_name(precision) << " M" << M << " N" << N << " K" << K << " trans_b " << trans_b
              << " beta " << beta;
        }
      }
    }
  }
}

}  // namespace
}  // namespace stratum
