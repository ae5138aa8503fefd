// libFuzzer target for the safetensors reader: writes the input to a per-process temporary file,
// opens it with SafetensorsFile::open, then reads every tensor (read_raw for all, and read_f32
// too for float dtypes, compared with the raw bytes for F32) and checks what open() promises
// about the tensor table. Caps its stack at 128 KiB (Note [fuzz stack limit]).
// Pass: success or stratum::Error. Fail: any other exception, a BugError, a broken promise, or a
// sanitizer report. Does not fuzz the writer. Run with tools/fuzz.sh.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "fuzz_file.h"
#include "stratum/error.h"

namespace {

using stratum::fuzz::FuzzFile;

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.safetensors] %s\n", what.c_str());
  std::abort();
}

bool dtype_is_float(stratum::DType d) {
  using stratum::DType;
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

void tensor_read_all(const stratum::SafetensorsFile& st, const stratum::SafetensorsTensorInfo& t,
                     std::size_t file_bytes) {
  if (st.find(t.name) != &t) fuzz_fail("find('" + t.name + "') does not return the listed tensor");
  if (t.file_offset_bytes > file_bytes || t.size_bytes > file_bytes - t.file_offset_bytes)
    fuzz_fail("tensor '" + t.name + "' was accepted but lies outside the file");
  const std::int64_t numel = t.numel();
  if (static_cast<std::uint64_t>(numel) * stratum::dtype_size_bytes(t.dtype) != t.size_bytes)
    fuzz_fail("tensor '" + t.name + "': size_bytes != numel * dtype size");
  std::vector<unsigned char> raw(static_cast<std::size_t>(t.size_bytes));  // (size_bytes,) u8
  st.read_raw(t, raw.data());
  if (!dtype_is_float(t.dtype)) return;
  std::vector<float> values(static_cast<std::size_t>(numel));  // (numel,) fp32
  st.read_f32(t, values.data());
  if (t.dtype == stratum::DType::F32 && !raw.empty() &&
      std::memcmp(raw.data(), values.data(), raw.size()) != 0)
    fuzz_fail("tensor '" + t.name + "': read_f32 of F32 differs from read_raw");
}

}  // namespace

// Caps the stack: see Note [fuzz stack limit] in fuzz_file.h.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FuzzFile file("model.safetensors");
  const std::string& path = file.write(data, size);
  try {
    const stratum::SafetensorsFile st = stratum::SafetensorsFile::open(path);
    if (st.file_size_bytes() != size) fuzz_fail("file_size_bytes() differs from the input size");
    for (const stratum::SafetensorsTensorInfo& t : st.tensors()) tensor_read_all(st, t, size);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    // Rejected input: the expected outcome for most fuzz inputs.
  }
  return 0;
}
