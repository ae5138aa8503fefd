// What a training run records about itself in its checkpoints' trainer state, and the check that
// a resume continues the same math (Note [checkpoints], Note [option table]). Used by the trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace stratum {

// The options of run `o` as a trainer state (step, loss, next_lr and params_hash are filled in when a
// checkpoint is written). threads: the count used (Note [option table]); offload_dir: --offload-dir
// as given (a rank of several streams under its own subdirectory of it). Paths are made absolute.
TrainerState train_state_of(const TrainOptions& o, const GptConfig& cfg, const std::string& tokenizer_dir,
                            const std::vector<std::int32_t>& train_tokens, const std::vector<std::int32_t>& val_tokens,
                            int threads, const std::string& offload_dir);
// Throws Error naming the first difference when `have` (this run) does not do the math of `want`
// (the checkpoint in `dir`): the model, any option of the table that changes the math, the data.
void train_resume_check(const TrainerState& want, const TrainerState& have, const std::string& dir);

}  // namespace stratum
