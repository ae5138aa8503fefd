// The one 64-bit hash Stratum uses for integrity and identity: XXH3-64 (Debian's libxxhash),
// seed 0. Offload blocks (every block written is checked when read back), checkpoint files (the
// manifest's checksums), the parameters hash a run prints and the training data's identity all
// use it. Not cryptographic: it catches corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stratum {

// XXH3-64 of n bytes (data may be null when n is 0).
std::uint64_t hash64(const void* data, std::size_t n);

// A hash as Stratum writes every one (logs, manifests, messages): 16 lowercase hex digits.
std::string hash_text(std::uint64_t hash);

// The same hash fed in pieces: update() with consecutive pieces, then digest() gives
// hash64 of their concatenation. Move-only.
class Hash64Stream {
 public:
  Hash64Stream();
  ~Hash64Stream();
  Hash64Stream(Hash64Stream&& other) noexcept;
  Hash64Stream& operator=(Hash64Stream&& other) noexcept;
  Hash64Stream(const Hash64Stream&) = delete;
  Hash64Stream& operator=(const Hash64Stream&) = delete;

  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;

 private:
  void* state_ = nullptr;  // XXH3_state_t*
};

}  // namespace stratum
