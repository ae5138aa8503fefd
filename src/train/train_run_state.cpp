// The trainer state a run records and the check that a resume does the same math; see
// train_run_state.h.
#include "train/train_run_state.h"

#include <filesystem>
#include <string>
#include <vector>

#include "core/hash.h"
#include "stratum/error.h"

namespace stratum {

namespace {
std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

std::uint64_t tokens_hash(const std::vector<std::int32_t>& tokens) {
  return hash64(tokens.data(), tokens.size() * sizeof(std::int32_t));
}
}  // namespace

// The options of this run as a trainer state (Note [checkpoints]); step, loss, next_lr and
// params_hash are filled in when a checkpoint is written.
TrainerState train_state_of(const TrainOptions& o, const GptConfig& cfg, const std::string& tokenizer_dir,
                      const std::vector<std::int32_t>& train_tokens, const std::vector<std::int32_t>& val_tokens,
                      int threads, const std::string& offload_dir) {
  TrainerState s;
  static_cast<TrainSettings&>(s) = o;  // every recorded option (Note [option table])
  s.lr.total_steps = o.steps;
  s.config = cfg;
  s.model = cfg.describe();
  s.data_path = absolute_path(o.data_path);
  s.val_data_path = absolute_path(o.val_data_path);
  s.tokenizer_dir = absolute_path(tokenizer_dir);
  s.threads = threads;
  s.offload_dir = absolute_path(offload_dir);
  s.log_path = absolute_path(o.log_path);  // a resume from another directory continues the same file
  s.train_tokens = train_tokens.size();
  s.train_hash = tokens_hash(train_tokens);
  s.val_tokens = val_tokens.size();
  s.val_hash = tokens_hash(val_tokens);
  return s;
}

// A resume must do the same math as the run it continues: the model, every option of the table
// that changes the math (Note [option table]) and the data's contents must match.
// The fix each mismatch names: an option differs only where its flag was given (left out, it is
// the checkpoint's), while the model and the data can differ with no flag given (a file changed).
void train_resume_check(const TrainerState& want, const TrainerState& have, const std::string& dir) {
  auto same = [&](bool equal, const std::string& what, const std::string& now, const std::string& then,
                  const char* fix) {
    STRATUM_CHECK(equal, "[train] --resume ", dir, ": ", what, " is ", now, " but the checkpoint was trained with ",
                  then, "; ", fix);
  };
  same(want.model == have.model && want.config.layer_norm_eps == have.config.layer_norm_eps, "the model", have.model,
       want.model, "a resumed run continues the checkpoint's model");
  for (const TrainOption& option : train_option_table())
    if (option.math)
      same(train_option_equal(option, want, have), std::string("--") + option.flag, train_option_text(option, have),
           train_option_text(option, want),  // %g text may print alike; the comparison is exact
           "a resumed run must use the same value (leave the flag out to take the checkpoint's)");
  const char* data_fix = "a resumed run must read the same tokens: give the data it was trained on, unchanged";
  same(want.train_tokens == have.train_tokens && want.train_hash == have.train_hash, "the training data",
       "'" + have.data_path + "' (" + std::to_string(have.train_tokens) + " tokens" +
           (have.train_tokens == want.train_tokens ? ", other contents)" : ")"),
       "'" + want.data_path + "' (" + std::to_string(want.train_tokens) + " tokens)", data_fix);
  same(want.val_tokens == have.val_tokens && want.val_hash == have.val_hash, "the validation data",
       std::to_string(have.val_tokens) + " tokens" + (have.val_tokens == want.val_tokens ? ", other contents" : ""),
       std::to_string(want.val_tokens) + " tokens", data_fix);
}

}  // namespace stratum
