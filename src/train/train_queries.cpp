// What the CLI asks about a training run without running one: whether its options hold together,
// the root a resume saves to, the smallest budget; see trainer.h.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "core/file_util.h"
#include "plan/planner.h"
#include "stratum/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace stratum {
std::string train_checkpoint_root(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (!file_exists(p + "/manifest.json")) return p;
  const auto parent = std::filesystem::path(p).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::size_t train_min_budget_bytes(const GptConfig& cfg, int batch, int seq, int threads, ActivationPolicy activations,
                                   double grad_clip,
                                   Precision precision, TrainOptimizer optimizer, const LoraConfig& lora,
                                   bool base_bf16, int grad_accum, int row_chunk) {
  PlanRequest request;
  request.grad_accum = grad_accum;
  request.row_chunk = row_chunk;
  request.lora = lora;
  request.base_bf16 = base_bf16;
  request.zeroth_order = optimizer == TrainOptimizer::ZoSgd;
  request.config = cfg;
  request.batch = batch;
  request.seq = seq;
  request.threads = threads;
  request.activations = plan_activations_resolve(activations, optimizer == TrainOptimizer::ZoSgd);
  request.grad_clip = grad_clip;
  request.precision = precision;
  return plan_min_budget_bytes(request);
}

namespace {
// A range's end as a user typed it: whole numbers in full (1073741824, not 1.07374e+09).
std::string bound_text(double v) {
  char text[40];
  if (v == std::floor(v) && std::fabs(v) <= 1e18) std::snprintf(text, sizeof text, "%.0f", v);
  else std::snprintf(text, sizeof text, "%g", v);
  return text;
}
}  // namespace

void train_options_check(const TrainOptions& o) {
  STRATUM_CHECK(!o.data_path.empty(), "[train] --data FILE is required (a text file, .bin token file or llm.c shard)");
  // Each number within its row's range (Note [option table]), for callers that skip the CLI.
  for (const TrainOption& option : train_option_table())
    std::visit(
        [&](const auto* p) {
          using T = std::remove_cv_t<std::remove_pointer_t<decltype(p)>>;
          if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
            const double v = static_cast<double>(*p);
            STRATUM_CHECK(v >= option.min && v <= option.max, "[train] --", option.flag, " must be in [",
                          bound_text(option.min), ", ", bound_text(option.max), "], got ", bound_text(v));
          }
        },
        option.field(const_cast<TrainOptions&>(o)));
  // What a range cannot say.
  STRATUM_CHECK(o.io_block_bytes % 4096 == 0, "[train] --io-block must be a multiple of 4K between 4K and 1G, got ",
                o.io_block_bytes, " bytes");
  STRATUM_CHECK(o.lr.min_lr <= o.lr.max_lr, "[train] --min-lr must be in [0, --lr], got ", o.lr.min_lr);
  STRATUM_CHECK(o.beta1 < 1 && o.beta2 < 1, "[train] --beta1 and --beta2 must be below 1, got ", o.beta1, " and ",
                o.beta2);
  STRATUM_CHECK(o.eps > 0, "[train] --eps must be > 0, got ", o.eps);
  STRATUM_CHECK(o.save_every == 0 || !o.save_dir.empty(), "[train] --save-every needs --save DIR");
  // A checkpoint or model directory is not a --save root (the run's step directories went inside it).
  STRATUM_CHECK(o.save_dir.empty() || (!file_exists(o.save_dir + "/manifest.json") &&
                                       !file_exists(o.save_dir + "/config.json")),
                "[train] --save '", o.save_dir, "' is a checkpoint or model directory; give the directory that "
                "holds (or will hold) the run's step-N checkpoints");
  plan_activations_resolve(o.activations, o.optimizer == TrainOptimizer::ZoSgd);  // refuses keep/offload with zo-sgd
  STRATUM_CHECK(o.grad_accum == 1 || o.optimizer == TrainOptimizer::AdamW, "[train] --grad-accum ", o.grad_accum,
                " sums backpropagated gradients, and --optimizer zo-sgd has none; drop --grad-accum (or raise --batch)");
  // Outputs never overwrite the run's own inputs (--log naming the data file truncated it).
  const std::pair<const char*, const std::string*> outputs[] = {{"--log", &o.log_path}, {"--trace", &o.trace_path}};
  const std::pair<const char*, const std::string*> inputs[] = {{"--data", &o.data_path},
                                                               {"--val-data", &o.val_data_path}};
  for (const auto& [out_flag, out] : outputs) {
    for (const auto& [in_flag, in] : inputs)
      STRATUM_CHECK(!same_file(*out, *in), "[train] ", out_flag, " '", *out, "' is the ", in_flag,
                    " file: the run would overwrite its own input; choose another path");
  }
  STRATUM_CHECK(!same_file(o.log_path, o.trace_path), "[train] --log and --trace name the same file '", o.log_path,
                "'; give each its own");
  for (const auto& [out_flag, out] : outputs)  // else the run claimed the directory before the file failed
    STRATUM_CHECK(out->empty() || o.save_dir.empty() || !same_file(*out, o.save_dir), "[train] ", out_flag, " '",
                  *out, "' is the --save directory; give the file a path of its own");
  for (const auto& [out_flag, out] : outputs)
    STRATUM_CHECK(out->empty() || !dir_exists(*out), "[train] ", out_flag, " '", *out,
                  "' is a directory; give a file path");
  STRATUM_CHECK(o.gpu_mem_budget_bytes == 0 || o.backend != Backend::Cpu || o.mirror_store,
                "[train] --gpu-mem-budget bounds the GPU's memory: add --backend cuda, or use --mem-budget for RAM");
  STRATUM_CHECK(o.adamw_on == AdamWOn::Auto || o.backend != Backend::Cpu || o.mirror_store,
                "[train] --adamw-on chooses between the GPU and the CPU: add --backend cuda (on the CPU backend "
                "AdamW always runs on the CPU)");
  STRATUM_CHECK(o.adamw_on == AdamWOn::Auto || o.optimizer == TrainOptimizer::AdamW,
                "[train] --adamw-on places AdamW, and --optimizer zo-sgd has none: drop --adamw-on");
  STRATUM_CHECK(o.adamw_on != AdamWOn::Host || o.comm == nullptr || o.comm->size() == 1,
                "[train] --adamw-on cpu is for one process for now: drop it under mpirun");
  STRATUM_CHECK(o.backend == Backend::Cpu || o.precision == Precision::Fp32, "[train] --backend ",
                backend_name(o.backend), " computes in fp32 only for now: drop --precision bf16");
  if (o.comm != nullptr && o.comm->size() > 1) {
    const int P = o.comm->size();
    STRATUM_CHECK(o.optimizer == TrainOptimizer::AdamW, "[train] --optimizer zo-sgd runs on one process; run it "
                  "without mpirun");
    // A resume keeps the checkpoint's --grad-accum, so the fix is another rank count.
    std::string divisors;
    for (int d = 1; d <= o.grad_accum && divisors.size() < 40; ++d)
      if (o.grad_accum % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    STRATUM_CHECK(o.grad_accum % P == 0, "[train] --grad-accum ", o.grad_accum, " must be a multiple of the ", P,
                  " ranks (each runs --grad-accum / ranks micro-batches of every step); ",
                  o.resume_path.empty()
                      ? "use --grad-accum " + std::to_string((o.grad_accum + P - 1) / P * P)
                      : "the checkpoint's --grad-accum stays, so resume with mpirun -np one of " + divisors);
    STRATUM_CHECK(o.backend == Backend::Cpu, "[train] data-parallel ranks compute on the CPU for now: drop --backend");
  }
  if (std::string why; !backend_available(o.backend, &why)) throw Error(why);  // after the conflicts above, before any data is read
}

void train_options_for_rank(TrainOptions& o) {
  if (o.comm == nullptr || o.comm->size() < 2) return;
  const int rank = o.comm->rank();
  if (!o.offload_dir.empty()) {  // each rank's own files (one run per offload directory)
    STRATUM_CHECK(dir_exists(o.offload_dir), "[train] --offload-dir '", o.offload_dir,
                  "' does not exist: create it or choose another");
    o.offload_dir += "/rank-" + std::to_string(rank);
    dir_create(o.offload_dir);
  }
  if (rank == 0) return;
  o.quiet = true;
  o.log_path.clear();
  o.trace_path.clear();
  o.save_dir.clear();
  o.save_every = 0;
}

}  // namespace stratum
