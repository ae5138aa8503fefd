// What a training run records about itself in its checkpoints' trainer state, and the check that
// a resume continues the same math (Note [checkpoints], Note [option table]). Used by the trainer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"
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

// Note [same command on every rank]: the ranks of an mpirun job each parse their own command
// line; one started with another --lr, --seed or data trained on silently to other bits, another
// --lora-r aborted in MPI and --save on one rank hung at the first checkpoint. So before the first
// step every rank gathers every rank's math (the table's math rows, the model, the data's hashes,
// the thread count) and its run-level rows (`extra`: name, text), and the first rank whose row
// differs from rank 0's throws naming it; the others wait for that rank's abort to end the job.
void train_ranks_agree_check(Communicator& comm, const TrainerState& mine,
                             const std::vector<std::pair<std::string, std::string>>& extra);

}  // namespace stratum
