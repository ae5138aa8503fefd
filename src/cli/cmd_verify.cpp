// `stratum verify DIR`: checks checkpoints against their manifests (Note [checkpoints]) and says
// which can be resumed. DIR is a checkpoint (DIR/step-N) or a checkpoint root (every checkpoint in
// it). Exit 0 when every checkpoint verifies, 1 otherwise.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/file_util.h"
#include "stratum/error.h"
#include "train/checkpoint.h"

namespace stratum {

int cmd_verify(const std::vector<std::string>& argv) {
  Args args("verify", argv, {}, 1);
  if (args.help_requested() || args.positional().empty()) {
    std::fputs("usage: stratum verify DIR\n  checks a checkpoint (DIR/step-N) or every checkpoint under a --save root "
               "against the sizes and checksums in its manifest.json; exit 0 when all verify\n",
               args.help_requested() ? stdout : stderr);
    return args.help_requested() ? 0 : 2;
  }
  std::string dir = args.positional()[0];
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  STRATUM_CHECK(dir_exists(dir), "[verify] '", dir, "' ",
                std::filesystem::exists(dir) ? "is a file; give a checkpoint directory (DIR/step-N) or a --save directory"
                                             : "does not exist");
  std::vector<std::string> checkpoints;
  std::string latest;
  if (file_exists(dir + "/manifest.json")) {
    checkpoints.push_back(dir);
  } else {
    for (const std::string& name : checkpoint_list(dir)) checkpoints.push_back(dir + "/" + name);
    STRATUM_CHECK(!checkpoints.empty(), "[verify] '", dir,
                  "' is neither a checkpoint (no manifest.json) nor a --save directory with step-N checkpoints");
  }
  int bad = 0;
  bool latest_bad = false;
  if (checkpoints[0] != dir) {  // a root: its `latest` too (checkpoint_latest: the one reading of it)
    const LatestStatus status = checkpoint_latest(dir);
    latest_bad = !status.ok();
    if (status.ok()) latest = dir + "/" + status.name;
    else std::printf("%s/latest: BAD: %s\n", dir.c_str(), status.problem.c_str());
  }
  for (const std::string& checkpoint : checkpoints) {
    const CheckpointCheck check = checkpoint_verify(checkpoint);
    std::printf("%s%s: %s\n", checkpoint.c_str(), checkpoint == latest ? " (latest)" : "",
                check.ok() ? ("OK, step " + std::to_string(check.step)).c_str() : ("BAD: " + check.problem).c_str());
    for (const std::string& line : check.report) std::printf("  %s\n", line.c_str());
    if (!check.ok()) ++bad;
  }
  // "the checkpoint" or "all N checkpoints", as the summary's subject.
  const std::string all = checkpoints.size() == 1 ? "the checkpoint" : "all " + std::to_string(checkpoints.size()) +
                                                                         " checkpoints";
  const char* verify = checkpoints.size() == 1 ? "verifies" : "verify";
  if (bad > 0 && static_cast<std::size_t>(bad) == checkpoints.size()) {  // nothing to resume from
    std::printf("%s failed verification%s\n", all.c_str(),
                checkpoints[0] == dir ? "" : ": this directory has nothing to resume from");
    return 1;
  }
  if (bad > 0) {
    std::printf("%d of %zu checkpoints failed verification; --resume %s uses the newest that verifies\n", bad,
                checkpoints.size(), dir.c_str());
    return 1;
  }
  if (latest_bad) {
    std::printf("%s %s but 'latest' is broken; --resume %s and --model %s use the newest\n", all.c_str(), verify,
                dir.c_str(), dir.c_str());
    return 1;
  }
  std::printf("%s %s\n", all.c_str(), verify);
  return 0;
}

}  // namespace stratum
