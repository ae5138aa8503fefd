// model_dir_resolve; see commands.h.
#include <cstdio>

#include "cli/commands.h"
#include "train/checkpoint.h"

namespace stratum {

std::string model_dir_resolve(const std::string& path) {
  std::vector<std::string> notes;
  const std::string dir = checkpoint_model_dir(path, &notes);
  for (const std::string& note : notes) std::fprintf(stderr, "[stratum] %s: %s\n", path.c_str(), note.c_str());
  return dir;
}

}  // namespace stratum
