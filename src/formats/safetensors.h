// Reads and writes Hugging Face safetensors files: an 8-byte little-endian header length N, N
// bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then
// the tensor bytes (offsets relative to the end of the header). open() validates the whole
// header up front so later reads cannot run off the file; reads use pread on an owned fd and
// take whole tensors or element ranges. The writer can take a tensor as several pieces (e.g. the
// row blocks of a tensor held in separate buffers) from a callback.
// Does not memory-map, does not convert fp32 to lower precisions on write, does not handle
// sharded checkpoints (model.safetensors.index.json) or big-endian hosts.
// Format notes: docs/formats.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace stratum {

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;      // empty = scalar (one element)
  std::uint64_t file_offset_bytes = 0;  // absolute offset of the data in the file
  std::uint64_t size_bytes = 0;         // == numel() * dtype_size_bytes(dtype)

  std::int64_t numel() const;
};

// An open, validated safetensors file. Move-only; owns the file descriptor.
class SafetensorsFile {
 public:
  // Parses and fully validates the header; throws stratum::Error ("[safetensors] ...") naming the
  // file and, where it applies, the tensor.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }  // data-offset order
  const SafetensorsTensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  std::uint64_t file_size_bytes() const { return file_size_bytes_; }

  // Reads numel() floats into dst. F32 is copied; F16 and BF16 are widened exactly; F64 is
  // rounded to the nearest float. Integer and BOOL tensors throw. Uses a bounded staging buffer.
  void read_f32(const SafetensorsTensorInfo& t, float* dst) const;
  // Reads elements [first_elem, first_elem + count) (flat row-major index) of t into dst
  // (count floats), converted like read_f32; read_f32 is read_f32_range(t, 0, numel). A range
  // outside the tensor throws, naming the file, tensor and range.
  void read_f32_range(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count, float* dst) const;
  // Reads t.size_bytes bytes into dst (pread; retries short reads and EINTR).
  void read_raw(const SafetensorsTensorInfo& t, void* dst) const;
  // Elements [first_elem, first_elem + count) as stored (count * dtype size bytes), unconverted.
  void read_raw_range(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count, void* dst) const;

 private:
  SafetensorsFile() = default;
  void tensor_check(const SafetensorsTensorInfo& t) const;  // t lies inside this open file
  // t lies inside this file and has elements [first_elem, first_elem + count); `reader` names the
  // caller in the error.
  void range_check(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count, const char* reader) const;
  void read_at(std::uint64_t offset_bytes, void* dst, std::size_t size_bytes,
               const std::string& what) const;

  std::string path_;
  int fd_ = -1;  // owned; closed by the destructor
  std::uint64_t file_size_bytes_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;  // sorted by file_offset_bytes, then name
  std::map<std::string, std::size_t> index_;    // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsWriteEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;  // numel * dtype size bytes, borrowed for the duration of the call
  // Alternative to `data` for data that is not all in memory at once: data_fn(piece) is called
  // right before piece `piece`'s bytes are written, in entry order and then piece order
  // (0, 1, ...); the pointer must stay valid until the next call or the end of the write.
  std::function<const void*(std::size_t piece)> data_fn = nullptr;
  // Splits the tensor's bytes into consecutive pieces, piece i having piece_bytes[i] bytes from
  // data_fn(i) (e.g. the row blocks of a tensor held in separate buffers). Empty = one piece of
  // the whole tensor, data_fn(0). Needs data_fn and no `data`; the sizes must sum to the
  // tensor's size, checked (like every entry) before anything is written.
  std::vector<std::size_t> piece_bytes = {};
};

// Writes atomically via file_write_atomic (a failed write leaves any previous file untouched).
// The header JSON is padded with spaces so the data starts 8-byte aligned; tensors are laid out
// contiguously in the given order. Names must be unique and non-empty; "__metadata__" is reserved.
void safetensors_write(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace stratum
