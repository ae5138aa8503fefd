// Checkpoints and resume (Note [checkpoints]) through the CLI, as a user runs them: resuming gives
// the bits of a run never interrupted (also across budgets and prefetch depths), --keep and
// `latest`, write faults and a crash mid-write leave the previous checkpoint, damaged checkpoints
// are detected and skipped, Ctrl-C checkpoints, and random SIGKILLs lose nothing.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/file_util.h"
#include "integration_util.h"
#include "stratum/error.h"
#include "train/checkpoint.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

// A data-parallel checkpoint's optimizer shards (Note [zero sharding]): exact names, and only a
// complete set (or the single file) counts as the optimizer state.
TEST(OptimizerShards, NamesParseExactlyAndOnlyACompleteSetCounts) {
  EXPECT_EQ(optimizer_shard_name(0, 2), "optimizer-00001-of-00002.safetensors");
  int i = -1, n = -1;
  EXPECT_TRUE(optimizer_shard_parse("optimizer-00002-of-00003.safetensors", &i, &n));
  EXPECT_EQ(i, 1);
  EXPECT_EQ(n, 3);
  for (const char* bad : {"optimizer-00000-of-00002.safetensors", "optimizer-00003-of-00002.safetensors",
                          "optimizer-1-of-2.safetensors", "optimizer-00001-of-00002.safetensors.tmp",
                          "optimizer.safetensors", "model-00001-of-00002.safetensors"})
    EXPECT_FALSE(optimizer_shard_parse(bad, &i, &n)) << bad;
  const std::string a = optimizer_shard_name(0, 2), b = optimizer_shard_name(1, 2), c = optimizer_shard_name(0, 3);
  EXPECT_EQ(optimizer_files({"config.json", b, a}), (std::vector<std::string>{a, b}));
  EXPECT_EQ(optimizer_files({"optimizer.safetensors", a}), std::vector<std::string>{"optimizer.safetensors"});
  EXPECT_TRUE(optimizer_files({a}).empty()) << "a shard missing";
  EXPECT_TRUE(optimizer_files({a, b, c}).empty()) << "shards of two sets";
  EXPECT_TRUE(optimizer_files({"config.json"}).empty());
}

using testing::CommandResult;
using testing::run_stratum;
using testing::ScopedEnv;
using testing::StratumProcess;
using testing::TempDir;

std::string quote(const std::string& s) { return "'" + s + "'"; }

std::string train_args(const std::string& tokens, long steps) {
  return "train --layers 2 --heads 4 --embd 64 --ctx 64 --vocab 2048 --batch 4 --seq 32 --lr 1e-3 --warmup 2 "
         "--threads 2 --quiet --data " +
         quote(tokens) + " --steps " + std::to_string(steps);
}

std::string budget_args(const std::string& offload, int prefetch) {
  std::filesystem::create_directories(offload);
  return " --mem-budget 4M --offload-dir " + quote(offload) + " --prefetch " + std::to_string(prefetch);
}

// The "params hash" a finished run prints (empty when it printed none).
std::string params_hash(const CommandResult& r) { return testing::params_hash_of(r.errors); }

std::vector<double> losses(const std::string& log) {
  std::vector<double> out;
  for (const auto& record : testing::read_jsonl(log)) out.push_back(record["loss"].get<double>());
  return out;
}

std::string latest_of(const std::string& root) {
  return file_exists(root + "/latest") ? file_read_all(root + "/latest") : "";
}

using testing::checkpoint_temporaries;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = testing::write_random_tokens(tmp_.file("tokens.bin"), 20000, 2048, 5);
    const CommandResult ref = run_stratum(train_args(tokens_, kSteps) + " --log " + quote(tmp_.file("ref.jsonl")));
    ASSERT_EQ(ref.exit_code, 0) << ref.errors;
    ref_hash_ = params_hash(ref);
    ASSERT_EQ(ref_hash_.size(), 16u) << ref.errors;
    ref_losses_ = losses(tmp_.file("ref.jsonl"));
  }
  static constexpr long kSteps = 8;
  TempDir tmp_;
  std::string tokens_, ref_hash_;
  std::vector<double> ref_losses_;
};

TEST_F(Checkpoint, ResumeIsBitIdenticalAcrossBudgetsAndPrefetchDepths) {
  const std::string root = tmp_.file("ck");
  // The first half in RAM, checkpoints at steps 3, 6 and 8 (all kept).
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 3 --keep 5");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_);
  for (const char* name : {"step-00000003", "step-00000006", "step-00000008"})
    EXPECT_TRUE(checkpoint_verify(root + "/" + name).ok()) << name;
  EXPECT_EQ(latest_of(root), "step-00000008\n");

  struct Case {
    const char* from;
    std::string extra;
  } cases[] = {{"step-00000003", ""},
               {"step-00000003", budget_args(tmp_.file("off1"), 1)},
               {"step-00000006", budget_args(tmp_.file("off3"), 3)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.from) + c.extra);
    const std::string log = tmp_.file("resume.jsonl");
    // The log of the run being continued: resuming keeps its records up to the checkpoint.
    std::filesystem::copy_file(tmp_.file("ref.jsonl"), log, std::filesystem::copy_options::overwrite_existing);
    r = run_stratum("train --resume " + quote(root + "/" + c.from) + " --save " + quote(tmp_.file("ck_resumed")) +
                    " --quiet --log " + quote(log) + c.extra);
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_NE(r.errors.find("resuming from " + root + "/" + c.from), std::string::npos) << r.errors;
    EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
    EXPECT_EQ(losses(log), ref_losses_) << "the continued log equals the uninterrupted run's";
  }

  // The first half under a budget, the second in RAM.
  const std::string root2 = tmp_.file("ck2");
  r = run_stratum(train_args(tokens_, kSteps) + budget_args(tmp_.file("off2"), 2) + " --save " + quote(root2) +
                  " --save-every 4");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("train --resume " + quote(root2 + "/step-00000004") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;

  // A finished run (a crash between its last checkpoint and its exit): resuming it trains nothing,
  // succeeds and reports the same bits, from the root or the step directory, in RAM or a budget.
  for (const std::string& extra : {std::string(), budget_args(tmp_.file("off4"), 1)}) {
    for (const std::string& from : {root, root + "/step-00000008"}) {
      r = run_stratum("train --resume " + quote(from) + " --quiet" + extra);
      ASSERT_EQ(r.exit_code, 0) << r.errors;
      EXPECT_NE(r.errors.find("nothing left to train"), std::string::npos) << r.errors;
      EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
    }
  }
  EXPECT_EQ(latest_of(root), "step-00000008\n") << "resuming a finished run writes nothing";
}

TEST_F(Checkpoint, KeepsTheNewestAndLatestNamesAVerifiedOne) {
  const std::string root = tmp_.file("ck");
  const CommandResult r = run_stratum(train_args(tokens_, 5) + " --save " + quote(root) + " --save-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(root)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "run", "step-00000004", "step-00000005"}))
      << "--keep 2 by default; the owner file (Note [run identity]), no lock left behind";
  EXPECT_EQ(latest_of(root), "step-00000005\n");
  const CommandResult v = run_stratum("verify " + quote(root));
  EXPECT_EQ(v.exit_code, 0) << v.output << v.errors;
  EXPECT_NE(v.output.find("step-00000005 (latest): OK"), std::string::npos) << v.output;
  // A checkpoint is a Hugging Face directory: generate and info take it (and the root).
  const CommandResult info = run_stratum("info " + quote(root));
  EXPECT_EQ(info.exit_code, 0) << info.errors;
  EXPECT_NE(info.output.find("L2 H4 C64 ctx64 V2048"), std::string::npos) << info.output;
  // Resumed from step 1 with saves every 3 steps: its first save (step 3) removes the abandoned
  // steps 2, 4 and 5, so --keep 2 leaves its own 3 and 5 (it left the abandoned 4 beside 5).
  const std::string root2 = tmp_.file("ck2");
  ASSERT_EQ(run_stratum(train_args(tokens_, 5) + " --save " + quote(root2) + " --save-every 1 --keep 5").exit_code, 0);
  const CommandResult again =
      run_stratum("train --resume " + quote(root2 + "/step-00000001") + " --save-every 3 --keep 2 --quiet");
  ASSERT_EQ(again.exit_code, 0) << again.errors;
  EXPECT_EQ(checkpoint_list(root2), (std::vector<std::string>{"step-00000005", "step-00000003"}));
}

// A run killed while pruning, moving `latest` or claiming the root leaves ".tmp." names; the next
// run that claims the root removes them even when it has no step left to write (a kill after the
// last checkpoint: seen once in CheckpointCrash as "temporaries left").
TEST_F(Checkpoint, ARunThatClaimsTheRootRemovesAKilledRunsLeftovers) {
  const std::string root = tmp_.file("ck");
  const CommandResult r = run_stratum(train_args(tokens_, 3) + " --save " + quote(root) + " --save-every 1");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::filesystem::create_directories(root + "/.step-00000001.tmp.99999.old");
  file_write_atomic(root + "/.step-00000001.tmp.99999.old/model.safetensors", std::string("half"));
  file_write_atomic(root + "/latest.tmp.99999", std::string("step-0000"));
  file_write_atomic(root + "/run.tmp.99999", std::string("stratum-run"));
  ASSERT_EQ(checkpoint_temporaries(root), 3);
  const CommandResult again = run_stratum("train --resume " + quote(root) + " --quiet");
  EXPECT_EQ(again.exit_code, 0) << again.errors;
  EXPECT_EQ(checkpoint_temporaries(root), 0);
  EXPECT_EQ(latest_of(root), "step-00000003\n");
  EXPECT_EQ(run_stratum("verify " + quote(root)).exit_code, 0);
}

TEST_F(Checkpoint, WriteFaultsAndACrashMidWriteLeaveThePreviousCheckpoint) {
  const std::string root = tmp_.file("ck");
  CommandResult r =
      run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 3 --keep 3");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string first = root + "/step-00000003";
  std::filesystem::remove_all(root + "/step-00000006");
  std::filesystem::remove_all(root + "/step-00000008");
  file_write_atomic(root + "/latest", "step-00000003\n");

  struct Fault {
    const char* spec;
    int exit_code;
    const char* words;
  } faults[] = {{"enospc@optimizer.safetensors", 1, "No space left on device"},
                {"eio@trainer_state.json", 1, "Input/output error"},
                {"enospc@model.safetensors", 1, "No space left on device"},
                {"kill@optimizer.safetensors", 128 + SIGKILL, ""}};
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.spec);
    {
      ScopedEnv fault("STRATUM_FILE_FAULT", f.spec);
      r = run_stratum("train --resume " + quote(root) + " --save-every 1");
    }
    EXPECT_EQ(r.exit_code, f.exit_code) << r.errors;
    if (f.exit_code == 1) {
      EXPECT_NE(r.errors.find(f.words), std::string::npos) << r.errors;
      EXPECT_NE(r.errors.find("[checkpoint] saving step 4"), std::string::npos) << r.errors;
      EXPECT_NE(r.errors.find("the checkpoints written before are intact"), std::string::npos) << r.errors;
      EXPECT_EQ(checkpoint_temporaries(root), 0) << "a failed write removes its temporary directory";
    } else {
      EXPECT_EQ(checkpoint_temporaries(root), 1) << "SIGKILL mid-write leaves the temporary directory (removed next time)";
    }
    EXPECT_EQ(latest_of(root), "step-00000003\n");
    EXPECT_FALSE(dir_exists(root + "/step-00000004"));
    EXPECT_TRUE(checkpoint_verify(first).ok()) << checkpoint_verify(first).problem;
  }
  r = run_stratum("train --resume " + quote(root));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_);
  EXPECT_EQ(checkpoint_temporaries(root), 0);
}

TEST_F(Checkpoint, DamagedCheckpointsAreDetectedAndSkipped) {
  const std::string root = tmp_.file("ck");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 2 --keep 4");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  // Damage the newest three: truncated, one bit flipped, a file missing.
  const std::string s8 = root + "/step-00000008", s6 = root + "/step-00000006", s4 = root + "/step-00000004";
  std::filesystem::resize_file(s8 + "/model.safetensors", file_size_bytes(s8 + "/model.safetensors") - 100);
  {
    std::string bytes = file_read_all(s6 + "/optimizer.safetensors");
    bytes[bytes.size() / 2] ^= 0x10;
    file_write_atomic(s6 + "/optimizer.safetensors", bytes);
  }
  std::filesystem::remove(s4 + "/trainer_state.json");

  const CommandResult v = run_stratum("verify " + quote(root));
  EXPECT_EQ(v.exit_code, 1);
  for (const char* words : {"model.safetensors: WRONG SIZE", "optimizer.safetensors: CHECKSUM MISMATCH",
                            "trainer_state.json: MISSING", "step-00000002: OK", "3 of 4 checkpoints failed"})
    EXPECT_NE(v.output.find(words), std::string::npos) << words << " in:\n" << v.output;
  // One damaged checkpoint verified alone: no advice to resume from it.
  const CommandResult one = run_stratum("verify " + quote(s6));
  EXPECT_EQ(one.exit_code, 1);
  EXPECT_NE(one.output.find("the checkpoint failed verification\n"), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("--resume"), std::string::npos) << one.output;

  // A damaged checkpoint named directly is refused with the reason...
  r = run_stratum("train --resume " + quote(s6) + " --quiet --data " + quote(tokens_));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("does not match its checksum"), std::string::npos) << r.errors;
  // ...and from the root the newest good one is used, saying what was skipped.
  r = run_stratum("train --resume " + quote(root) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  for (const char* words : {"skipped step-00000008", "truncated", "skipped step-00000006", "skipped step-00000004",
                            "resuming from " /* step 2 */})
    EXPECT_NE(r.errors.find(words), std::string::npos) << words << " in:\n" << r.errors;
  EXPECT_NE(r.errors.find("step-00000002 (step 2 of 8)"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_);
  EXPECT_TRUE(checkpoint_verify(s8).ok()) << "the damaged step 8 was replaced by a good one";
  EXPECT_EQ(latest_of(root), "step-00000008\n");
}

// Note [run identity]: a --save root belongs to one run. A fresh run into a root that holds
// another run's checkpoints is refused (the root untouched), a root in use is locked, and
// resuming from a root never falls back to a checkpoint another run wrote into it.
TEST_F(Checkpoint, ASaveDirectoryBelongsToOneRun) {
  const std::string root = tmp_.file("ck"), other = tmp_.file("other");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 2 --keep 3");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string owner = file_read_all(root + "/run");
  EXPECT_EQ(owner.rfind("stratum-run ", 0), 0u) << owner;
  EXPECT_FALSE(file_exists(root + "/stratum-save.lock")) << "the lock goes with the run";

  // A different run (another seed) into the same root: refused, nothing touched.
  r = run_stratum(train_args(tokens_, kSteps) + " --seed 7 --save " + quote(root));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("already holds checkpoints of another run (newest step-00000008)"), std::string::npos)
      << r.errors;
  EXPECT_NE(r.errors.find("--resume " + root), std::string::npos) << r.errors;
  EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << r.errors;
  EXPECT_EQ(checkpoint_list(root), (std::vector<std::string>{"step-00000008", "step-00000006", "step-00000004"}));
  EXPECT_EQ(latest_of(root), "step-00000008\n");
  EXPECT_EQ(file_read_all(root + "/run"), owner);
  EXPECT_TRUE(checkpoint_verify(root + "/step-00000008").ok());

  // While a run holds the root, a second one is refused before it trains.
  {
    const DirLock held(root, "stratum-save.lock", "held by the test");
    r = run_stratum("train --resume " + quote(root) + " --save " + quote(root) + " --quiet");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.errors.find("another stratum run is saving into --save '" + root + "'"), std::string::npos)
        << r.errors;
  }

  // Another run's checkpoint copied in beside ours, ours damaged: resuming skips both.
  r = run_stratum(train_args(tokens_, 7) + " --seed 7 --save " + quote(other) + " --save-every 7");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::filesystem::copy(other + "/step-00000007", root + "/step-00000007", std::filesystem::copy_options::recursive);
  ASSERT_TRUE(checkpoint_verify(root + "/step-00000007").ok());
  std::string bytes = file_read_all(root + "/step-00000008/model.safetensors");
  bytes[bytes.size() / 2] ^= 0x10;
  file_write_atomic(root + "/step-00000008/model.safetensors", bytes);
  r = run_stratum("train --resume " + quote(root) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("skipped step-00000007: written by another run"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("step-00000006 (step 6 of 8)"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << "continued this run's model, not the other one's";
  EXPECT_EQ(file_read_all(root + "/run"), owner) << "a resumed run keeps its identity";
}

// Note [checked reads]: a checkpoint with one word flipped is refused by every reader (it was
// used silently: generate printed one id over and over, info and train --model went on), and a
// plain Hugging Face directory, which has no manifest, is refused when a weight is not finite.
TEST_F(Checkpoint, CorruptOrNonFiniteWeightsAreRefusedByEveryReader) {
  const std::string root = tmp_.file("ck");
  CommandResult r = run_stratum(train_args(tokens_, 2) + " --save " + quote(root));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string step = root + "/step-00000002";
  // A plain HF copy (no manifest) before the damage.
  const std::string plain = tmp_.file("plain");
  std::filesystem::create_directories(plain);
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(step + "/" + file, plain + "/" + file);
  std::string bytes = file_read_all(step + "/model.safetensors");
  bytes[bytes.size() - 1000] ^= 0x01;  // one bit of one weight
  file_write_atomic(step + "/model.safetensors", bytes);

  const std::string gen = " --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --quiet";
  const std::string train_model = " --steps 2 --batch 4 --seq 32 --threads 2 --quiet --data " + quote(tokens_);
  for (const std::string& command : {"generate --model " + quote(root) + gen, "info " + quote(root),
                                     "train --model " + quote(root) + train_model}) {
    r = run_stratum(command);
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_NE(r.errors.find("does not match its manifest: model.safetensors does not match its checksum"),
              std::string::npos)
        << command << ": " << r.errors;
    EXPECT_NE(r.errors.find("stratum verify"), std::string::npos) << r.errors;
    EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << r.errors;
  }

  // The plain copy is read without checksums (info says so); a NaN in it is found when loading.
  r = run_stratum("info " + quote(plain));
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("no manifest.json (a plain Hugging Face directory): not checksummed"), std::string::npos)
      << r.output;
  r = run_stratum("generate --model " + quote(plain) + gen);
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  std::string weights = file_read_all(plain + "/model.safetensors");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&weights[weights.size() - 400], &nan, sizeof nan);  // the last tensor's data (4-aligned: F32)
  file_write_atomic(plain + "/model.safetensors", weights);
  for (const std::string& command : {"generate --model " + quote(plain) + gen, "train --model " + quote(plain) + train_model}) {
    r = run_stratum(command);
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_NE(r.errors.find("holds nan at element"), std::string::npos) << command << ": " << r.errors;
    EXPECT_NE(r.errors.find("corrupt, or saved from a run that diverged"), std::string::npos) << r.errors;
  }

  // A loss that overflows with clipping on does not suggest turning clipping on.
  std::string overflow = train_args(tokens_, 4) + " --grad-clip 1";
  overflow.replace(overflow.find("--lr 1e-3"), 9, "--lr 1e30");
  r = run_stratum(overflow);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("loss became"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("lower --lr"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("--grad-clip"), std::string::npos) << r.errors;

  // A last update that diverges (the loss before it was finite) is not saved as a checkpoint that
  // every reader above would refuse: one line and exit 1, no checkpoint (it had exit 0).
  const std::string diverged_root = tmp_.file("diverged");
  std::string diverge = train_args(tokens_, 1) + " --weight-decay 1e30 --save " + quote(diverged_root);
  diverge.replace(diverge.find("--lr 1e-3"), 9, "--lr 1e30");
  r = run_stratum(diverge);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("holds a NaN or infinity: training diverged"), std::string::npos) << r.errors;
  EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 4) << r.errors;  // three [stratum] lines, the error
  EXPECT_EQ(latest_of(diverged_root), "");
  EXPECT_FALSE(file_exists(diverged_root + "/step-00000001"));
}

// A broken `latest` (empty, naming a checkpoint that is gone, pointing outside the root) is read
// one way (checkpoint_latest) and gets the same fallback everywhere: verify reports it and exits
// 1 (it said all was fine), info, generate and --resume say so and use the newest checkpoint that
// verifies (they said config.json or the step directory was missing).
TEST_F(Checkpoint, ABrokenLatestIsReportedAndHandledTheSameEverywhere) {
  const std::string root = tmp_.file("ck");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 4");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const struct {
    const char* content;
    const char* problem;
  } cases[] = {{"", "'latest' is empty"},
               {"step-00000099\n", "'latest' names 'step-00000099', which does not exist"},
               {"../other\n", "'latest' names '../other', which is not a checkpoint of this directory"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.problem);
    file_write_atomic(root + "/latest", c.content);
    r = run_stratum("verify " + quote(root));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(root + "/latest: BAD: " + c.problem), std::string::npos) << r.output;
    for (const std::string& command :
         {"info " + quote(root), "generate --model " + quote(root) + " --prompt-ids 1,2 --max-tokens 2 --quiet",
          "train --resume " + quote(root) + " --quiet"}) {
      r = run_stratum(command);
      EXPECT_EQ(r.exit_code, 0) << command << ": " << r.errors;
      EXPECT_NE(r.errors.find(c.problem), std::string::npos) << command << ": " << r.errors;
    }
    EXPECT_NE(r.errors.find("nothing left to train"), std::string::npos) << "resumed step 8: " << r.errors;
  }
  // A 'latest' that is a directory is not called missing.
  std::filesystem::remove(root + "/latest");
  std::filesystem::create_directory(root + "/latest");
  r = run_stratum("verify " + quote(root));
  EXPECT_NE(r.output.find(root + "/latest: BAD: 'latest' is not a file"), std::string::npos) << r.output;
  // Nor one that is a symbolic link to nothing.
  std::filesystem::remove(root + "/latest");
  std::filesystem::create_symlink(root + "/gone", root + "/latest");
  r = run_stratum("verify " + quote(root));
  EXPECT_NE(r.output.find(root + "/latest: BAD: 'latest' is a symbolic link to nothing"), std::string::npos)
      << r.output;
}

// A damaged newest checkpoint gives a resume neither its options nor its model: the options a
// resume leaves out, and the model a rerun command's shape flags are checked against, come from
// the checkpoint that verifies (before, a truncated trainer_state.json or config.json stopped the
// resume, and an edited one was used). A newest checkpoint without its manifest is skipped by
// every reader of the root, as verify and --resume skip it (before, generate and info read it
// unchecked as a plain Hugging Face directory).
TEST_F(Checkpoint, ADamagedNewestCheckpointGivesNeitherItsOptionsNorItsModel) {
  const std::string good = tmp_.file("good");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(good) + " --save-every 4");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const struct {
    const char* name;
    std::function<void(const std::string& newest)> damage;
    bool rerun_command;  // resume with the command that started the run, else `--resume ROOT` alone
  } cases[] = {
      {"options edited",
       [](const std::string& newest) {
         std::string state = file_read_all(newest + "/trainer_state.json");
         const std::size_t at = state.find("\"total_steps\": 8");
         ASSERT_NE(at, std::string::npos) << state;
         state.replace(at, 16, "\"total_steps\": 6");
         file_write_atomic(newest + "/trainer_state.json", state);
       },
       false},
      {"trainer state truncated",
       [](const std::string& newest) { std::filesystem::resize_file(newest + "/trainer_state.json", 300); }, false},
      {"config truncated", [](const std::string& newest) { std::filesystem::resize_file(newest + "/config.json", 10); },
       true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string root = tmp_.file(std::string("ck_") + c.name);
    std::filesystem::copy(good, root, std::filesystem::copy_options::recursive);
    c.damage(root + "/step-00000008");
    r = run_stratum(c.rerun_command ? train_args(tokens_, kSteps) + " --save " + quote(root) + " --resume " + quote(root)
                                    : "train --resume " + quote(root) + " --quiet");
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_NE(r.errors.find("skipped step-00000008"), std::string::npos) << r.errors;
    EXPECT_NE(r.errors.find("resuming from " + root + "/step-00000004"), std::string::npos) << r.errors;
    EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
    EXPECT_EQ(latest_of(root), "step-00000008\n");
  }
  const std::string root = tmp_.file("ck_no_manifest");
  std::filesystem::copy(good, root, std::filesystem::copy_options::recursive);
  std::filesystem::remove(root + "/step-00000008/manifest.json");
  for (const std::string& command :
       {"info " + quote(root), "generate --model " + quote(root) + " --prompt-ids 1,2 --max-tokens 2 --quiet"}) {
    r = run_stratum(command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.errors;
    EXPECT_NE(r.errors.find("skipped step-00000008: manifest.json is missing"), std::string::npos)
        << command << ": " << r.errors;
    EXPECT_NE(r.errors.find("using " + root + "/step-00000004"), std::string::npos) << command << ": " << r.errors;
  }
}

// A resume that leaves out the budget, offload directory and thread count continues the run as
// it was (Note [option table]): under its budget (before, it trained everything in RAM, which a
// model larger than RAM does not survive) and with its thread count (before, all CPUs: the CPU's
// matrix products' bits depend on it). --mem-budget 0 drops the budget; another --threads is
// taken and said to change the bits.
TEST_F(Checkpoint, APlainResumeContinuesUnderTheRunsBudgetAndThreads) {
  const std::string root = tmp_.file("ck");
  const std::string offload = tmp_.file("off");
  const std::string log = tmp_.file("run.jsonl");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + budget_args(offload, 2) + " --save " + quote(root) +
                                " --save-every 4 --log " + quote(log));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_);
  const std::string s4 = quote(root + "/step-00000004");
  file_write_atomic(log, file_read_all(log).substr(0, file_read_all(log).find("\"step\":6")));  // a kill in step 6
  r = run_stratum("train --resume " + s4 + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  // ... and logs to the run's file: the records after step 4 written again, as one run's.
  EXPECT_EQ(losses(log), ref_losses_);
  // A fork (saving elsewhere) is another run: it leaves the run's log alone (it dropped the
  // records after step 4 and wrote its own there) and says how to log it.
  const std::string whole_log = file_read_all(log);
  r = run_stratum("train --resume " + s4 + " --save " + quote(tmp_.file("fork")) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("not logging to its --log"), std::string::npos) << r.errors;
  EXPECT_EQ(file_read_all(log), whole_log);
  EXPECT_NE(r.errors.find("memory: budget 4.0 MiB"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("offload to " + offload + ":"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("prefetch 2"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("| 2 threads,"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
  r = run_stratum("train --resume " + s4 + " --save " + quote(tmp_.file("b")) + " --mem-budget 0 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("memory: everything in RAM"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
  r = run_stratum("train --resume " + s4 + " --save " + quote(tmp_.file("c")) + " --mem-budget 0 --prefetch 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("--prefetch only applies"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("forks the run"), std::string::npos) << "a refused fork says only why: " << r.errors;
  r = run_stratum("train --resume " + s4 + " --save " + quote(tmp_.file("d")) + " --threads 1 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("resume: 1 threads where the checkpoint trained on 2"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("--threads 2 keeps them"), std::string::npos) << r.errors;
}

TEST_F(Checkpoint, ResumeRefusesAnIncompatibleRun) {
  const std::string root = tmp_.file("ck");
  CommandResult r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 4");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string s4 = quote(root + "/step-00000004");
  const std::string other = testing::write_random_tokens(tmp_.file("other.bin"), 20000, 2048, 6);
  struct Bad {
    std::string flags, words;
  } bad[] = {{" --batch 8", "--batch is 8 but the checkpoint was trained with 4"},
             {" --steps 20", "--steps is 20 but the checkpoint was trained with 8"},
             {" --lr 0.01", "--lr is 0.01 but the checkpoint was trained with 0.001"},
             {" --data " + quote(other), "the training data"},
             {" --layers 3", "--layers is 3 but the checkpoint was trained with 2"},
             {" --model " + quote(testing::source_path("tests/golden/tiny_gpt2")), "--model"},
             {" --keep 0", "--keep"}};
  for (const Bad& b : bad) {
    r = run_stratum("train --resume " + s4 + b.flags);
    EXPECT_EQ(r.exit_code, 1) << b.flags;
    EXPECT_NE(r.errors.find(b.words), std::string::npos) << b.flags << ": " << r.errors;
    EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << "one line: " << r.errors;
  }
  // The data file changed in place and no flag was given: the fix is the data, not a flag.
  std::filesystem::copy_file(other, tokens_, std::filesystem::copy_options::overwrite_existing);
  r = run_stratum("train --resume " + s4);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("the training data"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("give the data it was trained on, unchanged"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("leave the flag out"), std::string::npos) << r.errors;
  // A trainer state from another version of the format.
  const std::string s8 = root + "/step-00000008";
  std::string state = file_read_all(s8 + "/trainer_state.json");
  state.replace(state.find("\"version\": 3"), 12, "\"version\": 9");
  file_write_atomic(s8 + "/trainer_state.json", state);
  r = run_stratum("verify " + quote(s8));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("CHECKSUM MISMATCH"), std::string::npos) << r.output;
  r = run_stratum("train --resume " + quote(tmp_.file("nothing_here")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("does not exist"), std::string::npos) << r.errors;
}

// A crash loop or a job scheduler reruns the very command that started the run with --resume
// added: every option equal to the checkpoint's, the shape flags and --model included, is
// accepted, and the run continues to the uninterrupted bits.
TEST_F(Checkpoint, RerunningTheSameCommandWithResumeAddedContinues) {
  const std::string root = tmp_.file("ck");
  const std::string command = train_args(tokens_, kSteps) + " --save " + quote(root) + " --save-every 4 --keep 5";
  CommandResult r = run_stratum(command);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum(command + " --resume " + quote(root + "/step-00000004"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("resuming from " + root + "/step-00000004"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
  // The finished run, resumed by the same command: nothing to train, the same bits.
  r = run_stratum(command + " --resume " + quote(root));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
  // A run started from a model directory, rerun with --resume: --model names the same model.
  const std::string root2 = tmp_.file("ck2");
  const std::string from_model = "train --model " + quote(root + "/step-00000004") +
                                 " --batch 4 --seq 32 --lr 1e-3 --threads 2 --quiet --steps 4 --data " +
                                 quote(tokens_) + " --save " + quote(root2) + " --save-every 2";
  r = run_stratum(from_model);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = params_hash(r);
  r = run_stratum(from_model + " --resume " + quote(root2 + "/step-00000002"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), hash) << r.errors;
  // A real mismatch is refused in one line naming the flag, the given value and the checkpoint's.
  std::string other_heads = command;
  other_heads.replace(other_heads.find("--heads 4"), 9, "--heads 2");
  r = run_stratum(other_heads + " --resume " + quote(root + "/step-00000004"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("--heads is 2 but the checkpoint was trained with 4"), std::string::npos) << r.errors;
  // A Llama run's command rerun: its --kv-heads (a Llama flag) is read over the checkpoint's
  // model, without --arch (it was refused as "for --arch llama" whatever its value); --arch gpt2
  // against a Llama checkpoint is a mismatch.
  const std::string root_llama = tmp_.file("ckl");
  const std::string llama = "train --arch llama --layers 1 --heads 4 --kv-heads 2 --embd 32 --ctx 32 --vocab 2048 "
                            "--batch 2 --seq 16 --steps 2 --threads 2 --quiet --data " + quote(tokens_) +
                            " --save " + quote(root_llama);
  ASSERT_EQ(run_stratum(llama).exit_code, 0);
  r = run_stratum("train --resume " + quote(root_llama) + " --kv-heads 2 --steps 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("train --resume " + quote(root_llama) + " --kv-heads 1 --quiet");
  EXPECT_NE(r.errors.find("--kv-heads is 1 but the checkpoint was trained with 2"), std::string::npos) << r.errors;
  r = run_stratum("train --resume " + quote(root_llama) + " --arch gpt2 --quiet");
  EXPECT_NE(r.errors.find("--arch is gpt2 but the checkpoint was trained with llama"), std::string::npos) << r.errors;
  r = run_stratum("train --resume " + quote(root + "/step-00000004") + " --kv-heads 4 --quiet");
  EXPECT_NE(r.errors.find("--kv-heads is for --arch llama but the checkpoint's model is gpt2"), std::string::npos)
      << r.errors;
  // A Qwen3 run whose heads are wider than C/H (--head-dim, Note [qk norm]): saved as one, its
  // rerun command resumes, another --head-dim is a mismatch, and GPT-2 has no such flag.
  const std::string root_qwen3 = tmp_.file("ckq3");
  const std::string qwen3 = "train --arch qwen3 --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --embd 32 --ctx 32 "
                            "--vocab 2048 --batch 2 --seq 16 --steps 2 --threads 2 --quiet --data " + quote(tokens_);
  ASSERT_EQ(run_stratum(qwen3 + " --save " + quote(root_qwen3)).exit_code, 0);
  const std::string qwen3_config = file_read_all(root_qwen3 + "/step-00000002/config.json");
  EXPECT_NE(qwen3_config.find("\"Qwen3ForCausalLM\""), std::string::npos) << qwen3_config;
  EXPECT_NE(qwen3_config.find("\"head_dim\": 16"), std::string::npos) << qwen3_config;
  r = run_stratum("train --resume " + quote(root_qwen3) + " --head-dim 16 --steps 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("train --resume " + quote(root_qwen3) + " --head-dim 8 --quiet");
  EXPECT_NE(r.errors.find("--head-dim is 8 but the checkpoint was trained with 16"), std::string::npos) << r.errors;
  r = run_stratum("train --arch gpt2 --head-dim 16 --steps 1 --quiet --data " + quote(tokens_));
  EXPECT_NE(r.errors.find("--head-dim is for --arch llama"), std::string::npos) << r.errors;
  // The restart of a run stopped before its first checkpoint: --resume names its own --save
  // directory, which does not exist yet or holds none; the run starts there (it was refused
  // forever), to the same bits. A --resume of another empty directory is still refused.
  const std::string root3 = tmp_.file("ck3");
  const std::string fresh = train_args(tokens_, kSteps) + " --save " + quote(root3) + " --resume " + quote(root3);
  r = run_stratum(fresh);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("holds no checkpoint yet"), std::string::npos) << r.errors;
  EXPECT_EQ(params_hash(r), ref_hash_) << r.errors;
  std::filesystem::remove_all(root3);
  std::filesystem::create_directories(root3);
  r = run_stratum(fresh);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(latest_of(root3), "step-0000000" + std::to_string(kSteps) + "\n");
  std::filesystem::create_directories(tmp_.file("empty"));
  r = run_stratum(train_args(tokens_, kSteps) + " --save " + quote(root3) + " --resume " + quote(tmp_.file("empty")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("holds no checkpoint"), std::string::npos) << r.errors;
}

// Waits until `log` has at least `lines` records (or the process ended).
void wait_for_log(StratumProcess& p, const std::string& log, std::size_t lines) {
  for (int i = 0; i < 3000 && p.running(); ++i) {
    if (file_exists(log) && testing::read_jsonl(log).size() >= lines) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Versions 2 and 3 hash with XXH3; a version-1 trainer state or manifest (Stratum's own hashes)
// is refused in one line naming the versions read, never verified against the wrong hash.
TEST(CheckpointFormat, VersionOneIsRefusedNamingBothVersions) {
  std::string text = trainer_state_json(testing::trainer_state_minimal());
  ASSERT_NE(text.find("\"version\": 3"), std::string::npos) << text;
  text.replace(text.find("\"version\": 3"), 12, "\"version\": 1");
  CheckpointManifest manifest;
  manifest.step = 1;
  std::string mtext = manifest_json(manifest);
  ASSERT_NE(mtext.find("\"version\": 3"), std::string::npos) << mtext;
  mtext.replace(mtext.find("\"version\": 3"), 12, "\"version\": 1");
  for (const auto& parse : {std::function<void()>([&] { trainer_state_parse(text, "state"); }),
                            std::function<void()>([&] { manifest_parse(mtext, "manifest"); })}) {
    try {
      parse();
      ADD_FAILURE() << "version 1 was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("version 1 is not supported"), std::string::npos) << what;
      EXPECT_NE(what.find("reads versions 2 to 3"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

// checkpoint_write verifies before the final name: a checkpoint that does not verify is never
// left as step-NNNNNNNN (it was, with `latest` still on the previous one); pruning renames a
// checkpoint out of sight before deleting it, and the leftovers of a kill mid-delete are removed
// by the next write.
// A --save disk that cannot hold the run's checkpoints is refused before training (the first
// save failed after the whole run with --save-every 0). The root peaks at keep + 1 checkpoints.
TEST(CheckpointFormat, TheSaveRootsPeakIsKeepPlusOne) {
  EXPECT_EQ(checkpoint_peak_more(0, 1, 2), 1);  // one save at the end
  EXPECT_EQ(checkpoint_peak_more(0, 2, 2), 2);
  EXPECT_EQ(checkpoint_peak_more(0, 5, 2), 3);  // keep 2, a third written before the oldest goes
  EXPECT_EQ(checkpoint_peak_more(0, 5, 1), 2);
  EXPECT_EQ(checkpoint_peak_more(2, 5, 2), 1);  // a resumed root already holds its two
  EXPECT_EQ(checkpoint_peak_more(5, 3, 2), 1);  // more than --keep there: still the next one
  TempDir tmp;
  const std::string disk = tmp.file("disk");
  const testing::SmallDisk small(disk, "4m");
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here (not root)";
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 20000, 2048, 5);
  const CommandResult r = run_stratum(train_args(tokens, 4) + " --save " + quote(disk + "/ck") + " --save-every 1");
  EXPECT_EQ(r.exit_code, 1) << r.errors;
  EXPECT_NE(r.errors.find("checkpoints need about"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("3 checkpoints of"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("trained"), std::string::npos) << "refused before training: " << r.errors;
}

TEST(CheckpointFormat, OnlyVerifiedCheckpointsHaveFinalNamesAndPruningLeavesNoHalfCheckpoint) {
  TempDir tmp;
  const std::string root = tmp.file("ck");
  auto files = [](const std::string& state) {
    return [state](const std::string& dir) {
      for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors"})
        file_write_atomic(dir + "/" + f, std::string("x"));
      file_write_atomic(dir + "/trainer_state.json", state);
    };
  };
  try {
    checkpoint_write(root, 3, 2, files("{}"));
    ADD_FAILURE() << "a checkpoint whose trainer state does not parse was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not verify"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(checkpoint_list(root).empty()) << "no step-00000003";
  EXPECT_EQ(checkpoint_temporaries(root), 0);
  EXPECT_FALSE(file_exists(root + "/latest"));

  TrainerState state = testing::trainer_state_minimal();
  for (long step : {1, 2}) {
    state.step = step;
    checkpoint_write(root, step, 1, files(trainer_state_json(state)));
  }
  EXPECT_EQ(checkpoint_list(root), std::vector<std::string>{"step-00000002"});
  EXPECT_EQ(checkpoint_temporaries(root), 0) << "the pruned step-00000001 is gone, not left aside";
  // What a kill in the middle of pruning leaves: a half-deleted checkpoint under a temporary name.
  std::filesystem::create_directories(root + "/.step-00000001.tmp.999.old");
  file_write_atomic(root + "/.step-00000001.tmp.999.old/config.json", "x");
  EXPECT_EQ(checkpoint_list(root), std::vector<std::string>{"step-00000002"}) << "never taken for a checkpoint";
  state.step = 3;
  checkpoint_write(root, 3, 1, files(trainer_state_json(state)));
  EXPECT_EQ(checkpoint_temporaries(root), 0) << "the next write removes it";
  EXPECT_EQ(checkpoint_list(root), std::vector<std::string>{"step-00000003"});
  // A run resumed from step 1: its first save removes the later checkpoints (a future it
  // abandoned) before the --keep count (with --keep 2, writing step 2 after steps 3 and 5 removed
  // step 1, the run's own, and kept them for a fallback resume to take).
  for (long step : {1, 5}) {
    state.step = step;
    checkpoint_write(root, step, 3, files(trainer_state_json(state)));
  }
  state.step = 2;
  checkpoint_write(root, 2, 2, files(trainer_state_json(state)), /*abandon_after=*/1);
  EXPECT_EQ(checkpoint_list(root), (std::vector<std::string>{"step-00000002", "step-00000001"}));
  state.step = 4;
  checkpoint_write(root, 4, 2, files(trainer_state_json(state)));
  EXPECT_EQ(checkpoint_list(root), (std::vector<std::string>{"step-00000004", "step-00000002"}));
  EXPECT_EQ(checkpoint_temporaries(root), 0);
}

// Version 2, written before run identities, is still read: as a run of unknown identity.
TEST(CheckpointFormat, VersionTwoIsReadWithoutARunId) {
  TrainerState state = testing::trainer_state_minimal();
  state.run_id = 0x0123456789abcdefull;
  std::string text = trainer_state_json(state);
  EXPECT_EQ(trainer_state_parse(text, "state").run_id, state.run_id);
  const std::size_t at = text.find("  \"run_id\": \"0123456789abcdef\",\n");
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, std::string("  \"run_id\": \"0123456789abcdef\",\n").size());
  EXPECT_THROW(trainer_state_parse(text, "state"), Error) << "version 3 needs its run id";
  text.replace(text.find("\"version\": 3"), 12, "\"version\": 2");
  EXPECT_EQ(trainer_state_parse(text, "state").run_id, 0u);
}

TEST(CheckpointSignals, InterruptCheckpointsAndExitsZeroSecondInterruptQuitsAtOnce) {
  TempDir tmp;
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 20000, 2048, 5);
  const long steps = 300;
  const CommandResult ref = run_stratum(train_args(tokens, steps));
  ASSERT_EQ(ref.exit_code, 0) << ref.errors;

  const std::string root = tmp.file("ck"), log = tmp.file("log.jsonl");
  {
    StratumProcess p(train_args(tokens, steps) + " --save " + quote(root) + " --log " + quote(log));
    wait_for_log(p, log, 3);
    p.signal(SIGINT);
    const CommandResult r = p.wait();
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_NE(r.errors.find("continue with: stratum train --resume " + root), std::string::npos) << r.errors;
    const long done = static_cast<long>(testing::read_jsonl(log).size());
    ASSERT_LT(done, steps) << "interrupted before the end";
    EXPECT_EQ(latest_of(root), checkpoint_name(done) + "\n");
    EXPECT_TRUE(checkpoint_verify(root + "/" + checkpoint_name(done)).ok());
  }
  {
    // Interrupting twice ends the process at once (by the signal); the checkpoint stays good.
    StratumProcess p("train --resume " + quote(root) + " --log " + quote(log));
    wait_for_log(p, log, testing::read_jsonl(log).size() + 2);
    p.signal(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    p.signal(SIGINT);
    const CommandResult r = p.wait();
    EXPECT_TRUE(r.exit_code == 128 + SIGINT || r.exit_code == 0) << r.exit_code << r.errors;
    const CheckpointCheck check = checkpoint_verify(checkpoint_model_dir(root));
    EXPECT_TRUE(check.ok()) << check.problem;
  }
  const CommandResult r = run_stratum("train --resume " + quote(root) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), params_hash(ref));
}

// The CI-sized crash test (tools/crash_test.sh runs any count): SIGKILL at random moments,
// checkpointing every step (so many kills land in a checkpoint write), resuming each time,
// alternating in RAM and under a budget; the final parameters equal the uninterrupted run's.
TEST(CheckpointCrash, RandomKillsThenResumeGiveTheUninterruptedBits) {
  TempDir tmp;
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 20000, 2048, 7);
  const long steps = 40;
  const auto t0 = std::chrono::steady_clock::now();
  const CommandResult ref = run_stratum(train_args(tokens, steps) + " --save " + quote(tmp.file("ref")) +
                                        " --save-every 1");
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(ref.exit_code, 0) << ref.errors;

  // Rounds of: start fresh, then kill/resume until a run finishes, alternating in RAM and under a
  // budget; each finished round must give the reference bits. Until 10 kills have landed.
  const testing::CrashRounds c =
      testing::crash_rounds(tmp.path(), run_ms, params_hash(ref), 10, [&](const std::string& root, int run) {
        // A kill between a checkpoint's rename and `latest` leaves step-N without `latest`:
        // --resume takes the newest that verifies, as it tells a user to.
        std::string args = !checkpoint_list(root).empty()
                               ? "train --resume " + quote(root) + " --quiet"
                               : train_args(tokens, steps) + " --save " + quote(root) + " --save-every 1";
        if (run % 2 == 0) args += budget_args(tmp.file("off"), 1 + run % 3);
        return args;
      });
  EXPECT_EQ(c.problem, "");
  std::printf("[crash test] %d kills, %d runs, %d rounds, every round exact\n", c.kills, c.runs, c.rounds);

  // The issue-13 fault scenarios on the last round's directory, so that they stay fixed.
  const std::string root = c.last_root;
  const std::string newest = checkpoint_model_dir(root);
  // A fresh run into a directory holding another run's checkpoints is refused (it pruned them).
  CommandResult r = run_stratum(train_args(tokens, steps) + " --save " + quote(root) + " --seed 5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.errors.find("already holds checkpoints of another run"), std::string::npos) << r.errors;
  // An output naming an input is refused before anything is written.
  const std::string before = file_read_all(tokens);
  r = run_stratum(train_args(tokens, steps) + " --log " + quote(tokens));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(file_read_all(tokens), before);
  // One flipped word in the newest weights: every reader refuses it, resume falls back to the one
  // before and finishes with the uninterrupted bits.
  std::string weights = file_read_all(newest + "/model.safetensors");
  weights[weights.size() - 3] ^= 0x40;
  file_write_atomic(newest + "/model.safetensors", weights);
  for (const std::string& command : {"generate --model " + quote(newest) + " --prompt-ids 1,2 --max-tokens 2",
                                     "info " + quote(newest), "verify " + quote(root)}) {
    r = run_stratum(command);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.errors << r.output;
  }
  r = run_stratum("train --resume " + quote(root) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), params_hash(ref)) << r.errors;
  // A broken `latest` is named, and the newest checkpoint that verifies is used.
  file_write_atomic(root + "/latest", "step-99999999\n");
  r = run_stratum("generate --model " + quote(root) + " --prompt-ids 1,2 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("'latest' names 'step-99999999'"), std::string::npos) << r.errors;
  // What a kill between a checkpoint's rename and its `latest` leaves: no `latest`. --resume takes
  // the newest checkpoint that verifies (the crash harnesses above resume such a root).
  std::filesystem::remove(root + "/latest");
  r = run_stratum("train --resume " + quote(root) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(params_hash(r), params_hash(ref)) << r.errors;
}

}  // namespace
}  // namespace stratum
