// XXH3-64 through libxxhash; see hash.h.
#include "core/hash.h"

#include <xxhash.h>
#include <xxh_x86dispatch.h>  // XXH3 at the CPU's best ISA (AVX-512 / AVX2 / SSE2), same bits

#include <utility>

#include "stratum/error.h"

namespace stratum {

std::uint64_t hash64(const void* data, std::size_t n) { return XXH3_64bits_dispatch(n == 0 ? "" : data, n); }

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
}

std::uint64_t Hash64Stream::digest() const {
  STRATUM_ASSERT(state_ != nullptr);
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace stratum
