// Data-parallel training over MPI (Note [data parallel] in exec/executor.h), run as `mpirun -np P
// stratum train ...` on loopback (oversubscribed; allowed as root, where CI runs as root): for
// P = 1, 2, 3 ranks, in RAM and under a budget, with clipping and without, the parameters after
// training are the single process's bits (same --grad-accum); a checkpoint written by 2 ranks
// resumes on 3 ranks and on one process to the same bits; a --grad-accum that the ranks do not
// divide is refused; a rank killed mid-run ends the job within seconds, naming the rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "formats/safetensors.h"
#include "integration_util.h"
#include "weights/model_io.h"

namespace stratum {
namespace {

using testing::CommandResult;
using testing::run_stratum;
using testing::ScopedEnv;
using testing::StratumProcess;
using testing::TempDir;

// mpirun on one machine, whoever runs it: root allowed, more ranks than cores, no single-copy
// shared memory (refused by the kernel's ptrace rules in some containers). Under the sanitizer
// pass (tools/sanitize.sh) the ranks keep every check but the leak report: Open MPI's own
// components leave allocations behind at MPI_Finalize, in libraries unloaded by then.
std::string mpirun(int ranks) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string env = "env ASAN_OPTIONS='" + std::string(asan != nullptr ? asan : "") + ":detect_leaks=0' ";
  return env + "mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none -np " + std::to_string(ranks) + " ";
}

class DataParallel : public ::testing::Test {
 protected:
  ScopedEnv root_{"OMPI_ALLOW_RUN_AS_ROOT", "1"};
  ScopedEnv root_confirm_{"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"};
};

// A child process of `parent` whose command line holds `name` (/proc/PID/cmdline), or -1.
pid_t child_named(pid_t parent, const std::string& name) {
  pid_t found = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream file(entry.path().string() + "/stat");  // gone already: empty
    const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const std::size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 >= stat.size()) continue;
    const long ppid = std::strtol(stat.c_str() + close + 4, nullptr, 10);  // ") S PPID"
    if (ppid != parent) continue;
    std::ifstream cmdline(entry.path().string() + "/cmdline");
    const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (args.find(name) != std::string::npos) found = static_cast<pid_t>(std::stol(pid));
  }
  return found;
}

CommandResult run_ranks(int ranks, const std::string& args) {
  StratumProcess p(args, ranks > 0 ? mpirun(ranks) : "");
  return p.wait();
}

std::string params_hash(const CommandResult& r) {
  const std::size_t at = r.errors.rfind("params hash ");
  EXPECT_NE(at, std::string::npos) << r.errors;
  return at == std::string::npos ? std::string() : r.errors.substr(at + 12, 16);
}

std::string model_args(const TempDir& tmp) {
  const std::string data = testing::write_random_tokens(tmp.file("tokens.bin"), 6000, 1024, 3);
  return "--layers 3 --heads 2 --embd 64 --ctx 32 --vocab 1024 --seq 32 --batch 2 --data " + data +
         " --threads 1 --quiet --lr 1e-3 --shuffle --eval-every 2 --eval-batches 2 ";
}

TEST_F(DataParallel, SameBitsAsOneProcessForOneTwoThreeRanks) {
  TempDir tmp;
  const std::string model = model_args(tmp);
  for (const std::string clip : {"1.0", "0"}) {
    SCOPED_TRACE("--grad-clip " + clip);
    const std::string args = "train " + model + "--steps 4 --grad-accum 6 --grad-clip " + clip;
    const CommandResult one = run_stratum(args);
    ASSERT_EQ(one.exit_code, 0) << one.errors;
    const std::string want = params_hash(one);
    for (const int ranks : {1, 2, 3}) {
      const CommandResult r = run_ranks(ranks, args);
      ASSERT_EQ(r.exit_code, 0) << r.errors;
      EXPECT_EQ(params_hash(r), want) << ranks << " ranks";
      if (ranks > 1) {
        EXPECT_NE(r.errors.find("on " + std::to_string(ranks) + " ranks"), std::string::npos) << r.errors;
      }
    }
    // Each rank streams its own copy of the state through its own directory under one budget.
    const CommandResult streamed =
        run_ranks(2, args + " --mem-budget 4M --offload-dir " + tmp.path() + " --prefetch 1");
    ASSERT_EQ(streamed.exit_code, 0) << streamed.errors;
    EXPECT_EQ(params_hash(streamed), want);
    EXPECT_NE(streamed.errors.find("tier traffic"), std::string::npos);
  }
}

// Note [masked loss]: with a loss mask every rank scales by the step's counted targets on all
// ranks (all-gathered), so 2 and 3 ranks still give the single process's bits; a run without the
// mask is another run.
TEST_F(DataParallel, MaskedLossSameBitsAsOneProcess) {
  TempDir tmp;
  const std::string data = testing::write_masked_tokens(tmp.file("sft.bin"), 6000, 1024, 5);
  const std::string args = "train --layers 2 --heads 2 --embd 64 --ctx 32 --vocab 1024 --seq 32 --batch 2 --data " +
                           data + " --threads 1 --quiet --lr 1e-3 --shuffle --steps 3 --grad-accum 6";
  const CommandResult one = run_stratum(args);
  ASSERT_EQ(one.exit_code, 0) << one.errors;
  const std::string want = params_hash(one);
  for (const int ranks : {2, 3}) {
    const CommandResult r = run_ranks(ranks, args);
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_EQ(params_hash(r), want) << ranks << " ranks";
  }
  std::vector<std::int32_t> unmasked = token_file_read(data).tokens;
  for (std::int32_t& t : unmasked) t = token_id(t);
  token_file_write_llmc(tmp.file("all.bin"), unmasked);
  const std::string all_args = args.substr(0, args.find("--data ")) + "--data " + tmp.file("all.bin") +
                               args.substr(args.find(" --threads"));
  const CommandResult all = run_stratum(all_args);
  ASSERT_EQ(all.exit_code, 0) << all.errors;
  EXPECT_NE(params_hash(all), want) << "the mask must change what is trained";
}

TEST_F(DataParallel, CheckpointResumesOnAnotherNumberOfRanks) {
  TempDir tmp;
  const std::string args = "train " + model_args(tmp) + "--steps 4 --grad-accum 6";
  const std::string want = params_hash(run_stratum(args));
  const CommandResult first = run_ranks(2, args + " --save " + tmp.file("ck") + " --save-every 2");
  ASSERT_EQ(first.exit_code, 0) << first.errors;
  EXPECT_EQ(params_hash(first), want);
  const std::string from = " --resume " + tmp.file("ck") + "/step-00000002 --threads 1 --quiet --save ";
  const CommandResult on_three = run_ranks(3, "train" + from + tmp.file("ck3"));
  ASSERT_EQ(on_three.exit_code, 0) << on_three.errors;
  EXPECT_EQ(params_hash(on_three), want);
  const CommandResult alone = run_stratum("train" + from + tmp.file("ck1"));
  ASSERT_EQ(alone.exit_code, 0) << alone.errors;
  EXPECT_EQ(params_hash(alone), want);
  // Each rank wrote its own shard of the moments (Note [zero sharding]): whole tensors, none twice,
  // together the single process's.
  auto names = [](const std::string& path) {
    std::vector<std::string> out;
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const auto& t : file.tensors()) out.push_back(t.name);
    return out;
  };
  const std::string two = tmp.file("ck") + "/step-00000004", three = tmp.file("ck3") + "/step-00000004";
  EXPECT_FALSE(file_exists(two + "/optimizer.safetensors"));
  std::vector<std::string> sharded;
  for (int r = 0; r < 3; ++r) {
    if (r < 2) {
      const std::vector<std::string> shard = names(two + "/" + optimizer_shard_name(r, 2));
      EXPECT_FALSE(shard.empty()) << "rank " << r;
      sharded.insert(sharded.end(), shard.begin(), shard.end());
    }
    EXPECT_TRUE(file_exists(three + "/" + optimizer_shard_name(r, 3))) << "rank " << r << " of 3";
  }
  std::vector<std::string> whole = names(tmp.file("ck1") + "/step-00000004/optimizer.safetensors");
  std::sort(sharded.begin(), sharded.end());
  std::sort(whole.begin(), whole.end());
  EXPECT_EQ(sharded, whole);
}

// Note [zero sharding]: each rank updates its own segments and holds only their AdamW moments, so
// rank 0's RAM (the log's peak_mem_bytes: engine buffers + the units it allocated) falls by about
// half the moments at 2 ranks, and its own share is reported; the bits stay the single process's
// (above) and a checkpoint still holds every moment (CheckpointResumesOnAnotherNumberOfRanks).
TEST_F(DataParallel, ZeroShardsTheAdamWMomentsAcrossRanks) {
  TempDir tmp;
  const std::string args = "train " + model_args(tmp) + "--steps 3 --grad-accum 6 --log ";
  const CommandResult one = run_stratum(args + tmp.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.errors;
  const CommandResult two = run_ranks(2, args + tmp.file("two.jsonl"));
  ASSERT_EQ(two.exit_code, 0) << two.errors;
  EXPECT_EQ(params_hash(two), params_hash(one));
  EXPECT_NE(two.errors.find("ZeRO sharding: rank 0 updates"), std::string::npos) << two.errors;
  const double peak_one = testing::read_jsonl(tmp.file("one.jsonl")).back()["peak_mem_bytes"].get<double>();
  const double peak_two = testing::read_jsonl(tmp.file("two.jsonl")).back()["peak_mem_bytes"].get<double>();
  // This model's moments are 1.7 MiB (2 x 0.218M floats); half of them is 0.87 MiB.
  EXPECT_LT(peak_two, peak_one - 0.6 * (1 << 20)) << "rank 0 must not hold the other ranks' moments";
  // Resumed on 2 ranks from a single process's checkpoint: each rank loads only its own moments.
  const CommandResult saved = run_stratum(args + tmp.file("saved.jsonl") + " --save-every 2 --save " + tmp.file("ck"));
  ASSERT_EQ(saved.exit_code, 0) << saved.errors;
  const std::string from = "train --resume " + tmp.file("ck") + "/step-00000002 --steps 3 --threads 1 --quiet --log ";
  const CommandResult resumed_one = run_stratum(from + tmp.file("r1.jsonl"));
  ASSERT_EQ(resumed_one.exit_code, 0) << resumed_one.errors;
  const CommandResult resumed_two = run_ranks(2, from + tmp.file("r2.jsonl"));
  ASSERT_EQ(resumed_two.exit_code, 0) << resumed_two.errors;
  EXPECT_EQ(params_hash(resumed_two), params_hash(one));
  EXPECT_EQ(params_hash(resumed_one), params_hash(one));
  const double resumed_peak_one = testing::read_jsonl(tmp.file("r1.jsonl")).back()["peak_mem_bytes"].get<double>();
  const double resumed_peak_two = testing::read_jsonl(tmp.file("r2.jsonl")).back()["peak_mem_bytes"].get<double>();
  EXPECT_LT(resumed_peak_two, resumed_peak_one - 0.6 * (1 << 20)) << "a resumed rank must load only its moments";
  // Saving on 2 ranks: each writes its own shard, so rank 0 still holds only its moments.
  const CommandResult saving_two = run_ranks(2, args + tmp.file("s2.jsonl") + " --save-every 1 --save " + tmp.file("ck2"));
  ASSERT_EQ(saving_two.exit_code, 0) << saving_two.errors;
  EXPECT_EQ(params_hash(saving_two), params_hash(one));
  const double saving_peak_two = testing::read_jsonl(tmp.file("s2.jsonl")).back()["peak_mem_bytes"].get<double>();
  EXPECT_LT(saving_peak_two, peak_one - 0.6 * (1 << 20)) << "a checkpoint must not bring every moment to rank 0";
  // Under a budget that holds what a rank touches but not every unit, nothing streams: the other
  // ranks' moments have no files and no room here (the store sized itself by every unit, and
  // streamed ~3 MiB a step, 3x slower); the plan says so too.
  const CommandResult budget =
      run_ranks(2, args + tmp.file("b2.jsonl") + " --activations recompute --mem-budget 4700K --offload-dir " + tmp.path());
  ASSERT_EQ(budget.exit_code, 0) << budget.errors;
  EXPECT_EQ(params_hash(budget), params_hash(one));
  EXPECT_NE(budget.errors.find("plan: 0 bytes per step read"), std::string::npos) << budget.errors;
  // Both ranks are on this machine: each plans with half the disk's rates.
  EXPECT_NE(budget.errors.find("the disk shared by the 2 ranks on this machine"), std::string::npos) << budget.errors;
  EXPECT_NE(budget.errors.find("tier traffic: read 0 bytes"), std::string::npos) << budget.errors;
  const CommandResult all_units = run_stratum(args + tmp.file("b1.jsonl") + " --activations recompute --mem-budget "
                                              "4700K --offload-dir " + tmp.path());
  ASSERT_EQ(all_units.exit_code, 0) << all_units.errors;
  EXPECT_EQ(all_units.errors.find("tier traffic: read 0 bytes"), std::string::npos) << "one process streams there";
}

// A rank that cannot write its optimizer shard, or dies writing it, leaves the previous checkpoint
// and `latest` as they were; the failure names the rank, and a resume then gives the bits.
TEST_F(DataParallel, AShardThatFailsLeavesThePreviousCheckpoint) {
  TempDir tmp;
  const std::string args = "train " + model_args(tmp) + "--steps 4 --grad-accum 2";
  const std::string want = params_hash(run_stratum(args));
  const std::string root = tmp.file("ck");
  const CommandResult first = run_ranks(2, args + " --save " + root + " --save-every 2");
  ASSERT_EQ(first.exit_code, 0) << first.errors;
  std::filesystem::remove_all(root + "/step-00000004");  // as if the run had stopped after step 2
  file_write_atomic(root + "/latest", "step-00000002\n");
  const std::string resume = "train --resume " + root + " --threads 1 --quiet";
  for (const char* fault : {"enospc@optimizer-00002-of-00002.safetensors", "kill@optimizer-00002-of-00002.safetensors"}) {
    SCOPED_TRACE(fault);
    CommandResult r;
    {
      ScopedEnv env("STRATUM_FILE_FAULT", fault);
      r = run_ranks(2, resume);
    }
    EXPECT_NE(r.exit_code, 0);
    if (std::string(fault).starts_with("enospc")) {
      EXPECT_NE(r.errors.find("rank 1 could not write its optimizer shard"), std::string::npos) << r.errors;
      EXPECT_NE(r.errors.find("No space left on device"), std::string::npos) << r.errors;
      EXPECT_NE(r.errors.find("the checkpoints written before are intact"), std::string::npos) << r.errors;
    }
    EXPECT_EQ(file_read_all(root + "/latest"), "step-00000002\n");
    EXPECT_FALSE(std::filesystem::exists(root + "/step-00000004"));
  }
  const CommandResult resumed = run_ranks(2, resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.errors;
  EXPECT_EQ(params_hash(resumed), want);
  EXPECT_EQ(testing::checkpoint_temporaries(root), 0);
}

// A refusal every rank makes is printed once (rank 0's).
TEST_F(DataParallel, GradAccumNotAMultipleOfTheRanksIsRefused) {
  TempDir tmp;
  const CommandResult r = run_ranks(2, "train " + model_args(tmp) + "--steps 1 --grad-accum 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("must be a multiple of the 2 ranks"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("--grad-accum 4"), std::string::npos) << r.errors;
  // Note [one refusal per job]: rank 0's line alone, and no stop notice from a rank mpirun ended.
  EXPECT_EQ(r.errors.find("must be a multiple"), r.errors.rfind("must be a multiple")) << r.errors;
  EXPECT_NE(r.errors.find("stratum: rank 0 of 2:"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("stopping after this step"), std::string::npos) << r.errors;
}

// The job never hangs on a rank that is gone: mpirun ends the others and says which rank died.
TEST_F(DataParallel, AKilledRankEndsTheJobWithinSeconds) {
  TempDir tmp;
  StratumProcess job("train " + model_args(tmp) + "--steps 100000 --grad-accum 2", mpirun(2));
  pid_t victim = -1;  // a rank: a child of mpirun named stratum
  for (int i = 0; i < 200 && victim <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    victim = child_named(job.pid(), "stratum");
  }
  ASSERT_GT(victim, 0) << "no rank started";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // into the training steps
  ::kill(victim, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  bool ended = false;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    if (!job.running()) {
      ended = true;
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  ASSERT_TRUE(ended) << "the job must not hang when a rank dies";
  const CommandResult r = job.wait();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.output + r.errors).find("rank"), std::string::npos) << r.output << r.errors;
}

// Note [same command on every rank]: ranks started with different math, data or checkpointing
// are refused before the first step in one line naming the difference, and the job ends (another
// --weight-decay trained on silently to other bits; --save given to one rank hung at the first checkpoint).
TEST_F(DataParallel, RanksStartedDifferentlyAreRefused) {
  TempDir tmp;
  const std::string common = model_args(tmp) + "--steps 2 --grad-accum 2 ";
  const std::string other_data = testing::write_random_tokens(tmp.file("other.bin"), 6000, 1024, 4);
  const struct {
    std::string rank1;
    std::string words;
  } cases[] = {
      {"--weight-decay 0.05", "--weight-decay is 0.05 on rank 1 but 0.1 on rank 0"},
      {"--save " + tmp.file("ck"), "--save is given on rank 1 but not given on rank 0"},
      {"--data " + other_data, "the training data is 5700 tokens, hash"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.rank1);
    // MPMD: rank 0 runs the common command, rank 1 the common command with its difference.
    std::string mine = common;
    if (c.rank1.rfind("--data ", 0) == 0) {  // in place of the common --data (a flag given twice is refused)
      const std::size_t at = mine.find("--data ");
      mine.replace(at, mine.find(' ', at + 7) - at, c.rank1);
    } else {
      mine += c.rank1;
    }
    StratumProcess job("train " + mine, mpirun(1) + std::string(STRATUM_BINARY) + " train " + common + " : -np 1 ");
    const auto t0 = std::chrono::steady_clock::now();
    while (job.running() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(90))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_FALSE(job.running()) << "the job must end, not hang";
    const CommandResult r = job.wait();
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.errors.find(c.words), std::string::npos) << r.errors;
    EXPECT_NE(r.errors.find("every rank must run the same command"), std::string::npos) << r.errors;
  }
}

}  // namespace
}  // namespace stratum
