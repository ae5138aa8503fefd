// DataLoader; see data_loader.h.
#include "data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "core/rng.h"
#include "data/token_file.h"
#include "stratum/error.h"

namespace stratum {

DataLoader::DataLoader(std::vector<std::int32_t> tokens, int batch, int seq, bool shuffle, std::uint64_t seed)
    : tokens_(std::move(tokens)), batch_(batch), seq_(seq), shuffle_(shuffle), seed_(seed) {
  STRATUM_CHECK(!tokens_.empty(), "[data] the training data holds no tokens; give a non-empty corpus");
  STRATUM_CHECK(batch >= 1 && seq >= 1, "[data] --batch and --seq must be >= 1");
  STRATUM_CHECK(tokens_.size() >= 2, "[data] the training data must hold at least 2 tokens, got ", tokens_.size());
  const std::int64_t per_batch = static_cast<std::int64_t>(batch) * seq;
  batches_per_epoch_ = std::max<std::int64_t>(1, static_cast<std::int64_t>(tokens_.size()) / per_batch);
}

std::int64_t DataLoader::batch_start(std::int64_t k) const {
  const std::int64_t per_batch = static_cast<std::int64_t>(batch_) * seq_;
  if (!shuffle_) return k * per_batch;
  const std::int64_t epoch = k / batches_per_epoch_;
  const std::int64_t index = k % batches_per_epoch_;
  // Fisher-Yates permutation of the epoch's batch indices, seeded by (seed, epoch).
  std::vector<std::int64_t> order(static_cast<std::size_t>(batches_per_epoch_));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch) + 1);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order[static_cast<std::size_t>(index)] * per_batch;
}

void DataLoader::batch(std::int64_t k, std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t n = tokens_.size();
  const std::size_t count = static_cast<std::size_t>(batch_) * seq_;
  const std::size_t start = static_cast<std::size_t>(batch_start(k)) % n;
  for (std::size_t i = 0; i < count; ++i) {
    inputs[i] = token_id(tokens_[(start + i) % n]);  // Note [loss mask]
    if (targets != nullptr) {
      const std::int32_t next = tokens_[(start + i + 1) % n];
      targets[i] = token_is_target(next) ? next : -1;
    }
  }
}

}  // namespace stratum
