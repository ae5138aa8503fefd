// Attention kernel benchmark (issue 16): causal attention forward + backward of one layer at
// T = 256, 1024, 4096 (default shape: GPT-2 small's 12 heads of 64, B = 1), 2 threads. Prints one
// JSON line per T: median ms of the forward and of the backward, the bytes the kernel keeps
// between them, and the ratio of the measured time to the time the kernel's GEMM-shaped
// products (2 in the forward, 5 in the backward, causal halves: 7 * 2 * T(T+1)/2 * hd * H * B
// FLOPs) take at the sgemm rate measured on this machine in the same run.
//   attention_bench [--threads N] [--heads H] [--kv-heads KV] [--head-dim hd] [--batch B]
//                   [--seq T,T,...] [--reps R] [--row-chunk R] [--window W] [--softcap S]
// --window: a sliding window of W keys (Note [sliding window]; default 0, none); the FLOPs then
// count the (query, key) pairs inside the window instead of the causal half. --softcap: Gemma 2's
// soft-capping of the scores at S (Note [softcapping]; default 0, none).
// --row-chunk: the query rows per call, in increasing order, as the blocks call it (Note [attention
// row ranges]; default the blocks' kRowChunk, 0: every row in one call).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/block_policy.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "stratum/error.h"
#include "bench_util.h"

namespace {

using stratum::bench::Clock;
using stratum::bench::median;
using stratum::bench::seconds_since;

// Best sgemm GFLOP/s over products of the sizes attention's blocks would use.
double measure_sgemm_gflops() { return stratum::bench::sgemm_gflops({{1024, 1024, 64}, {1024, 64, 1024}, {1024, 1024, 1024}}); }

int run(int argc, char** argv) {
  stratum::blas_prepare_process(argv);
  int threads = 2, H = 12, KV = -1, hd = 64, B = 1, reps = 5, row_chunk = stratum::kRowChunk, window = 0;
  float softcap = 0.0f;
  std::vector<int> seqs = {256, 1024, 4096};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      STRATUM_CHECK(i + 1 < argc, "attention_bench: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--heads") H = std::atoi(next());
    else if (a == "--kv-heads") KV = std::atoi(next());
    else if (a == "--head-dim") hd = std::atoi(next());
    else if (a == "--batch") B = std::atoi(next());
    else if (a == "--seq") seqs = stratum::bench::parse_int_list(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--row-chunk") row_chunk = std::atoi(next());
    else if (a == "--window") window = std::atoi(next());
    else if (a == "--softcap") softcap = static_cast<float>(std::atof(next()));
    else STRATUM_FAIL("attention_bench: unknown argument ", a);
  }
  if (KV < 0) KV = H;
  const stratum::AttentionScores scores{window, softcap};
  stratum::blas_set_threads(threads);
  stratum::ThreadPool pool(threads);
  // The sgemm rate is measured after the kernel: OpenBLAS's threads spin for a while after a
  // product and would take the cores from the first timings.
  struct Row { int T; double f, b; std::size_t kept, scratch; };
  std::vector<Row> rows;
  bool warm = false;
  for (int T : seqs) {
    const std::size_t BT = static_cast<std::size_t>(B) * T, W = static_cast<std::size_t>(H + 2 * KV) * hd;
    const std::size_t stats_floats = static_cast<std::size_t>(B) * H * T * 2;
    std::vector<float> qkv(BT * W), out(BT * H * hd), dout(BT * H * hd), dqkv(BT * W), stats(stats_floats);
    std::vector<float> scratch(stratum::attention_scratch_floats(B, T, H, KV, hd, threads));
    stratum::Rng rng(7);
    for (auto& v : qkv) v = static_cast<float>(rng.normal());
    for (auto& v : dout) v = static_cast<float>(rng.normal());
    const int BTi = B * T, R = row_chunk > 0 ? row_chunk : BTi;
    const std::size_t row = static_cast<std::size_t>(H) * hd;
    auto forward = [&] {
      for (int r0 = 0; r0 < BTi; r0 += R)
        stratum::attention_forward(pool, out.data() + r0 * row, stats.data(), scratch.data(), qkv.data(), B, T, H, KV,
                                   hd, r0, std::min(R, BTi - r0), scores);
    };
    auto backward = [&] {
      for (int r0 = 0; r0 < BTi; r0 += R)
        stratum::attention_backward(pool, dqkv.data(), scratch.data(), dout.data() + r0 * row, qkv.data(), stats.data(),
                                    B, T, H, KV, hd, r0, std::min(R, BTi - r0), scores);
    };
    std::vector<double> fwd, bwd;
    // Warm-up: the first size runs untimed for half a second (the first runs are up to 2x slower:
    // page faults, the pool's first wake-ups, the clock ramping up), later ones once.
    for (const auto t_warm = Clock::now(); !warm && seconds_since(t_warm) < 0.5;) {
      forward();
      backward();
    }
    warm = true;
    for (int r = -1; r < reps; ++r) {  // r = -1: untimed
      auto t0 = Clock::now();
      forward();
      if (r >= 0) fwd.push_back(seconds_since(t0));
      t0 = Clock::now();
      backward();
      if (r >= 0) bwd.push_back(seconds_since(t0));
    }
    rows.push_back({T, median(fwd), median(bwd), stats_floats * sizeof(float), scratch.size() * sizeof(float)});
  }
  const double gflops = measure_sgemm_gflops();
  for (const Row& row : rows) {
    const int T = row.T;
    const double f = row.f, b = row.b;
    double pairs = 0;  // (query, key) pairs attended: the causal half, or those inside the window
    for (int t = 0; t < T; ++t) pairs += window > 0 ? std::min(t + 1, window) : t + 1;
    const double flops = 7.0 * 2.0 * pairs * hd * H * B;
    const double ideal = flops / (gflops * 1e9);
    std::printf("{\"T\": %d, \"window\": %d, \"softcap\": %g, \"row_chunk\": %d, \"B\": %d, \"H\": %d, \"KV\": %d, \"hd\": %d, \"threads\": %d, \"forward_ms\": %.2f, "
                "\"backward_ms\": %.2f, \"kept_bytes\": %zu, \"scratch_bytes\": %zu, \"sgemm_gflops\": %.1f, "
                "\"vs_sgemm_time\": %.2f}\n",
                T, window, softcap, row_chunk, B, H, KV, hd, threads, f * 1e3, b * 1e3, row.kept, row.scratch, gflops, (f + b) / ideal);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
