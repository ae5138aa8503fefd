// Batches of (inputs, targets) from a token array.
// Sequential order: batch k takes tokens [k*B*T, k*B*T + B*T + 1) with indices taken modulo the
// token count (wrapping at the end); inputs are the first B*T, targets the same shifted by one.
// Shuffled order: each epoch of floor(N / (B*T)) batches visits the sequential batch starts in a
// permutation drawn from (seed, epoch). Batches are a pure function of k, so a run can resume at
// any step. A token marked as no loss target (Note [loss mask] in token_file.h) is its id among
// the inputs and -1 among the targets. Does not read files (see token_file.h).
#pragma once

#include <cstdint>
#include <vector>

namespace stratum {

class DataLoader {
 public:
  DataLoader(std::vector<std::int32_t> tokens, int batch, int seq, bool shuffle, std::uint64_t seed);
  // inputs, targets: (B, T) each; targets null: the inputs only. A target is -1 where the token
  // is no loss target (Note [loss mask]).
  void batch(std::int64_t k, std::int32_t* inputs, std::int32_t* targets) const;
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  std::size_t token_count() const { return tokens_.size(); }

 private:
  std::int64_t batch_start(std::int64_t k) const;

  std::vector<std::int32_t> tokens_;
  int batch_, seq_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t batches_per_epoch_;
};

}  // namespace stratum
