// AlignedBuffer: 4 KiB-aligned owning allocation; see aligned_buffer.h.
#include "core/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "stratum/error.h"

namespace stratum {

namespace {
// Large buffers come straight from mmap (zeroed by the kernel, returned to it by munmap), so
// freeing one lowers RSS at once: the store's budget accounting relies on that. Small ones use
// the heap.
constexpr std::size_t kMmapMinBytes = std::size_t{1} << 20;
constexpr std::size_t kHugePageBytes = AlignedBuffer::kBlockBytes;

// Note [huge-page-aligned buffers]: a mapping of 2 MiB or more starts on a 2 MiB boundary, so
// every whole 2 MiB of it can be a transparent huge page (madvise mode; the tail past the last
// boundary stays in 4 KiB pages, so RSS is not rounded up). The kernel aligns only anonymous
// mappings whose length is a multiple of 2 MiB, and the store's units are not; unaligned, about
// half of a 200 MiB budget's buffers were 4 KiB pages. Each O_DIRECT read or write pins, dirties
// and releases its buffer page by page, so on the I/O threads that per-page work (and the zeroing
// of freshly faulted pages) is 512x rarer on a huge page.

// The bytes a buffer of size_bytes takes: whole 4 KiB pages, and a mapped one just under a
// multiple of 2 MiB (within 1/64: the LM head's and embedding's vocabulary blocks, 2.09 MB on
// GPT-2 small) rounded up to it, so that its last 2 MiB can be a huge page too.
std::size_t capacity_of(std::size_t size_bytes) {
  const std::size_t capacity = align_up(size_bytes, AlignedBuffer::kAlignmentBytes);
  if (capacity < kMmapMinBytes) return capacity;
  const std::size_t huge = align_up(capacity, kHugePageBytes);
  return huge - capacity <= capacity / 64 ? huge : capacity;
}

// A mapping of capacity bytes; from 2 MiB, the aligned capacity bytes of a reserve 2 MiB larger.
void* aligned_map(std::size_t capacity) {
  const bool huge = capacity >= kHugePageBytes;
  const std::size_t reserve = huge ? capacity + kHugePageBytes : capacity;
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (base + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > base) ::munmap(p, aligned - base);
  const std::uintptr_t end = aligned + capacity;
  if (base + reserve > end) ::munmap(reinterpret_cast<void*>(end), base + reserve - end);
  void* data = reinterpret_cast<void*>(aligned);
  // Transparent huge pages where the system allows them on request (madvise mode): also weights
  // streamed by the decoder read ~10% faster with fewer TLB misses (docs/benchmarks.md).
  ::madvise(data, capacity, MADV_HUGEPAGE);
  return data;
}

// Moves whole 2 MiB blocks [from, from + bytes) to `to`, one mremap each (Note [moving pages]).
bool move_blocks(void* from, std::size_t bytes, void* to) {
  for (std::size_t at = 0; at < bytes; at += kHugePageBytes)
    if (::mremap(static_cast<char*>(from) + at, kHugePageBytes, kHugePageBytes, MREMAP_MAYMOVE | MREMAP_FIXED,
                 static_cast<char*>(to) + at) == MAP_FAILED)
      return false;
  return true;
}

}  // namespace

void aligned_memory_free(void* data, std::size_t size_bytes) noexcept {
  if (data == nullptr) return;
  const std::size_t capacity = capacity_of(size_bytes);
  if (capacity >= kMmapMinBytes) ::munmap(data, capacity);
  else std::free(data);
}

void* aligned_memory_alloc(std::size_t size_bytes) {
  if (size_bytes == 0) return nullptr;
  const std::size_t capacity = capacity_of(size_bytes);
  void* data = nullptr;
  if (capacity >= kMmapMinBytes) {
    data = aligned_map(capacity);  // Note [huge-page-aligned buffers]
  } else {
    data = std::aligned_alloc(AlignedBuffer::kAlignmentBytes, capacity);
    if (data != nullptr) std::memset(data, 0, capacity);
  }
  STRATUM_CHECK(data != nullptr, "[core.memory] cannot allocate ", capacity,
                " bytes: out of memory (reduce --batch/--seq or the model size, or set --mem-budget)");
  return data;
}

AlignedBuffer::AlignedBuffer(std::size_t size_bytes) : data_(aligned_memory_alloc(size_bytes)), size_bytes_(size_bytes) {}

bool AlignedBuffer::resize(std::size_t size_bytes) {
  STRATUM_ASSERT(size_bytes > 0);
  const std::size_t old_capacity = capacity_of(size_bytes_);
  const std::size_t capacity = capacity_of(size_bytes);
  if (data_ == nullptr || old_capacity < kMmapMinBytes || capacity < kMmapMinBytes) {
    *this = AlignedBuffer(size_bytes);
    return false;
  }
  if (capacity < old_capacity) {  // in place: the tail goes back to the kernel
    ::munmap(static_cast<char*>(data_) + capacity, old_capacity - capacity);
  } else if (capacity > old_capacity) {
    // Moved (its pages, not copies) onto a fresh huge-page-aligned range when it grows
    // (Note [huge-page-aligned buffers]); mremap may not grow in place.
    // A whole-block buffer may span several mappings (Note [moving pages]): block by block.
    void* target = aligned_map(capacity);
    void* p = target == nullptr ? MAP_FAILED
              : whole_blocks()  ? (move_blocks(data_, old_capacity, target) ? target : MAP_FAILED)
                                : ::mremap(data_, old_capacity, capacity, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    if (p == MAP_FAILED && target != nullptr) ::munmap(target, capacity);
    STRATUM_CHECK(p != MAP_FAILED, "[core.memory] cannot resize a buffer from ", old_capacity, " to ", capacity,
                  " bytes: out of memory (reduce --batch/--seq or the model size, or set --mem-budget)");
    data_ = p;
    if (capacity >= kHugePageBytes) ::madvise(data_, capacity, MADV_HUGEPAGE);  // the moved range's flags
  }
  size_bytes_ = size_bytes;
  return true;
}

// Note [moving pages]: a unit the pool serves with a buffer of another size used to grow it
// with fresh pages (a fault and a kernel zero fill each) and shrink it by returning pages to the
// kernel. Whole-block buffers (Note [whole huge pages] in store/unit_table.h) instead pass blocks
// between them with mremap, one 2 MiB block per call: a huge page at an aligned address moves as
// one page-table entry, with neither a fault nor a zero fill. Each moved block can become a
// kernel mapping of its own (moved pages do not merge with their new neighbours), so a pool moves
// pages only while its budget's blocks stay well under vm.max_map_count (the store's
// kMovingMaxBlocks); and each call moves one block because mremap moves within one mapping.
bool AlignedBuffer::whole_blocks() const {
  return data_ != nullptr && size_bytes_ % kBlockBytes == 0 &&
         reinterpret_cast<std::uintptr_t>(data_) % kBlockBytes == 0;
}

AlignedBuffer AlignedBuffer::split(std::size_t keep_bytes) {
  STRATUM_ASSERT(whole_blocks() && keep_bytes % kBlockBytes == 0 && keep_bytes > 0 && keep_bytes < size_bytes_);
  AlignedBuffer tail(static_cast<char*>(data_) + keep_bytes, size_bytes_ - keep_bytes);
  size_bytes_ = keep_bytes;
  return tail;
}

std::size_t AlignedBuffer::grow(std::size_t size_bytes, const std::vector<AlignedBuffer*>& donors) {
  STRATUM_ASSERT(whole_blocks() && size_bytes % kBlockBytes == 0 && size_bytes > size_bytes_);
  const std::size_t old_size = size_bytes_;
  void* target = aligned_map(size_bytes);
  if (target == nullptr || !move_blocks(data_, old_size, target)) {
    if (target != nullptr) ::munmap(target, size_bytes);
    ::munmap(data_, old_size);  // what did not move (the holes are unmapped already)
    data_ = nullptr;
    size_bytes_ = 0;
    STRATUM_CHECK(false, "[core.memory] cannot grow a buffer from ", old_size, " to ", size_bytes,
                  " bytes: out of memory (reduce --batch/--seq or the model size, or set --mem-budget)");
  }
  data_ = target;
  size_bytes_ = size_bytes;
  std::size_t at = old_size;
  for (AlignedBuffer* donor : donors) {
    if (at == size_bytes) break;
    if (donor == this || !donor->whole_blocks()) continue;
    const std::size_t bytes = std::min(donor->size_bytes_, size_bytes - at);
    char* from = static_cast<char*>(donor->data_) + donor->size_bytes_ - bytes;
    const bool moved = move_blocks(from, bytes, static_cast<char*>(data_) + at);
    donor->size_bytes_ -= bytes;  // its last blocks moved (or, on a refusal, are unmapped now)
    if (!moved) ::munmap(from, bytes);
    if (donor->size_bytes_ == 0) donor->data_ = nullptr;
    if (!moved) break;  // (out of mappings, say) the rest stays fresh pages
    at += bytes;
  }
  ::madvise(data_, size_bytes, MADV_HUGEPAGE);  // the moved blocks' flags
  return at - old_size;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    aligned_memory_free(data_, size_bytes_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { aligned_memory_free(data_, size_bytes_); }

std::size_t aligned_buffer_carve_bytes(const CarveSlices& slices) {
  std::size_t total = 0;
  for (const auto& s : slices) total += align_up(s.second, 16);
  return total * sizeof(float);
}

void aligned_carve_into(const CarveSlices& slices, float* base) {
  STRATUM_ASSERT(reinterpret_cast<std::uintptr_t>(base) % 64 == 0);
  float* cursor = base;
  for (const auto& s : slices) {
    *s.first = cursor;
    cursor += align_up(s.second, 16);
  }
}

AlignedBuffer aligned_buffer_carve(const CarveSlices& slices) {
  AlignedBuffer buffer(aligned_buffer_carve_bytes(slices));
  aligned_carve_into(slices, buffer.as_f32());
  return buffer;
}

}  // namespace stratum
