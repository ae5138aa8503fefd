// TrainRun's evaluation: the validation loss during training, and `stratum eval` (Note [evaluate
// only] in trainer.h); see train_run.h.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/byte_size.h"
#include "core/process_memory.h"
#include "data/token_file.h"
#include "train/train_run.h"

namespace stratum::detail {

// The mean loss over the held-out batches, or -1 when a stop request (SIGINT/SIGTERM) came before
// the last batch: the evaluation is abandoned between batches (a partial mean would be another
// number), so the run checkpoints and stops without waiting for it.
// With a loss mask, the mean over the targets that count (Note [masked loss] in exec/executor.h).
float TrainRun::evaluate() {
  const std::size_t BT = static_cast<std::size_t>(o_.batch) * o_.seq;
  double total = 0.0, weighted = 0.0;
  std::size_t counted = 0;
  eval_targets_ = 0;
  for (int k = 0; k < eval_batches_; ++k) {
    if (stop_requested()) return -1.0f;
    val_loader_->batch(k, inputs_.data(), targets_.data());
    const float loss = exec_->loss(inputs_.data(), targets_.data(), o_.batch, o_.seq);
    const std::size_t n = token_target_count(targets_.data(), BT);
    total += loss;
    weighted += static_cast<double>(loss) * static_cast<double>(n);
    counted += n;
  }
  eval_targets_ = counted;
  if (counted == BT * static_cast<std::size_t>(eval_batches_)) return static_cast<float>(total / eval_batches_);
  return counted == 0 ? 0.0f : static_cast<float>(weighted / static_cast<double>(counted));
}

TrainResult TrainRun::evaluate_only() {
  TrainResult result = result_;
  const auto t0 = std::chrono::steady_clock::now();
  result.final_val_loss = evaluate();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.interrupted = result.final_val_loss < 0;
  result.eval_batches = eval_batches_;
  result.eval_targets = eval_targets_;
  result.tokens_per_s = static_cast<double>(eval_batches_) * o_.batch * o_.seq / std::max(seconds, 1e-9);
  result.min_budget_bytes = min_budget_;
  const StoreStats s = store_->stats();
  result.read_bytes = s.read_bytes;
  result.write_bytes = s.write_bytes;
  result.stall_ms = s.stall_ms;
  result.peak_mem_bytes = (mirror_ ? 0 : exec_->fixed_bytes()) + s.peak_held_bytes;  // RAM
  if (o_.mem_budget_bytes > 0)
    std::fprintf(stderr, "[stratum] tier traffic: read %s, written %s, compute stalled %.0f ms, peak RAM %s of the %s "
                 "budget\n", bytes_text(s.read_bytes).c_str(), bytes_text(s.write_bytes).c_str(), s.stall_ms,
                 bytes_text(result.peak_mem_bytes).c_str(), bytes_text(o_.mem_budget_bytes).c_str());
  std::fprintf(stderr, "[stratum] evaluated %d batches of %dx%d in %.1f s (%.0f tokens/s), peak RSS %s\n",
               eval_batches_, o_.batch, o_.seq, seconds, result.tokens_per_s,
               bytes_text(process_peak_rss_bytes()).c_str());
  return result;
}

}  // namespace stratum::detail
