// safetensors reader (validating header parser + pread) and atomic writer; see safetensors.h.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "core/bf16.h"
#include "core/file_util.h"
#include "formats/json_brief.h"
#include "stratum/error.h"

namespace stratum {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

namespace {

constexpr std::uint64_t kHeaderLengthMaxBytes = 100'000'000;  // same bound as the Rust reference
constexpr std::size_t kStagingBytes = 1 << 20;                // read_f32 conversion chunk

constexpr DType kAllDtypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                                DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};

std::string where(const std::string& path) { return "[safetensors] '" + path + "'"; }

bool dtype_parse(const std::string& text, DType* out) {
  for (DType d : kAllDtypes) {
    if (text == dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

std::string dtype_list() {
  std::string out;
  for (DType d : kAllDtypes) out += std::string(out.empty() ? "" : " ") + dtype_name(d);
  return out;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, infinities, NaN payloads).
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise into a normal float
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Elements count with overflow detection; false when the product does not fit in int64.
bool shape_numel(const std::vector<std::int64_t>& shape, std::int64_t* out) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

// Bytes of a tensor; false when the shape is negative or the count overflows.
bool shape_size_bytes(const std::vector<std::int64_t>& shape, DType dtype, std::uint64_t* out) {
  std::int64_t numel = 0;
  return shape_numel(shape, &numel) &&
         !__builtin_mul_overflow(static_cast<std::uint64_t>(numel), dtype_size_bytes(dtype), out);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

struct ParsedEntry {
  SafetensorsTensorInfo info;
  std::uint64_t begin = 0;  // relative to the data area
  std::uint64_t end = 0;
};

ParsedEntry entry_parse(const std::string& path, const std::string& name, const nlohmann::json& v,
                        std::uint64_t data_start, std::uint64_t data_area_bytes) {
  const std::string at = where(path) + ": tensor '" + name + "'";
  STRATUM_CHECK(v.is_object(), at, " must map to an object {dtype, shape, data_offsets}, got ",
                v.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    STRATUM_CHECK(v.contains(key), at, " is missing '", key, "'");
  }
  ParsedEntry e;
  e.info.name = name;
  const auto& dtype = v.at("dtype");
  STRATUM_CHECK(dtype.is_string(), at, ": dtype must be a string, got ", json_brief(dtype));
  STRATUM_CHECK(dtype_parse(dtype.get<std::string>(), &e.info.dtype), at, " has unknown dtype ",
                json_brief(dtype), "; expected one of ", dtype_list());
  const auto& shape = v.at("shape");
  STRATUM_CHECK(shape.is_array(), at, ": shape must be an array of integers, got ", json_brief(shape));
  for (const auto& d : shape) {
    STRATUM_CHECK(d.is_number_integer(), at, ": shape entries must be integers, got ", json_brief(shape));
    STRATUM_CHECK(d.is_number_unsigned(), at, " has a negative dimension in shape ", json_brief(shape));
    const auto dim = d.get<std::uint64_t>();
    STRATUM_CHECK(dim <= static_cast<std::uint64_t>(INT64_MAX), at, ": dimension ", dim, " is too large");
    e.info.shape.push_back(static_cast<std::int64_t>(dim));
  }
  const auto& offs = v.at("data_offsets");
  STRATUM_CHECK(offs.is_array() && offs.size() == 2 && offs[0].is_number_unsigned() &&
                    offs[1].is_number_unsigned(),
                at, ": data_offsets must be [begin, end] with non-negative integers, got ", json_brief(offs));
  e.begin = offs[0].get<std::uint64_t>();
  e.end = offs[1].get<std::uint64_t>();
  STRATUM_CHECK(e.begin <= e.end, at, ": data_offsets begin ", e.begin, " is greater than end ", e.end);
  STRATUM_CHECK(e.end <= data_area_bytes, at, ": data_offsets end ", e.end,
                " is beyond the data area (", data_area_bytes, " bytes); the file is truncated or corrupt");
  std::uint64_t expect_bytes = 0;
  STRATUM_CHECK(shape_size_bytes(e.info.shape, e.info.dtype, &expect_bytes), at, ": shape ", json_brief(shape),
                " overflows the element count");
  e.info.size_bytes = e.end - e.begin;
  STRATUM_CHECK(e.info.size_bytes == expect_bytes, at, ": data_offsets span ", e.info.size_bytes,
                " bytes but shape ", json_brief(shape), " of ", dtype_name(e.info.dtype), " needs ",
                expect_bytes, " bytes");
  e.info.file_offset_bytes = data_start + e.begin;
  return e;
}

}  // namespace

std::int64_t SafetensorsTensorInfo::numel() const {
  std::int64_t n = 0;
  STRATUM_CHECK(shape_numel(shape, &n), "[safetensors] tensor '", name, "': shape ", shape_text(shape),
                " is negative or overflows the element count");
  return n;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_bytes_(other.file_size_bytes_),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_bytes_ = other.file_size_bytes_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = file_open_read(path);
  STRATUM_CHECK(f.fd_ >= 0, where(path), ": cannot open: ", std::strerror(errno));
  struct stat st {};
  STRATUM_CHECK(::fstat(f.fd_, &st) == 0, where(path), ": cannot stat: ", std::strerror(errno));
  STRATUM_CHECK(S_ISREG(st.st_mode), where(path), " is not a regular file");
  f.file_size_bytes_ = static_cast<std::uint64_t>(st.st_size);
  STRATUM_CHECK(f.file_size_bytes_ >= 8, where(path), " is ", f.file_size_bytes_,
                " bytes, shorter than the 8-byte header length; not a safetensors file (truncated?)");

  unsigned char len_le[8];
  f.read_at(0, len_le, 8, "header length");
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_le[i];
  STRATUM_CHECK(header_bytes <= kHeaderLengthMaxBytes, where(path), ": header length ", header_bytes,
                " is absurd (limit ", kHeaderLengthMaxBytes, " bytes); not a safetensors file or corrupt");
  STRATUM_CHECK(header_bytes <= f.file_size_bytes_ - 8, where(path), ": header length ", header_bytes,
                " runs past the end of the file (", f.file_size_bytes_, " bytes); the file is truncated");
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  f.read_at(8, header.data(), header.size(), "header");

  // nlohmann keeps the last of duplicate keys silently, so catch duplicates while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(header, [&](int depth, nlohmann::json::parse_event_t event,
                                             nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && duplicate.empty() &&
          !seen.insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL(where(path), ": header is not valid JSON (", e.what(), ")");
  }
  STRATUM_CHECK(root.is_object(), where(path), ": header must be a JSON object, got ", root.type_name());
  STRATUM_CHECK(duplicate.empty(), where(path), ": tensor name '", duplicate,
                "' appears twice in the header");

  const std::uint64_t data_start = 8 + header_bytes;
  const std::uint64_t data_area_bytes = f.file_size_bytes_ - data_start;
  std::vector<ParsedEntry> entries;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      STRATUM_CHECK(value.is_object(), where(path), ": __metadata__ must be an object of strings, got ",
                    value.type_name());
      for (const auto& [key, text] : value.items()) {
        STRATUM_CHECK(text.is_string(), where(path), ": __metadata__ value for '", key,
                      "' must be a string, got ", json_brief(text));
        f.metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    entries.push_back(entry_parse(path, name, value, data_start, data_area_bytes));
  }
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::tie(a.begin, a.end, a.info.name) < std::tie(b.begin, b.end, b.info.name);
  });
  // Empty tensors occupy no bytes and may sit anywhere; non-empty ones must not share bytes, and
  // together they cover the data area without a gap or a byte after them, as Hugging Face's
  // safetensors requires (its loader refuses such files: a header that does not describe the
  // whole file is a damaged or foreign one).
  std::uint64_t covered_end = 0;
  std::string covered_by;
  for (const ParsedEntry& e : entries) {
    if (e.begin == e.end) continue;
    STRATUM_CHECK(e.begin >= covered_end, where(path), ": tensor '", e.info.name, "' bytes [", e.begin,
                  ", ", e.end, ") overlap tensor '", covered_by, "' (ends at ", covered_end, ")");
    STRATUM_CHECK(e.begin == covered_end, where(path), ": data bytes [", covered_end, ", ", e.begin,
                  ") belong to no tensor (a damaged header, or not a safetensors file)");
    covered_end = e.end;
    covered_by = e.info.name;
  }
  STRATUM_CHECK(covered_end == data_area_bytes, where(path), ": ", data_area_bytes - covered_end,
                " bytes after the last tensor belong to no tensor (a damaged header, or not a safetensors file)");
  for (ParsedEntry& e : entries) {
    f.index_.emplace(e.info.name, f.tensors_.size());
    f.tensors_.push_back(std::move(e.info));
  }
  return f;
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_at(std::uint64_t offset_bytes, void* dst, std::size_t size_bytes,
                              const std::string& what) const {
  char* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < size_bytes) {
    const ssize_t n = ::pread(fd_, out + done, size_bytes - done, static_cast<off_t>(offset_bytes + done));
    if (n < 0 && errno == EINTR) continue;
    STRATUM_CHECK(n >= 0, where(path_), ": read of ", what, " failed at offset ", offset_bytes + done,
                  ": ", std::strerror(errno));
    STRATUM_CHECK(n > 0, where(path_), ": unexpected end of file reading ", what, " at offset ",
                  offset_bytes + done, " (was the file truncated while open?)");
    done += static_cast<std::size_t>(n);
  }
}

void SafetensorsFile::tensor_check(const SafetensorsTensorInfo& t) const {
  STRATUM_CHECK(fd_ >= 0, where(path_), ": read from a moved-from SafetensorsFile");
  const bool inside = t.file_offset_bytes <= file_size_bytes_ &&
                      t.size_bytes <= file_size_bytes_ - t.file_offset_bytes;
  STRATUM_CHECK(inside, where(path_), ": tensor '", t.name, "' lies outside this file (info from another file?)");
}

void SafetensorsFile::read_raw(const SafetensorsTensorInfo& t, void* dst) const {
  tensor_check(t);
  read_at(t.file_offset_bytes, dst, static_cast<std::size_t>(t.size_bytes), "tensor '" + t.name + "'");
}

void SafetensorsFile::read_f32(const SafetensorsTensorInfo& t, float* dst) const {
  read_f32_range(t, 0, static_cast<std::size_t>(t.size_bytes / dtype_size_bytes(t.dtype)), dst);
}

void SafetensorsFile::range_check(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count,
                                  const char* reader) const {
  tensor_check(t);
  const std::size_t total = static_cast<std::size_t>(t.size_bytes / dtype_size_bytes(t.dtype));
  if (first_elem > total || count > total - first_elem) {
    std::size_t end = 0;
    const std::string range = __builtin_add_overflow(first_elem, count, &end)
                                  ? std::to_string(count) + " elements from element " + std::to_string(first_elem)
                                  : "elements [" + std::to_string(first_elem) + ", " + std::to_string(end) + ")";
    STRATUM_FAIL(where(path_), ": ", reader, " of ", range, " lies outside tensor '", t.name, "' of ", total,
                 " elements (shape ", shape_text(t.shape), ")");
  }
}

void SafetensorsFile::read_raw_range(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count,
                                     void* dst) const {
  range_check(t, first_elem, count, "read_raw_range");
  const std::size_t elem_bytes = dtype_size_bytes(t.dtype);
  read_at(t.file_offset_bytes + first_elem * elem_bytes, dst, count * elem_bytes, "tensor '" + t.name + "'");
}

void SafetensorsFile::read_f32_range(const SafetensorsTensorInfo& t, std::size_t first_elem, std::size_t count,
                                     float* dst) const {
  switch (t.dtype) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::F64:
      break;
    default:
      STRATUM_FAIL(where(path_), ": tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                   "; expected a floating-point tensor (F32, F16, BF16 or F64)");
  }
  range_check(t, first_elem, count, "read_f32_range");
  const std::size_t elem_bytes = dtype_size_bytes(t.dtype);
  const std::string what = "tensor '" + t.name + "'";
  const std::uint64_t base = t.file_offset_bytes + first_elem * elem_bytes;
  if (t.dtype == DType::F32) {
    read_at(base, dst, count * elem_bytes, what);
    return;
  }
  const std::size_t chunk = kStagingBytes / elem_bytes;
  std::vector<unsigned char> staging(std::min(count, chunk) * elem_bytes);  // raw bytes of one chunk
  for (std::size_t first = 0; first < count; first += chunk) {
    const std::size_t n = std::min(chunk, count - first);
    read_at(base + first * elem_bytes, staging.data(), n * elem_bytes, what);
    float* out = dst + first;
    if (t.dtype == DType::F64) {
      for (std::size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, staging.data() + 8 * i, 8);
        out[i] = static_cast<float>(d);  // IEEE round to nearest even; overflow gives +-inf
      }
    } else {
      const bool half = t.dtype == DType::F16;
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, staging.data() + 2 * i, 2);
        out[i] = half ? f16_to_f32(h) : bf16_to_f32(h);
      }
    }
  }
}

void safetensors_write(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  }
  std::vector<std::uint64_t> sizes_bytes;
  std::uint64_t offset = 0;
  std::set<std::string> names;
  for (const SafetensorsWriteEntry& e : entries) {
    const std::string at = where(path) + ": cannot write tensor '" + e.name + "'";
    STRATUM_CHECK(!e.name.empty() && e.name != "__metadata__", where(path),
                  ": tensor name must be non-empty and not '__metadata__', got '", e.name, "'");
    STRATUM_CHECK(names.insert(e.name).second, at, ": the name is used twice");
    std::uint64_t size = 0;
    STRATUM_CHECK(shape_size_bytes(e.shape, e.dtype, &size), at, ": shape ", shape_text(e.shape),
                  " is negative or overflows");
    STRATUM_CHECK(e.data != nullptr || e.data_fn || size == 0, at, ": data pointer is null for ", size, " bytes");
    if (!e.piece_bytes.empty()) {
      STRATUM_CHECK(e.data == nullptr && e.data_fn, at, ": piece_bytes needs data_fn (and no data pointer)");
      std::uint64_t pieces = 0;
      bool overflow = false;
      for (std::size_t b : e.piece_bytes) overflow |= __builtin_add_overflow(pieces, b, &pieces);
      STRATUM_CHECK(!overflow && pieces == size, at, ": its ", e.piece_bytes.size(), " pieces sum to ",
                    overflow ? std::string("more than 2^64") : std::to_string(pieces), " bytes but shape ",
                    shape_text(e.shape), " of ", dtype_name(e.dtype), " needs ", size, " bytes");
    }
    STRATUM_CHECK(!__builtin_add_overflow(offset, size, &offset), at, ": total size overflows");
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape},
                      {"data_offsets", {offset - size, offset}}};
    sizes_bytes.push_back(size);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL(where(path), ": cannot encode header (names and metadata must be UTF-8): ", e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  STRATUM_CHECK(text.size() <= kHeaderLengthMaxBytes, where(path), ": header would be ", text.size(),
                " bytes, over the ", kHeaderLengthMaxBytes, "-byte limit readers enforce");
  unsigned char len_le[8];
  const std::uint64_t header_bytes = text.size();
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(header_bytes >> (8 * i));
  file_write_atomic(path, [&](const ByteSink& sink) {
    sink(len_le, 8);
    sink(text.data(), text.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (sizes_bytes[i] == 0) continue;
      const SafetensorsWriteEntry& e = entries[i];
      if (e.data != nullptr) {
        sink(e.data, static_cast<std::size_t>(sizes_bytes[i]));
      } else if (e.piece_bytes.empty()) {
        sink(e.data_fn(0), static_cast<std::size_t>(sizes_bytes[i]));
      } else {
        for (std::size_t p = 0; p < e.piece_bytes.size(); ++p) sink(e.data_fn(p), e.piece_bytes[p]);
      }
    }
  });
}

}  // namespace stratum
