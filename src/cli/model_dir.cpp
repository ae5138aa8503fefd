// model_dir_resolve and stdout_flush; see commands.h.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/commands.h"
#include "train/checkpoint.h"

namespace stratum {

std::string model_dir_resolve(const std::string& path) {
  std::vector<std::string> notes;
  const std::string dir = checkpoint_model_dir(path, &notes);
  for (const std::string& note : notes) std::fprintf(stderr, "[stratum] %s: %s\n", path.c_str(), note.c_str());
  return dir;
}

std::string stdout_flush() {
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return "";
  return errno != 0 ? std::strerror(errno) : "the stream reported an error";
}

}  // namespace stratum
