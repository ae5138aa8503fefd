// GEMM library comparison on GPT-2 layer shapes (fp32, row-major): OpenBLAS cblas_sgemm vs
// oneDNN dnnl_sgemm, in the same process. This is the measurement behind Stratum's choice of
// OpenBLAS (docs/benchmarks.md). Built only when libdnnl-dev is installed.
// Usage: OMP_NUM_THREADS=2 ./build/gemm_compare [M]   (M = B*T rows, default 1024)
#include <cblas.h>
#include <dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" char* openblas_get_corename(void);

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 1024;
  const int C = 768;
  const int shapes[][3] = {{M, 3 * C, C}, {M, C, C}, {M, 4 * C, C}, {M, C, 4 * C}, {128, 50257, C}};
  const char* names[] = {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj", "lm_head chunk"};
  std::printf("OpenBLAS core %s; GFLOP/s, best of 3 x 3 reps\n%-14s %6s %6s %6s %9s %9s\n", openblas_get_corename(), "shape", "M",
              "N", "K", "openblas", "onednn");
  for (int s = 0; s < 5; ++s) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    std::vector<float> a(static_cast<std::size_t>(m) * k, 0.01f), b(static_cast<std::size_t>(k) * n, 0.02f),
        c(static_cast<std::size_t>(m) * n);
    double best[2] = {0, 0};
    for (int lib = 0; lib < 2; ++lib) {
      auto run = [&] {
        if (lib == 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
        else
          dnnl_sgemm('N', 'N', m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
      };
      run();
      for (int trial = 0; trial < 3; ++trial) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < 3; ++r) run();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3;
        best[lib] = std::max(best[lib], 2.0 * m * n * k / sec / 1e9);
      }
    }
    std::printf("%-14s %6d %6d %6d %9.1f %9.1f\n", names[s], m, n, k, best[0], best[1]);
  }
  return 0;
}
