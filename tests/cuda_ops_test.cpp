// The CUDA backend against the CPU reference, op by op (DESIGN.md: every backend is tested
// against the CPU's semantics): matrix products, row dots, elementwise ops, rope, dropout, AdamW
// and the zeroth-order update. Ops whose arithmetic the CUDA kernels copy exactly (Note [cuda
// determinism] in kernels/cuda/cuda_ops.h) must give the CPU's bits; cuBLAS products are held to
// a scaled error. Skipped where this build has no CUDA backend or the machine no GPU; the
// backend's memory API and its refusal without a GPU are tested everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "core/bf16.h"
#include "cross_backend_util.h"
#include "ops/ops_buffer.h"
#include "ops/rope_table.h"
#include "store/queue_span.h"
#include "stratum/error.h"
#include "test_util.h"

namespace stratum::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

// Note [ops memory] on the CPU backend: zeroed, aligned, copies in and out, owned by OpsBuffer.
TEST(Backend, CpuMemoryRoundTrips) {
  ThreadPool pool(1);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  EXPECT_TRUE(ops->host_memory());
  OpsBuffer m(*ops, 1000);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % 64, 0u);
  std::vector<float> in(250), out(250, 1.0f);
  ops->download(out.data(), m.data(), 1000);
  EXPECT_EQ(out, std::vector<float>(250, 0.0f)) << "memory_alloc zero-fills";
  for (int i = 0; i < 250; ++i) in[i] = static_cast<float>(i) * 0.5f;
  ops->upload(m.data(), in.data(), 1000);
  ops->download(out.data(), m.data(), 1000);
  EXPECT_EQ(in, out);
  OpsBuffer moved = std::move(m);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(moved.size_bytes(), 1000u);
  EXPECT_NE(backend_inventory().find("cpu"), std::string::npos);
}

// Without a CUDA build or a GPU, asking for the CUDA backend is one clear line, not a crash.
TEST(Backend, CudaWithoutAGpuSaysWhy) {
  std::string why;
  if (backend_available(Backend::Cuda, &why)) GTEST_SKIP() << "a GPU is present: " << backend_inventory();
  EXPECT_EQ(why.rfind("[backend", 0), 0u) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  ThreadPool pool(1);
  try {
    ops_make(pool, Precision::Fp32, Backend::Cuda);
    FAIL() << "ops_make(Cuda) succeeded without a GPU";
  } catch (const BugError& e) {
    FAIL() << "internal error: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
  // The CPU path still works in the same process.
  EXPECT_NE(ops_make(pool), nullptr);
}

// Note [device timeline]: a QueueSpan's span is recorded when its queue gets past the work
// between its marks: a copy in on the upload queue, a fill on the compute queue. On the CPU
// both marks run at once: the span is recorded when the QueueSpan goes out of scope.
TEST(CudaOps, QueueSpansAreRecordedWhenTheirQueuesGetThere) {
  {
    CrossBackend x;
    TraceRecorder trace;
    { const QueueSpan span(x.cpu(), Ops::Queue::Compute, &trace, TraceRecorder::kDevice, "forward", "cpu"); }
    EXPECT_EQ(trace.events().size(), 1u);  // recorded already
  }
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  const Ops& gpu = x.gpu();
  TraceRecorder trace;
  const std::size_t n = std::size_t{16} << 20, bytes = n * sizeof(float);  // 64 MiB
  std::vector<float> host(n, 1.5f);
  OpsBuffer dev(gpu, bytes);
  OpsEvent done(gpu);
  {
    const QueueSpan span(gpu, Ops::Queue::Upload, &trace, TraceRecorder::kDeviceIn, "device", "in");
    gpu.transfer(dev.data(), host.data(), bytes, true, nullptr, nullptr);
  }
  gpu.transfer(dev.data(), host.data(), 0, true, nullptr, done.get());  // after the span's end
  gpu.event_sync(done.get());
  ASSERT_EQ(trace.events().size(), 1u);
  {
    const QueueSpan span(gpu, Ops::Queue::Compute, &trace, TraceRecorder::kDevice, "forward", "fill");
    gpu.fill(dev.as_f32(), 2.0f, n);
  }
  float last = 0.0f;
  gpu.download(&last, dev.as_f32() + n - 1, sizeof(float));  // after the compute queued before it
  EXPECT_EQ(last, 2.0f);
  const std::vector<TraceRecorder::Event> events = trace.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].track, TraceRecorder::kDeviceIn);
  EXPECT_EQ(events[0].name, "in");
  EXPECT_GT(events[0].dur_us, 0.0);  // 64 MiB take microseconds at any bus speed
  EXPECT_EQ(events[1].track, TraceRecorder::kDevice);
  EXPECT_EQ(events[1].name, "fill");
  EXPECT_GE(events[1].ts_us, events[0].ts_us + events[0].dur_us);
}

TEST(CudaOps, SgemmMatchesCpuInEveryTransposition) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(1);
  const int M = 67, N = 45, K = 130;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? M + 3 : K + 3, ldb = tb ? K + 1 : N + 1, ldc = N + 2;
      auto A = rng.normal_f32(static_cast<std::size_t>(ta ? K : M) * lda);
      auto B = rng.normal_f32(static_cast<std::size_t>(tb ? N : K) * ldb);
      auto C = rng.normal_f32(static_cast<std::size_t>(M) * ldc);
      auto dA = CrossBackend::up(A), dB = CrossBackend::up(B), dC = CrossBackend::up(C);
      x.cpu().sgemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), ldc);
      x.gpu().sgemm(ta, tb, M, N, K, 0.75f, dA.d(), lda, dB.d(), ldb, 0.5f, dC.d(), ldc);
      // fp32 products of K = 130 normal terms in different summation orders: measured ~3e-7.
      expect_close(CrossBackend::down(dC), C, 2e-5, "sgemm");
    }
}

TEST(CudaOps, SgemmB16IsSgemmOnTheWidenedWeight) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(2);
  const int M = 33, N = 40, K = 72;
  for (int tb = 0; tb < 2; ++tb) {
    auto A = rng.normal_f32(static_cast<std::size_t>(M) * K);
    auto Bh = to_bf16(rng.normal_f32(static_cast<std::size_t>(N) * K));
    std::vector<float> Bw(Bh.size());
    for (std::size_t i = 0; i < Bh.size(); ++i) Bw[i] = bf16_to_f32(Bh[i]);
    const int ldb = tb ? K : N;
    auto dA = CrossBackend::up(A), dBw = CrossBackend::up(Bw);
    auto dBh = CrossBackend::up(Bh);
    auto d1 = CrossBackend::filled<float>(static_cast<std::size_t>(M) * N, kNaN);
    auto d2 = CrossBackend::filled<float>(static_cast<std::size_t>(M) * N, kNaN);
    auto scratch = CrossBackend::filled<float>(static_cast<std::size_t>(K) * N);
    x.gpu().sgemm_b16(false, tb, M, N, K, 1.0f, dA.d(), K, dBh.d(), ldb, 0.0f, d1.d(), N, scratch.d());
    x.gpu().sgemm(false, tb, M, N, K, 1.0f, dA.d(), K, dBw.d(), ldb, 0.0f, d2.d(), N);
    expect_same_bits(CrossBackend::down(d1), CrossBackend::down(d2), "sgemm_b16 vs sgemm on the widened copy");
  }
}

TEST(CudaOps, MatmulForwardAndBackwardMatchCpu) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(3);
  const int M = 70, K = 48, N = 96;
  auto inp = rng.normal_f32(static_cast<std::size_t>(M) * K), w = rng.normal_f32(static_cast<std::size_t>(K) * N, 0.2);
  auto bias = rng.normal_f32(N), dout = rng.normal_f32(static_cast<std::size_t>(M) * N);
  auto dinp0 = rng.normal_f32(inp.size()), dw0 = rng.normal_f32(w.size()), db0 = rng.normal_f32(N);
  auto di = CrossBackend::up(inp), dwt = CrossBackend::up(w), dbias = CrossBackend::up(bias),
       ddout = CrossBackend::up(dout);
  std::vector<float> out(static_cast<std::size_t>(M) * N);
  auto dout_gpu = CrossBackend::filled<float>(out.size(), kNaN);
  x.cpu().matmul_forward(out.data(), inp.data(), w.data(), bias.data(), M, K, N);
  x.gpu().matmul_forward(dout_gpu.d(), di.d(), dwt.d(), dbias.d(), M, K, N);
  expect_close(CrossBackend::down(dout_gpu), out, 1e-5, "matmul_forward");
  for (bool acc : {false, true}) {
    auto dinp = dinp0, dw = dw0, db = db0;
    auto gdinp = CrossBackend::up(dinp0), gdw = CrossBackend::up(dw0), gdb = CrossBackend::up(db0);
    x.cpu().matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), M, K, N, acc);
    x.gpu().matmul_backward(gdinp.d(), gdw.d(), gdb.d(), ddout.d(), di.d(), dwt.d(), M, K, N, acc);
    expect_close(CrossBackend::down(gdinp), dinp, 1e-5, "matmul_backward dinp");
    expect_close(CrossBackend::down(gdw), dw, 2e-5, "matmul_backward dw");
    // The bias gradient is the CPU's column sum, row by row in order: the same bits.
    expect_same_bits(CrossBackend::down(gdb), db, "matmul_backward dbias");
  }
}

TEST(CudaOps, RowDotsGiveTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(4);
  for (int K : {5, 16, 77, 768}) {
    const int M = 3, N = 37, ldx = K + 2, ldy = N + 1;
    auto xs = rng.normal_f32(static_cast<std::size_t>(M) * ldx);
    auto wnt = rng.normal_f32(static_cast<std::size_t>(N) * K), wkn = rng.normal_f32(static_cast<std::size_t>(K) * N);
    auto bias = rng.normal_f32(N);
    auto wnt16 = to_bf16(wnt), wkn16 = to_bf16(wkn);
    auto dx = CrossBackend::up(xs), dwnt = CrossBackend::up(wnt), dwkn = CrossBackend::up(wkn),
         db = CrossBackend::up(bias);
    auto dwnt16 = CrossBackend::up(wnt16), dwkn16 = CrossBackend::up(wkn16);
    const std::vector<float> xkn(xs.begin(), xs.begin() + static_cast<std::size_t>(M) * K);
    auto dxkn = CrossBackend::up(xkn);
    for (int variant = 0; variant < 4; ++variant) {
      const bool nt = variant < 2, b16 = variant % 2 == 1;
      const std::size_t ysize = nt ? static_cast<std::size_t>(M) * ldy : static_cast<std::size_t>(M) * N;
      std::vector<float> y(ysize, 0.0f);
      auto dy = CrossBackend::filled<float>(ysize, 0.0f);
      const float* bias_p = variant == 1 ? nullptr : bias.data();
      const float* dbias_p = variant == 1 ? nullptr : db.d();
      if (nt && !b16) {
        x.cpu().rowdot_nt(y.data(), ldy, xs.data(), ldx, wnt.data(), bias_p, M, N, K);
        x.gpu().rowdot_nt(dy.d(), ldy, dx.d(), ldx, dwnt.d(), dbias_p, M, N, K);
      } else if (nt) {
        x.cpu().rowdot_nt_bf16(y.data(), ldy, xs.data(), ldx, wnt16.data(), bias_p, M, N, K);
        x.gpu().rowdot_nt_bf16(dy.d(), ldy, dx.d(), ldx, dwnt16.d(), dbias_p, M, N, K);
      } else if (!b16) {
        x.cpu().rowdot_kn(y.data(), xkn.data(), wkn.data(), bias_p, M, K, N);
        x.gpu().rowdot_kn(dy.d(), dxkn.d(), dwkn.d(), dbias_p, M, K, N);
      } else {
        x.cpu().rowdot_kn_bf16(y.data(), xkn.data(), wkn16.data(), bias_p, M, K, N);
        x.gpu().rowdot_kn_bf16(dy.d(), dxkn.d(), dwkn16.d(), dbias_p, M, K, N);
      }
      expect_same_bits(CrossBackend::down(dy), y, ("rowdot variant " + std::to_string(variant) + " K " +
                                                   std::to_string(K)).c_str());
    }
  }
}

TEST(CudaOps, ElementwiseOpsGiveTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(5);
  const std::size_t n = 100003;
  auto a = rng.normal_f32(n, 3.0), b = rng.normal_f32(n), up = rng.normal_f32(n);
  auto da = CrossBackend::up(a), db = CrossBackend::up(b), dup = CrossBackend::up(up);
  std::vector<float> out(n);
  auto dout = CrossBackend::filled<float>(n, kNaN);

  x.cpu().add(out.data(), a.data(), b.data(), n);
  x.gpu().add(dout.d(), da.d(), db.d(), n);
  expect_same_bits(CrossBackend::down(dout), out, "add");

  x.cpu().gelu_forward(out.data(), a.data(), n);
  x.gpu().gelu_forward(dout.d(), da.d(), n);
  expect_same_bits(CrossBackend::down(dout), out, "gelu_forward");
  x.cpu().gelu_backward(out.data(), a.data(), b.data(), n);
  x.gpu().gelu_backward(dout.d(), da.d(), db.d(), n);
  expect_same_bits(CrossBackend::down(dout), out, "gelu_backward");

  x.cpu().swiglu_forward(out.data(), a.data(), up.data(), n);
  x.gpu().swiglu_forward(dout.d(), da.d(), dup.d(), n);
  expect_same_bits(CrossBackend::down(dout), out, "swiglu_forward");
  std::vector<float> dgate(n), dupv(n);
  auto gdgate = CrossBackend::filled<float>(n, kNaN), gdup = CrossBackend::filled<float>(n, kNaN);
  x.cpu().swiglu_backward(dgate.data(), dupv.data(), b.data(), a.data(), up.data(), n);
  x.gpu().swiglu_backward(gdgate.d(), gdup.d(), db.d(), da.d(), dup.d(), n);
  expect_same_bits(CrossBackend::down(gdgate), dgate, "swiglu_backward dgate");
  expect_same_bits(CrossBackend::down(gdup), dupv, "swiglu_backward dup");

  auto h = to_bf16(a);
  auto dh = CrossBackend::up(h);
  x.cpu().bf16_widen(out.data(), h.data(), n);
  x.gpu().bf16_widen(dout.d(), dh.d(), n);
  expect_same_bits(CrossBackend::down(dout), out, "bf16_widen");

  // Several 64 Ki chunks and a partial one: the CPU's chunks, lanes and tree, so the same double.
  for (std::size_t len : {std::size_t{1}, std::size_t{17}, n}) {
    const double cpu = x.cpu().sum_squares(a.data(), len), gpu = x.gpu().sum_squares(da.d(), len);
    EXPECT_EQ(std::memcmp(&cpu, &gpu, sizeof cpu), 0) << "sum_squares n=" << len << ": " << gpu << " vs " << cpu;
  }
}

TEST(CudaOps, SumSquaresOverManyChunksGivesTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(6);
  const std::size_t n = (std::size_t{1} << 16) * 4100 + 123;  // more chunks than one launch's slots
  std::vector<float> a(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  auto da = CrossBackend::up(a);
  const double cpu = x.cpu().sum_squares(a.data(), n), gpu = x.gpu().sum_squares(da.d(), n);
  EXPECT_EQ(std::memcmp(&cpu, &gpu, sizeof cpu), 0) << gpu << " vs " << cpu;
}

// Note [norm in one pass]: many vectors in one call (a gradient's tensors), their chunks run side
// by side in windows of one launch's slots that split vectors (and a window boundary inside one);
// each vector's sum is its own call's, the CPU's, to the bit, an empty one 0.
TEST(CudaOps, SumSquaresOfManyVectorsGivesEachTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  const std::size_t chunk = std::size_t{1} << 16;
  const std::vector<std::size_t> lens = {1, 17, 0, chunk, chunk + 1, 2050 * chunk + 5, 768, 2050 * chunk, 2304};
  std::size_t total = 0;
  for (std::size_t len : lens) total += len;
  std::vector<float> a(total);
  for (std::size_t i = 0; i < total; ++i) a[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  auto da = CrossBackend::up(a);
  std::vector<const float*> host, dev;
  std::size_t at = 0;
  for (std::size_t len : lens) {
    host.push_back(a.data() + at);
    dev.push_back(da.d() + at);
    at += len;
  }
  std::vector<double> cpu(lens.size(), -1.0), gpu(lens.size(), -1.0);
  x.cpu().sum_squares_many(cpu.data(), host.data(), lens.data(), lens.size());
  x.gpu().sum_squares_many(gpu.data(), dev.data(), lens.data(), lens.size());
  for (std::size_t v = 0; v < lens.size(); ++v) {
    const double one = x.gpu().sum_squares(dev[v], lens[v]);
    EXPECT_EQ(std::memcmp(&cpu[v], &gpu[v], sizeof(double)), 0) << "vector " << v << ": " << gpu[v] << " vs " << cpu[v];
    EXPECT_EQ(std::memcmp(&one, &gpu[v], sizeof(double)), 0) << "vector " << v << " alone";
  }
  EXPECT_EQ(gpu[2], 0.0);
}

TEST(CudaOps, RopeGivesTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(7);
  RopeScaling llama3;
  llama3.type = RopeScaling::Type::Llama3;
  llama3.factor = 8.0;
  const RopeTable table(16, 300, 500000.0, llama3);
  const int B = 2, T = 9, heads = 3, hd = 16;
  const std::size_t stride = heads * hd + 5;
  const std::vector<int> pos0 = {0, 250};
  auto dpos = CrossBackend::up(pos0);
  auto v = rng.normal_f32(static_cast<std::size_t>(B) * T * stride);
  for (bool backward : {false, true}) {
    auto ref = v;
    auto dv = CrossBackend::up(v);
    if (!backward) {
      x.cpu().rope_forward(ref.data(), B, T, heads, hd, stride, pos0.data(), table);
      x.gpu().rope_forward(dv.d(), B, T, heads, hd, stride, dpos.d(), table);
    } else {
      x.cpu().rope_backward(ref.data(), B, T, heads, hd, stride, nullptr, table);
      x.gpu().rope_backward(dv.d(), B, T, heads, hd, stride, nullptr, table);
    }
    expect_same_bits(CrossBackend::down(dv), ref, backward ? "rope_backward" : "rope_forward");
  }
}

TEST(CudaOps, DropoutAdamWAndZoUpdateGiveTheCpuBits) {
  STRATUM_REQUIRE_CUDA();
  CrossBackend x;
  TestRng rng(8);
  const int M = 37, n = 129, ldx = 131, ldy = 140;
  auto xs = rng.normal_f32(static_cast<std::size_t>(M) * ldx), y0 = rng.normal_f32(static_cast<std::size_t>(M) * ldy);
  auto dx = CrossBackend::up(xs);
  for (bool acc : {false, true}) {
    auto y = y0;
    auto dy = CrossBackend::up(y0);
    x.cpu().dropout(y.data(), ldy, xs.data(), ldx, M, n, 0x1234567ull, 0.1f, acc);
    x.gpu().dropout(dy.d(), ldy, dx.d(), ldx, M, n, 0x1234567ull, 0.1f, acc);
    expect_same_bits(CrossBackend::down(dy), y, "dropout");
  }

  const std::size_t len = 70001;
  auto p = rng.normal_f32(len), m = rng.normal_f32(len, 0.1), g = rng.normal_f32(len);
  std::vector<float> v(len);
  for (auto& e : v) e = static_cast<float>(rng.uniform(0.0, 0.01));
  auto dp = CrossBackend::up(p), dm = CrossBackend::up(m), dv = CrossBackend::up(v), dg = CrossBackend::up(g);
  AdamWHyper hyper;
  hyper.lr = 1e-3;
  hyper.step = 7;
  x.cpu().adamw_update(p.data(), m.data(), v.data(), g.data(), len, hyper, 0.1, 0.8f);
  x.gpu().adamw_update(dp.d(), dm.d(), dv.d(), dg.d(), len, hyper, 0.1, 0.8f);
  expect_same_bits(CrossBackend::down(dp), p, "adamw param");
  expect_same_bits(CrossBackend::down(dm), m, "adamw m");
  expect_same_bits(CrossBackend::down(dv), v, "adamw v");

  ZoUpdate u;
  u.update = true;
  u.update_key = 0xABCDEFull;
  u.eps = 1e-3f;
  u.lr = 1e-4f;
  u.g = 2.5f;
  u.weight_decay = 0.01f;
  u.perturb = true;
  u.perturb_key = 0x42ull;
  u.scale = 1e-3f;
  x.cpu().zo_update(p.data(), len, 1000, u);
  x.gpu().zo_update(dp.d(), len, 1000, u);
  expect_same_bits(CrossBackend::down(dp), p, "zo_update");
}

TEST(CudaOps, ABf16OpsIsRefusedWithOneLine) {
  STRATUM_REQUIRE_CUDA();
  ThreadPool pool(1);
  try {
    ops_make(pool, Precision::Bf16, Backend::Cuda);
    FAIL() << "bf16 CUDA ops were made";
  } catch (const BugError& e) {
    FAIL() << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stratum::test
