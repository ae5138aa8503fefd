// The trainer state a run records and the check that a resume does the same math; see
// train_run_state.h.
#include "train/train_run_state.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
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

void train_ranks_agree_check(Communicator& comm, const TrainerState& mine,
                             const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const TrainOption& option : train_option_table())
    if (option.math) rows.emplace_back(std::string("--") + option.flag, train_option_text(option, mine));
  rows.emplace_back("the model", mine.model);
  auto data_text = [](std::uint64_t tokens, std::uint64_t hash) {
    return std::to_string(tokens) + " tokens, hash " + hash_text(hash);
  };
  rows.emplace_back("the training data", data_text(mine.train_tokens, mine.train_hash));
  rows.emplace_back("the validation data", data_text(mine.val_tokens, mine.val_hash));
  rows.emplace_back("--threads", std::to_string(mine.threads));  // the CPU's products' bits depend on it
  rows.insert(rows.end(), extra.begin(), extra.end());
  struct Row {  // fixed size: what allgather moves
    std::uint64_t hash;
    char text[56];
  };
  std::vector<Row> gathered(rows.size() * static_cast<std::size_t>(comm.size()));
  std::vector<Row> own(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string& text = rows[i].second;
    own[i].hash = hash64(text.data(), text.size());
    std::snprintf(own[i].text, sizeof own[i].text, "%s", text.size() < sizeof own[i].text
                                                            ? text.c_str()
                                                            : (text.substr(0, sizeof own[i].text - 4) + "...").c_str());
  }
  comm.allgather(own.data(), own.size() * sizeof(Row), gathered.data());
  for (int r = 1; r < comm.size(); ++r)
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& theirs = gathered[static_cast<std::size_t>(r) * rows.size() + i];
      if (theirs.hash == gathered[i].hash) continue;
      const std::string message = "[train] the ranks were started differently: " + rows[i].first + " is " +
                                  theirs.text + " on rank " + std::to_string(r) + " but " + gathered[i].text +
                                  " on rank 0; every rank must run the same command on the same data";
      if (comm.rank() != r) std::this_thread::sleep_for(std::chrono::seconds(30));  // rank r's abort ends this one
      throw Error(message);
    }
}

}  // namespace stratum
