// Training-step benchmark: GPT-2 (default: small, L12 C768 H12, V50257) at B=4, T=256, fp32,
// random init and random tokens, in RAM. Prints one JSON line: median ms/step, tokens/s, MFU
// against the sgemm rate measured on this machine in the same run, and peak RSS.
// bench/train_step.sh runs it next to PyTorch and prints the ratio.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "weights/model_io.h"
#include "store/segment_store.h"
#include "stratum/error.h"
#include "exec/executor.h"
#include "bench_util.h"

namespace {

using stratum::bench::Clock;
using stratum::bench::seconds_since;

// Best sgemm GFLOP/s over the GEMM shapes a GPT-2 block uses at this batch size.
double measure_sgemm_gflops(int M, int C) {
  return stratum::bench::sgemm_gflops({{M, 3 * C, C}, {M, C, C}, {M, 4 * C, C}, {M, C, 4 * C}});
}

long arg(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atol(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  stratum::blas_prepare_process(argv);
  stratum::GptConfig cfg;
  cfg.n_layer = static_cast<int>(arg(argc, argv, "--layers", 12));
  cfg.n_embd = static_cast<int>(arg(argc, argv, "--embd", 768));
  cfg.n_head = static_cast<int>(arg(argc, argv, "--heads", 12));
  cfg.vocab_size = static_cast<int>(arg(argc, argv, "--vocab", 50257));
  cfg.n_ctx = 1024;
  const int B = static_cast<int>(arg(argc, argv, "--batch", 4));
  const int T = static_cast<int>(arg(argc, argv, "--seq", 256));
  const int steps = static_cast<int>(arg(argc, argv, "--steps", 5));
  const int warmup = static_cast<int>(arg(argc, argv, "--warmup-steps", 1));
  const int threads = static_cast<int>(arg(argc, argv, "--threads", 2));
  const bool keep = arg(argc, argv, "--keep-activations", 0) != 0;
  cfg.validate();

  stratum::ThreadPool pool(threads);
  stratum::blas_set_threads(threads);
  const double gemm_gflops = measure_sgemm_gflops(B * T, cfg.n_embd);

  const stratum::ParamLayout layout = stratum::ParamLayout::gpt2(cfg);
  stratum::RamSegmentStore store(layout, stratum::Executor::activation_unit_floats(cfg, B, T));
  stratum::model_init_random(cfg, layout, store, 1337);
  stratum::Executor exec(pool, cfg, store, B, T,
                         keep ? stratum::ActivationPolicy::Keep : stratum::ActivationPolicy::Recompute);
  stratum::Rng rng(7);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B) * T), targets(inputs.size());
  std::vector<double> ms;
  float loss = 0.0f;
  for (int step = 0; step < warmup + steps; ++step) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      inputs[i] = static_cast<std::int32_t>(rng.below(cfg.vocab_size));
      targets[i] = static_cast<std::int32_t>(rng.below(cfg.vocab_size));
    }
    const auto t0 = Clock::now();
    loss = exec.forward_backward(inputs.data(), targets.data(), B, T);
    const float norm = static_cast<float>(std::sqrt(exec.grad_sum_squares()));
    const float scale = std::min(1.0f, 1.0f / (norm + 1e-6f));
    exec.optimizer_step(stratum::AdamWHyper{3e-4, 0.9, 0.95, 1e-8, step + 1}, 0.1, scale);
    if (step >= warmup) ms.push_back(seconds_since(t0) * 1000.0);
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms[ms.size() / 2];
  const double tokens = static_cast<double>(B) * T;
  const double C = cfg.n_embd, L = cfg.n_layer;
  const double n_flop_params = 12.0 * L * C * C + static_cast<double>(cfg.vocab_size) * C;  // blocks + LM head
  const double flops_per_step = tokens * (6.0 * n_flop_params + 12.0 * L * C * T);
  const double achieved_gflops = flops_per_step / (median_ms / 1000.0) / 1e9;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::string all;
  for (double v : ms) all += (all.empty() ? "" : ",") + std::to_string(v);
  std::printf("{\"impl\":\"stratum\",\"ms_per_step_median\":%.1f,\"tokens_per_s\":%.1f,\"peak_rss_mib\":%.1f,"
              "\"model_gflops\":%.1f,\"sgemm_gflops\":%.1f,\"mfu_vs_sgemm\":%.3f,\"threads\":%d,\"blas\":\"%s\","
              "\"activations\":\"%s\",\"config\":\"L%d C%d H%d V%d B%d T%d\",\"steps\":%d,\"final_loss\":%.4f,\"ms_per_step_all\":[%s]}\n",
              median_ms, tokens / (median_ms / 1000.0), usage.ru_maxrss / 1024.0, achieved_gflops, gemm_gflops,
              achieved_gflops / gemm_gflops, threads, stratum::blas_describe().c_str(), keep ? "keep" : "recompute", cfg.n_layer, cfg.n_embd,
              cfg.n_head, cfg.vocab_size, B, T, steps, loss, all.c_str());
  return 0;
} catch (const stratum::Error& e) {
  std::fprintf(stderr, "train_step_bench: %s\n", e.what());
  return 1;
}
