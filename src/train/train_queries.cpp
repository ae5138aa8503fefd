// What the CLI asks about a training run without running one: a checkpoint's trainer state, the
// root a resume saves to, the smallest budget; see trainer.h.
#include <filesystem>
#include <string>

#include "core/file_util.h"
#include "plan/planner.h"
#include "stratum/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace stratum {
namespace {
std::string peek_dir(const std::string& path) {
  if (file_exists(path + "/trainer_state.json")) return path;
  const LatestStatus latest = checkpoint_latest(path);
  if (latest.ok() && file_exists(path + "/" + latest.name + "/trainer_state.json")) return path + "/" + latest.name;
  for (const std::string& name : checkpoint_list(path))
    if (file_exists(path + "/" + name + "/trainer_state.json")) return path + "/" + name;
  STRATUM_FAIL("[train] --resume '", path, "' holds no checkpoint (no trainer_state.json)");
}
}  // namespace

TrainerState train_peek_checkpoint(const std::string& path) {
  STRATUM_CHECK(dir_exists(path), "[train] --resume '", path, "' does not exist or is not a directory");
  const std::string dir = peek_dir(path);
  return trainer_state_parse(file_read_all(dir + "/trainer_state.json"), dir + "/trainer_state.json");
}

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
                                   bool base_bf16) {
  PlanRequest request;
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

}  // namespace stratum
