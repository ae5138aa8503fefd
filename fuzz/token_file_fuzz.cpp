// libFuzzer target for the token file reader: writes the input to a per-process temporary file
// (named *.tok, so only content decides), calls data_file_reading and token_file_read, and checks
// the reading against the bytes (a shard exactly when the magic is there; text never holds a NUL
// in its first 64 KiB; tokens have an even size) and an accepted file against its bytes: raw
// uint16 streams decode to size/2 little-endian ids, llm.c shards to the header's count, masked
// shards (Note [loss mask]) to the header's count of the file's 32 bits each.
// Pass: success or stratum::Error. Fail: any other exception, a BugError, a wrong decoding, or a
// sanitizer report. Does not fuzz the writers. Run with tools/fuzz.sh.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "data/token_file.h"
#include "fuzz_file.h"
#include "stratum/error.h"

namespace {

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kMaskedMagic = 20261129;
constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

using stratum::fuzz::FuzzFile;

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.token_file] %s\n", what.c_str());
  std::abort();
}

std::int32_t int32_at(const std::uint8_t* data, std::size_t offset) {
  std::int32_t v;
  std::memcpy(&v, data + offset, sizeof v);
  return v;
}

// An accepted file must decode to exactly the ids its bytes hold (a masked shard: its 32 bits).
void tokens_check(const std::uint8_t* data, std::size_t size, const stratum::TokenFileData& got,
                  bool is_shard, bool is_masked) {
  if (got.tokens.empty()) fuzz_fail("accepted a file with zero tokens");
  if (is_shard != (got.format == stratum::TokenFileFormat::LlmcShard) ||
      is_masked != (got.format == stratum::TokenFileFormat::MaskedShard))
    fuzz_fail("format " + stratum::token_file_format_name(got.format) + " contradicts the magic");
  std::size_t first = 0, width = 2;
  if (is_shard || is_masked) {
    first = kLlmcHeaderBytes;
    width = is_shard && int32_at(data, 4) == 1 ? 2 : 4;
    if (got.tokens.size() != static_cast<std::size_t>(int32_at(data, 8)))
      fuzz_fail("token count differs from the shard header");
  }
  if (first + got.tokens.size() * width != size) fuzz_fail("token count does not cover the file");
  for (std::size_t i = 0; i < got.tokens.size(); ++i) {
    std::uint32_t id = 0;
    std::memcpy(&id, data + first + i * width, width);  // little-endian host
    if ((!is_masked && got.tokens[i] < 0) || static_cast<std::uint32_t>(got.tokens[i]) != id)
      fuzz_fail("token " + std::to_string(i) + " decoded as " + std::to_string(got.tokens[i]) +
                ", the file holds " + std::to_string(id));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FuzzFile file("tokens.tok");
  const std::string& path = file.write(data, size);
  const bool is_shard = size >= 4 && int32_at(data, 0) == kLlmcMagic;
  const bool is_masked = size >= 4 && int32_at(data, 0) == kMaskedMagic;
  try {
    const stratum::DataFileReading reading = stratum::data_file_reading(path);
    if ((reading.kind == stratum::DataFileKind::LlmcShard) != is_shard ||
        (reading.kind == stratum::DataFileKind::MaskedShard) != is_masked)
      fuzz_fail("the reading disagrees with the magic");
    if (reading.kind == stratum::DataFileKind::Text && std::memchr(data, 0, std::min<std::size_t>(size, 64 << 10)))
      fuzz_fail("a file with a NUL byte was read as text");
    if (reading.kind == stratum::DataFileKind::RawU16 && size % 2 != 0) fuzz_fail("an odd-sized file read as uint16 ids");
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    if (size > 0 && size % 2 == 0) fuzz_fail("a non-empty even-sized file was refused by data_file_reading");
  }
  try {
    tokens_check(data, size, stratum::token_file_read(path), is_shard, is_masked);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    // Rejected input: the expected outcome for most fuzz inputs.
  }
  return 0;
}
