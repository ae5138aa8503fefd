// XXH3-64 through libxxhash; see hash.h.
#include "core/hash.h"

#include <xxhash.h>
#include <xxh_x86dispatch.h>  // XXH3 at the CPU's best ISA (AVX-512 / AVX2 / SSE2), same bits

#include <cinttypes>
#include <cstdio>
#include <utility>

#include "stratum/error.h"

namespace stratum {

namespace {
// Note [clean upper state]: Debian's libxxhash (0.8.1) returns from XXH3 with the upper halves of
// the vector registers dirty (its AVX2/AVX-512 code ends without vzeroupper). Until the thread
// next runs vzeroupper, every SSE instruction of code built for the baseline x86-64 (most of
// ours outside the kernels' AVX clones, and libm's non-FMA paths) waits on that state: the
// weights' Box-Muller draws after the data file's checksum took 265 ns a value against 21 ns
// clean (GPT-2 small: 19 s of initialisation on two cores, docs/benchmarks.md). So every call
// into libxxhash is followed by vzeroupper where the CPU has AVX (GCC adds it at the end of our
// own AVX functions; OpenBLAS's kernels leave the state clean).
__attribute__((target("avx"))) void upper_zero_avx() { __builtin_ia32_vzeroupper(); }

void upper_clean() {
  static const bool avx = __builtin_cpu_supports("avx");
  if (avx) upper_zero_avx();
}
}  // namespace

std::uint64_t hash64(const void* data, std::size_t n) {
  const std::uint64_t h = XXH3_64bits_dispatch(n == 0 ? "" : data, n);
  upper_clean();  // Note [clean upper state]
  return h;
}

Hash64Stream::Hash64Stream() : state_(XXH3_createState()) {
  STRATUM_CHECK(state_ != nullptr, "[hash] out of memory");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Hash64Stream::~Hash64Stream() {
  if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

Hash64Stream::Hash64Stream(Hash64Stream&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}

Hash64Stream& Hash64Stream::operator=(Hash64Stream&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
    state_ = std::exchange(other.state_, nullptr);
  }
  return *this;
}

void Hash64Stream::update(const void* data, std::size_t n) {
  STRATUM_ASSERT(state_ != nullptr);
  if (n > 0) XXH3_64bits_update_dispatch(static_cast<XXH3_state_t*>(state_), data, n);
  upper_clean();
}

std::uint64_t Hash64Stream::digest() const {
  STRATUM_ASSERT(state_ != nullptr);
  const std::uint64_t h = XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
  upper_clean();
  return h;
}

std::string hash_text(std::uint64_t hash) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

}  // namespace stratum
