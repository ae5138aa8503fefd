// How much the blocks' row chunks (Note [row chunks] in model/block_policy.h: 1024 rows) cost the
// linear layers' matrix products on a backend: one layer's products (forward, then the backward's
// input gradient and weight gradient summed over the chunks, as the blocks run them) for B*T rows
// taken in chunks of R rows, for each R, on GPT-2 small's and the ~1.1B Llama's layer shapes.
// Prints one JSON line per shape and R: the milliseconds of the forward and of the backward
// (median of --reps passes), and the TFLOP/s they reach. The question it answers: would a larger
// chunk on the GPU (where GPT-2 small's linear layers ran at ~33 TFLOP/s in 1024-row chunks on an
// H200) make the step faster? Without a GPU, --backend cpu runs the same passes on the CPU.
//   row_chunk_gemm [--backend cuda|cpu] [--rows 4096] [--chunks 1024,2048,4096] [--reps 10] [--threads 2]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_util.h"
#include "core/thread_pool.h"
#include "stratum/error.h"

namespace {

namespace bench = stratum::bench;
using stratum::Ops;

struct Shape {
  const char* name;
  int K, N;  // a linear layer K -> N (the Conv1D layout: w is K x N)
};

// Ops memory of n floats, zeroed, freed with its Ops.
struct Buf {
  const Ops* ops;
  std::size_t bytes;
  float* p;
  Buf(const Ops& o, std::size_t n) : ops(&o), bytes(n * sizeof(float)), p(static_cast<float*>(o.memory_alloc(bytes))) {}
  ~Buf() { ops->memory_free(p, bytes); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Waits for every op queued before it (a download returns once the stream reached it).
void finish(const Ops& ops, const float* x) {
  float v = 0.0f;
  ops.download(&v, x, sizeof v);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cuda", chunks_arg = "1024,2048,4096";
  int rows = 4096, reps = 10, threads = 2;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> const char* {
        STRATUM_CHECK(i + 1 < argc, "row_chunk_gemm: ", a, " needs a value");
        return argv[++i];
      };
      if (a == "--backend") backend = next();
      else if (a == "--rows") rows = std::atoi(next());
      else if (a == "--chunks") chunks_arg = next();
      else if (a == "--reps") reps = std::atoi(next());
      else if (a == "--threads") threads = std::atoi(next());
      else STRATUM_FAIL("row_chunk_gemm: unknown argument ", a);
    }
    const stratum::Backend b = stratum::backend_parse(backend);
    std::string why;
    if (!stratum::backend_available(b, &why)) {
      std::fprintf(stderr, "row_chunk_gemm: %s\n", why.c_str());
      return 1;
    }
    stratum::backend_set_threads(threads);
    stratum::ThreadPool pool(threads);
    const std::unique_ptr<Ops> ops = stratum::ops_make(pool, stratum::Precision::Fp32, b);
    const Shape shapes[] = {{"gpt2 c_attn", 768, 2304},  {"gpt2 attn.c_proj", 768, 768},  {"gpt2 c_fc", 768, 3072},
                            {"gpt2 mlp.c_proj", 3072, 768}, {"llama qkv", 2048, 2560}, {"llama o_proj", 2048, 2048},
                            {"llama gate|up", 2048, 5632},  {"llama down", 5632, 2048}};
    for (const Shape& s : shapes) {
      const std::size_t M = static_cast<std::size_t>(rows);
      Buf x(*ops, M * s.K), y(*ops, M * s.N), dy(*ops, M * s.N), dx(*ops, M * s.K);
      Buf w(*ops, static_cast<std::size_t>(s.K) * s.N), bias(*ops, s.N), dw(*ops, static_cast<std::size_t>(s.K) * s.N),
          db(*ops, s.N);
      ops->fill(x.p, 0.01f, M * s.K);
      ops->fill(dy.p, 0.02f, M * s.N);
      ops->fill(w.p, 0.03f, static_cast<std::size_t>(s.K) * s.N);
      for (int R : bench::parse_int_list(chunks_arg)) {
        if (R <= 0 || R > rows) continue;
        auto pass = [&](bool backward) {
          for (int r0 = 0; r0 < rows; r0 += R) {
            const int n = std::min(R, rows - r0);
            const std::size_t at = static_cast<std::size_t>(r0);
            if (!backward)
              ops->matmul_forward(y.p + at * s.N, x.p + at * s.K, w.p, bias.p, n, s.K, s.N);
            else
              ops->matmul_backward(dx.p + at * s.K, dw.p, db.p, dy.p + at * s.N, x.p + at * s.K, w.p, n, s.K, s.N,
                                   r0 > 0);
          }
        };
        std::vector<double> fwd, bwd;
        for (int r = 0; r <= reps; ++r) {  // the first pass untimed
          auto t0 = bench::Clock::now();
          pass(false);
          finish(*ops, y.p);
          const double f = 1e3 * bench::seconds_since(t0);
          t0 = bench::Clock::now();
          pass(true);
          finish(*ops, dw.p);
          const double g = 1e3 * bench::seconds_since(t0);
          if (r > 0) {
            fwd.push_back(f);
            bwd.push_back(g);
          }
        }
        const double flop = 2.0 * rows * s.K * s.N, fm = bench::median(fwd), bm = bench::median(bwd);
        std::printf("{\"backend\": \"%s\", \"shape\": \"%s\", \"rows\": %d, \"chunk\": %d, \"forward_ms\": %.3f, "
                    "\"backward_ms\": %.3f, \"forward_tflops\": %.2f, \"backward_tflops\": %.2f}\n",
                    backend.c_str(), s.name, rows, R, fm, bm, flop / fm / 1e9, 2 * flop / bm / 1e9);
        std::fflush(stdout);
      }
    }
  } catch (const stratum::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
