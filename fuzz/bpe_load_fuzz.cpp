// libFuzzer target for BpeTokenizer::load: splits the input at its first 0 byte into
// encoder.json (before) and vocab.bpe (after; empty when there is no 0 byte), writes both into a
// per-process temporary folder and loads it. A tokenizer that loads must decode every id and
// round-trip decode(encode(x)) == x on a fixed sample plus the start of the input.
// Pass: success or stratum::Error. Fail: any other exception, a BugError, a broken round trip, or
// a sanitizer report. Does not fuzz encode on the real vocabulary (see bpe_encode_fuzz.cpp).
// Run with tools/fuzz.sh.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "data/bpe_tokenizer.h"
#include "stratum/error.h"

namespace {

// A per-process folder holding the two tokenizer files, rewritten for every input (overwrite +
// ftruncate: see FuzzFile in safetensors_fuzz.cpp), removed at exit.
class FuzzDir {
 public:
  FuzzDir()
      : path_((std::filesystem::temp_directory_path() /
               ("stratum_fuzz_" + std::to_string(::getpid()) + "_tokenizer")).string()) {
    if (::mkdir(path_.c_str(), 0700) != 0 && errno != EEXIST) fail_io("cannot create");
  }
  FuzzDir(const FuzzDir&) = delete;
  FuzzDir& operator=(const FuzzDir&) = delete;
  ~FuzzDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }

  void write(const char* name, std::string_view bytes) {
    const std::string file = path_ + "/" + name;
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    std::size_t done = 0;
    while (fd >= 0 && done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    if (fd < 0 || done != bytes.size() ||
        ::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0 || ::close(fd) != 0)
      fail_io("cannot write into");
  }

 private:
  [[noreturn]] void fail_io(const char* what) const {
    std::perror(("[fuzz.bpe_load] " + std::string(what) + " " + path_).c_str());
    std::abort();
  }

  std::string path_;
};

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.bpe_load] %s\n", what.c_str());
  std::abort();
}

// A loaded tokenizer must decode every id and round-trip text through its merges.
void tokenizer_check(const stratum::BpeTokenizer& tok, std::string_view input) {
  if (tok.vocab_size() < 256) fuzz_fail("loaded a vocabulary without all 256 byte tokens");
  for (std::int32_t id = 0; id < tok.vocab_size(); ++id) tok.decode_token(id);
  if (tok.eot_id() >= tok.vocab_size()) fuzz_fail("eot_id() is out of range");
  std::string text = "Hello, world! It's 2024: \xC3\xBCnic\xC3\xB6" "de \xF0\x9F\x99\x82 "
                     "\xFF\xC0 the hello  cd\n";
  text.append(input.substr(0, 256));
  const std::string back = tok.decode(tok.encode(text));
  if (back != text) fuzz_fail("decode(encode(x)) != x with the loaded vocabulary and merges");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FuzzDir dir;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = std::min(input.find('\0'), input.size());
  dir.write("encoder.json", input.substr(0, split));
  dir.write("vocab.bpe", split < size ? input.substr(split + 1) : std::string_view());
  std::optional<stratum::BpeTokenizer> tok;
  try {
    tok.emplace(stratum::BpeTokenizer::load(dir.path()));
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return 0;  // rejected input: the expected outcome for most fuzz inputs
  }
  try {
    tokenizer_check(*tok, input);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("a tokenizer that loaded then threw: ") + e.what());
  }
  return 0;
}
