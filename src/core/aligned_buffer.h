// Owning, move-only, zero-initialised byte buffer aligned to 4 KiB (the O_DIRECT / page size).
// Does not grow, copy or track tiers: the store (src/store) decides where buffers live.
#pragma once

#include <cstddef>
#include <vector>
#include <initializer_list>
#include <utility>

namespace stratum {

class AlignedBuffer {
 public:
  static constexpr std::size_t kAlignmentBytes = 4096;

  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size_bytes);  // rounds capacity up to 4 KiB, zero-fills
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  ~AlignedBuffer();

  void* data() { return data_; }
  const void* data() const { return data_; }
  float* as_f32() { return static_cast<float*>(data_); }
  const float* as_f32() const { return static_cast<const float*>(data_); }
  std::size_t size_bytes() const { return size_bytes_; }
  // Gives the buffer `size_bytes` (> 0), keeping neither its contents' meaning nor its address:
  // a large buffer (1 MiB and more, from mmap) is remapped, so the pages it keeps are reused as
  // they are (no fault, no zero fill) and only pages it gains are new (zeroed by the kernel) or
  // returned ones leave RSS at once; a small one is allocated anew (zeroed). For recycling
  // buffers of different sizes (the tiered store's pool, Note [buffer pool]). Returns whether the
  // memory was kept (remapped) rather than allocated anew.
  bool resize(std::size_t size_bytes);

  // Note [moving pages] (core/aligned_buffer.cpp): a buffer of whole 2 MiB blocks (its size a
  // multiple of kBlockBytes, its address too) hands blocks to another by moving their pages, so
  // the pool reuses pages across sizes without faults or zero fills.
  static constexpr std::size_t kBlockBytes = std::size_t{2} << 20;
  bool whole_blocks() const;
  // Keeps the first keep_bytes (a multiple of kBlockBytes, above 0 and below its size) and
  // returns the rest as a buffer of its own. No system call: the pages stay where they are.
  AlignedBuffer split(std::size_t keep_bytes);
  // Grows to size_bytes (a multiple of kBlockBytes, above its size) on a fresh aligned range: its
  // own pages first, then blocks taken from the ends of the donors (whole-block buffers) in
  // order, each donor shrinking in place (to empty when all its blocks go), then fresh zeroed
  // pages for the rest. Returns the bytes moved from donors. Throws Error when out of memory.
  std::size_t grow(std::size_t size_bytes, const std::vector<AlignedBuffer*>& donors);

 private:
  AlignedBuffer(void* data, std::size_t size_bytes) : data_(data), size_bytes_(size_bytes) {}  // adopts

  void* data_ = nullptr;
  std::size_t size_bytes_ = 0;
};

// The memory behind AlignedBuffer, for owners that keep the size themselves (CpuOps::memory_alloc):
// size_bytes rounded up to 4 KiB, zero-filled, from mmap at 1 MiB and more (from 2 MiB on a 2 MiB
// boundary, asking for transparent huge pages: Note [huge-page-aligned buffers]), else the heap;
// throws Error when out of memory. Free with the same size.
void* aligned_memory_alloc(std::size_t size_bytes);
void aligned_memory_free(void* data, std::size_t size_bytes) noexcept;

// One zeroed buffer carved into float slices of the given sizes (each 64-byte aligned); every
// slice's pointer is written through its float**. The caller owns the returned buffer.
using CarveSlices = std::vector<std::pair<float**, std::size_t>>;
AlignedBuffer aligned_buffer_carve(const CarveSlices& slices);
// Bytes aligned_buffer_carve(slices) allocates (the pointers are not written), so a size
// estimate and the allocation come from one list of slices.
std::size_t aligned_buffer_carve_bytes(const CarveSlices& slices);
// The same slices laid out over memory someone else owns (aligned_buffer_carve_bytes(slices)
// bytes from a 64-byte aligned base): the pointers aligned_buffer_carve would write, shifted.
void aligned_carve_into(const CarveSlices& slices, float* base);

inline std::size_t align_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace stratum
