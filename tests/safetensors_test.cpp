// Tests for src/formats/safetensors: round trips of every dtype, exact F16/BF16 widening, F64
// rounding, element-range reads, piecewise writes, a malformed-header table, atomic writes, and a
// byte-mutation smoke fuzz.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/file_util.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using testing::TempDir;

void bytes_write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length (or `length_override`), header text, then `data_bytes` zero bytes.
std::string st_bytes(const std::string& header, std::size_t data_bytes, std::int64_t length_override = -1) {
  std::uint64_t n = length_override >= 0 ? static_cast<std::uint64_t>(length_override) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

// Runs f, expecting a stratum::Error whose message starts with `prefix` and contains each part.
template <class F>
void expect_error(F&& f, const std::string& prefix, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected stratum::Error containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error must be one line: " << msg;
  }
}

TEST(Safetensors, DtypeSizesAndNames) {
  const std::pair<DType, std::pair<std::size_t, const char*>> table[] = {
      {DType::F64, {8, "F64"}}, {DType::F32, {4, "F32"}}, {DType::F16, {2, "F16"}}, {DType::BF16, {2, "BF16"}},
      {DType::I64, {8, "I64"}}, {DType::I32, {4, "I32"}}, {DType::I16, {2, "I16"}}, {DType::I8, {1, "I8"}},
      {DType::U8, {1, "U8"}},   {DType::BOOL, {1, "BOOL"}}};
  for (const auto& [dtype, expect] : table) {
    EXPECT_EQ(dtype_size_bytes(dtype), expect.first);
    EXPECT_STREQ(dtype_name(dtype), expect.second);
  }
}

TEST(Safetensors, RoundTripAllDtypesRawBytesAndLayout) {
  TempDir dir;
  const DType dtypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                          DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<SafetensorsWriteEntry> entries;
  std::mt19937 rng(7);
  int k = 0;
  for (DType d : dtypes) {
    const std::vector<std::int64_t> shape = {3, k + 1};  // odd sizes exercise packing
    std::vector<unsigned char> buf(static_cast<std::size_t>(3 * (k + 1)) * dtype_size_bytes(d));
    for (auto& b : buf) b = static_cast<unsigned char>(d == DType::BOOL ? rng() & 1 : rng());
    buffers.push_back(std::move(buf));
    entries.push_back({std::string("t.") + dtype_name(d), d, shape, buffers.back().data()});
    ++k;
  }
  entries.push_back({"scalar", DType::F32, {}, buffers[1].data()});
  entries.push_back({"empty", DType::F16, {0, 5}, nullptr});
  const std::string path = dir.file("all.safetensors");
  safetensors_write(path, entries, {{"format", "pt"}, {"stratum", "test"}});

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), entries.size());
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"stratum", "test"}}));
  EXPECT_EQ(f.tensors()[0].file_offset_bytes % 8, 0u) << "data area must start 8-byte aligned";
  for (std::size_t i = 1; i < f.tensors().size(); ++i) {
    EXPECT_LE(f.tensors()[i - 1].file_offset_bytes, f.tensors()[i].file_offset_bytes) << "data-offset order";
  }
  for (std::size_t i = 0; i < std::size(dtypes); ++i) {
    const SafetensorsTensorInfo* t = f.find(entries[i].name);
    ASSERT_NE(t, nullptr) << entries[i].name;
    EXPECT_EQ(t->dtype, entries[i].dtype);
    EXPECT_EQ(t->shape, entries[i].shape);
    EXPECT_EQ(t->numel(), 3 * static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(t->size_bytes, buffers[i].size());
    std::vector<unsigned char> got(t->size_bytes);
    f.read_raw(*t, got.data());
    EXPECT_EQ(got, buffers[i]) << entries[i].name;
  }
  const SafetensorsTensorInfo* scalar = f.find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  const SafetensorsTensorInfo* empty = f.find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->size_bytes, 0u);
  f.read_f32(*empty, nullptr);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.file_size_bytes(), file_size_bytes(path));
}

TEST(Safetensors, HeaderIsPaddedJsonWithRelativeOffsets) {
  TempDir dir;
  const float a[3] = {1.0f, 2.0f, 3.0f};
  const std::string path = dir.file("a.safetensors");
  safetensors_write(path, {{"a", DType::F32, {3}, a}, {"b", DType::F32, {1}, a}});
  const std::string bytes = file_read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 16);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_NE(header.find(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]})"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]})"), std::string::npos) << header;
}

TEST(Safetensors, ReadF32ConvertsF16ExactlyForAllBitPatterns) {
  TempDir dir;
  std::vector<std::uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
  const std::string path = dir.file("f16.safetensors");
  safetensors_write(path, {{"h", DType::F16, {65536}, bits.data()}});
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> got(65536);
  f.read_f32(*f.find("h"), got.data());
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = (h >> 10) & 0x1F;
    const int mant = h & 0x3FF;
    if (exp == 0x1F && mant != 0) {
      EXPECT_TRUE(std::isnan(got[h])) << h;
      continue;
    }
    const double expect = exp == 0x1F ? sign * INFINITY
                          : exp == 0  ? sign * std::ldexp(mant, -24)
                                      : sign * std::ldexp(1024 + mant, exp - 25);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[h]), std::bit_cast<std::uint32_t>(static_cast<float>(expect)))
        << "half bits 0x" << std::hex << h;
  }
  // Spot checks with well-known patterns.
  EXPECT_EQ(got[0x3C00], 1.0f);
  EXPECT_EQ(got[0xC000], -2.0f);
  EXPECT_EQ(got[0x7BFF], 65504.0f);
  EXPECT_EQ(got[0x0001], std::ldexp(1.0f, -24));
  EXPECT_EQ(got[0x0400], std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::signbit(got[0x8000]) && got[0x8000] == 0.0f);
  EXPECT_EQ(got[0x7C00], INFINITY);
  EXPECT_EQ(got[0xFC00], -INFINITY);
}

TEST(Safetensors, ReadF32ConvertsBf16ExactlyForAllBitPatterns) {
  TempDir dir;
  std::vector<std::uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
  const std::string path = dir.file("bf16.safetensors");
  safetensors_write(path, {{"b", DType::BF16, {256, 256}, bits.data()}});
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> got(65536);
  f.read_f32(*f.find("b"), got.data());
  for (std::uint32_t b = 0; b < 65536; ++b) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[b]), b << 16) << "bf16 bits 0x" << std::hex << b;
  }
  EXPECT_EQ(got[0x3F80], 1.0f);
  EXPECT_EQ(got[0xC040], -3.0f);
  EXPECT_EQ(got[0x7F80], INFINITY);
}

TEST(Safetensors, ReadF32CopiesF32AndRoundsF64ToNearestEven) {
  TempDir dir;
  const double d[] = {0.1, 1.0 / 3.0, -2.5, 1e-50, 1.0 + std::ldexp(1.0, -24), 1.0 + 3 * std::ldexp(1.0, -24), 1e300};
  const float expect_d[] = {0.1f, 1.0f / 3.0f, -2.5f, 0.0f, 1.0f, 1.0f + std::ldexp(1.0f, -22), INFINITY};
  std::vector<float> f32(300000);  // larger than one staging chunk
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i) * 0.37f - 5.0f;
  const std::string path = dir.file("mix.safetensors");
  safetensors_write(path, {{"d", DType::F64, {7}, d}, {"f", DType::F32, {300000}, f32.data()}});
  SafetensorsFile f = SafetensorsFile::open(path);
  float got_d[7];
  f.read_f32(*f.find("d"), got_d);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(got_d[i], expect_d[i]) << i;
  std::vector<float> got_f(f32.size());
  f.read_f32(*f.find("f"), got_f.data());
  EXPECT_EQ(got_f, f32);
}

TEST(Safetensors, ReadF32LargeF16SpansSeveralChunks) {
  TempDir dir;
  std::vector<std::uint16_t> table(65536);  // every half bit pattern, converted once as reference
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::uint16_t>(i);
  std::vector<std::uint16_t> h(1'500'000);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>((i * 40503u) & 0xFFFF);
  const std::string path = dir.file("big.safetensors");
  safetensors_write(path, {{"table", DType::F16, {65536}, table.data()}, {"h", DType::F16, {1500, 1000}, h.data()}});
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> ref(table.size());
  f.read_f32(*f.find("table"), ref.data());
  std::vector<float> got(h.size());
  f.read_f32(*f.find("h"), got.data());
  for (std::size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(ref[h[i]])) << i;
  }
}

TEST(Safetensors, ReadF32RejectsIntegerAndBoolDtypes) {
  TempDir dir;
  const std::int32_t v[2] = {1, 2};
  const std::string path = dir.file("int.safetensors");
  safetensors_write(path, {{"ids", DType::I32, {2}, v}, {"mask", DType::BOOL, {2}, v}});
  SafetensorsFile f = SafetensorsFile::open(path);
  float out[2];
  expect_error([&] { f.read_f32(*f.find("ids"), out); }, "[safetensors] ", {path, "'ids'", "I32"});
  expect_error([&] { f.read_f32(*f.find("mask"), out); }, "[safetensors] ", {path, "'mask'", "BOOL"});
}

TEST(Safetensors, ReadF32RangeMatchesSlicesOfReadF32) {
  TempDir dir;
  std::mt19937 rng(11);
  std::vector<float> f32(300000);  // larger than one staging chunk
  for (auto& x : f32) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  std::vector<std::uint16_t> bf16(1'500'000);  // (1500, 1000): three staging chunks
  for (auto& x : bf16) x = static_cast<std::uint16_t>(rng());
  std::vector<std::uint16_t> f16(5000);
  for (auto& x : f16) x = static_cast<std::uint16_t>(rng());
  const double f64[5] = {0.1, -1e300, 1.0 / 3.0, 1e-50, 7.0};
  const std::string path = dir.file("range.safetensors");
  safetensors_write(path, {{"f32", DType::F32, {600, 500}, f32.data()},
                           {"bf16", DType::BF16, {1500, 1000}, bf16.data()},
                           {"f16", DType::F16, {5000}, f16.data()},
                           {"f64", DType::F64, {5}, f64}});
  SafetensorsFile f = SafetensorsFile::open(path);
  for (const char* name : {"f32", "bf16", "f16", "f64"}) {
    SCOPED_TRACE(name);
    const SafetensorsTensorInfo& t = *f.find(name);
    const std::size_t n = static_cast<std::size_t>(t.numel());
    std::vector<float> all(n);
    f.read_f32(t, all.data());
    const std::pair<std::size_t, std::size_t> ranges[] = {
        {0, 0}, {0, 1}, {0, n}, {1, n - 1}, {n - 3, 3}, {n, 0}, {2, 1}, {n / 3, n / 2}, {777 % n, std::min<std::size_t>(n - 777 % n, 600'000)}};
    for (const auto& [first, count] : ranges) {
      SCOPED_TRACE(::testing::Message() << "first " << first << " count " << count);
      std::vector<float> got(count + 1, 0.0f);
      const float sentinel = std::bit_cast<float>(0x7FC0DEADu);
      got[count] = sentinel;
      f.read_f32_range(t, first, count, got.data());
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got[count]), std::bit_cast<std::uint32_t>(sentinel)) << "wrote past count";
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(all[first + i])) << first + i;
      }
    }
  }
  // The converted values themselves: BF16 widening is a shift, F32 is a copy.
  float b[4];
  f.read_f32_range(*f.find("bf16"), 123'456, 4, b);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(b[i]), std::uint32_t{bf16[123'456 + i]} << 16);
  float a[3];
  f.read_f32_range(*f.find("f32"), 299'997, 3, a);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(f32[299'997 + i]));
}

TEST(Safetensors, ReadF32RangeRejectsRangesOutsideTheTensorAndIntegerDtypes) {
  TempDir dir;
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const std::int32_t ids[2] = {1, 2};
  const std::string path = dir.file("r.safetensors");
  safetensors_write(path, {{"w", DType::F32, {2, 3}, v}, {"h", DType::BF16, {3}, v}, {"ids", DType::I32, {2}, ids}});
  SafetensorsFile f = SafetensorsFile::open(path);
  float out[8];
  expect_error([&] { f.read_f32_range(*f.find("w"), 4, 3, out); }, "[safetensors] ",
               {path, "'w'", "[4, 7)", "6 elements"});
  expect_error([&] { f.read_f32_range(*f.find("w"), 7, 0, out); }, "[safetensors] ", {path, "'w'", "[7, 7)"});
  expect_error([&] { f.read_f32_range(*f.find("h"), 0, 4, out); }, "[safetensors] ", {path, "'h'", "[0, 4)", "3 elements"});
  expect_error([&] { f.read_f32_range(*f.find("w"), 2, SIZE_MAX, out); }, "[safetensors] ",
               {path, "'w'", "from element 2"});
  expect_error([&] { f.read_f32_range(*f.find("ids"), 0, 1, out); }, "[safetensors] ", {path, "'ids'", "I32", "expected a floating-point tensor"});
}

TEST(Safetensors, WritePiecesRoundTripBitExactly) {
  TempDir dir;
  std::mt19937 rng(5);
  std::vector<float> wte(7 * 5);  // (V=7, C=5) fp32, held as row blocks of 1, 4 and 2 rows
  for (auto& x : wte) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));  // NaN payloads too
  std::vector<std::uint16_t> half(9);
  for (auto& x : half) x = static_cast<std::uint16_t>(rng());
  const float bias[3] = {0.5f, -0.25f, 8.0f};
  const std::vector<std::size_t> rows = {1, 4, 2};
  // data_fn(i) refills one reused buffer with row block i (and poisons the rest), so the round
  // trip also proves each piece is written before the next call.
  std::vector<float> staging(5 * 4);  // (4, 5) fp32: the largest block
  std::vector<std::size_t> calls;
  SafetensorsWriteEntry pieced{"wte", DType::F32, {7, 5}, nullptr, nullptr, {}};
  for (std::size_t r : rows) pieced.piece_bytes.push_back(r * 5 * sizeof(float));
  pieced.data_fn = [&](std::size_t piece) -> const void* {
    calls.push_back(piece);
    std::size_t row0 = 0;
    for (std::size_t p = 0; p < piece; ++p) row0 += rows[p];
    std::fill(staging.begin(), staging.end(), std::bit_cast<float>(0xFFFFFFFFu));
    std::copy_n(wte.begin() + static_cast<std::ptrdiff_t>(row0 * 5), rows[piece] * 5, staging.begin());
    return staging.data();
  };
  std::vector<std::size_t> whole_calls;
  SafetensorsWriteEntry whole{"h", DType::F16, {9}, nullptr, nullptr, {}};
  whole.data_fn = [&](std::size_t piece) -> const void* {
    whole_calls.push_back(piece);
    return half.data();
  };
  const std::string path = dir.file("pieces.safetensors");
  safetensors_write(path, {{"b", DType::F32, {3}, bias}, pieced, whole});
  EXPECT_EQ(calls, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(whole_calls, (std::vector<std::size_t>{0}));

  SafetensorsFile f = SafetensorsFile::open(path);
  const SafetensorsTensorInfo& t = *f.find("wte");
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{7, 5}));
  std::vector<float> got(wte.size());
  f.read_raw(t, got.data());
  EXPECT_EQ(std::memcmp(got.data(), wte.data(), wte.size() * sizeof(float)), 0);
  std::vector<std::uint16_t> got_h(half.size());
  f.read_raw(*f.find("h"), got_h.data());
  EXPECT_EQ(got_h, half);
  float got_b[3];
  f.read_f32(*f.find("b"), got_b);
  EXPECT_EQ(std::memcmp(got_b, bias, sizeof(bias)), 0);
}

TEST(Safetensors, WritePiecesNotSummingToTheSizeFailBeforeWriting) {
  TempDir dir;
  const float good[2] = {1.0f, 2.0f};
  const std::string path = dir.file("model.safetensors");
  safetensors_write(path, {{"w", DType::F32, {2}, good}});
  const std::string before = file_read_all(path);
  const std::string fresh = dir.file("fresh.safetensors");
  std::vector<float> buf(16, 3.0f);
  int calls = 0;
  auto entry = [&](std::vector<std::size_t> pieces) {
    SafetensorsWriteEntry e{"wte", DType::F32, {4, 4}, nullptr, nullptr, std::move(pieces)};  // 64 bytes
    e.data_fn = [&](std::size_t) -> const void* {
      ++calls;
      return buf.data();
    };
    return e;
  };
  for (const std::string& target : {path, fresh}) {
    SCOPED_TRACE(target);
    // The bad entry comes after a good one, so a partial write would be visible.
    expect_error([&] { safetensors_write(target, {{"w", DType::F32, {2}, good}, entry({16, 32, 8})}); },
                 "[safetensors] ", {target, "'wte'", "3 pieces sum to 56 bytes", "needs 64 bytes"});
    expect_error([&] { safetensors_write(target, {{"w", DType::F32, {2}, good}, entry({16, 32, 32})}); },
                 "[safetensors] ", {target, "'wte'", "sum to 80 bytes", "needs 64 bytes"});
    expect_error([&] { safetensors_write(target, {entry({SIZE_MAX, 65})}); }, "[safetensors] ",
                 {target, "'wte'", "more than 2^64"});
    SafetensorsWriteEntry no_fn{"wte", DType::F32, {4, 4}, buf.data(), nullptr, {32, 32}};
    expect_error([&] { safetensors_write(target, {no_fn}); }, "[safetensors] ", {target, "'wte'", "needs data_fn"});
  }
  EXPECT_EQ(calls, 0) << "data_fn must not be called before the entries are validated";
  EXPECT_EQ(file_read_all(path), before);
  EXPECT_FALSE(std::filesystem::exists(fresh));
  std::size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string(), "model.safetensors");
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

TEST(Safetensors, MoveKeepsTheFileUsable) {
  TempDir dir;
  const float v[2] = {4.0f, 5.0f};
  const std::string path = dir.file("m.safetensors");
  safetensors_write(path, {{"v", DType::F32, {2}, v}});
  SafetensorsFile a = SafetensorsFile::open(path);
  SafetensorsFile b = std::move(a);
  SafetensorsFile c = SafetensorsFile::open(path);
  c = std::move(b);
  float out[2] = {};
  c.read_f32(*c.find("v"), out);
  EXPECT_EQ(out[1], 5.0f);
}

struct MalformedCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> message_parts;
};

TEST(Safetensors, MalformedInputTable) {
  const std::string f32_2x2 = R"("dtype":"F32","shape":[2,2])";
  const std::vector<MalformedCase> cases = {
      {"empty_file", "", {"shorter than the 8-byte"}},
      {"five_bytes", "abcde", {"shorter than the 8-byte"}},
      {"header_longer_than_file", st_bytes("{}", 0, 1000), {"runs past the end"}},
      {"header_length_absurd", st_bytes("{}", 0, std::int64_t{1} << 40), {"absurd"}},
      {"not_json", st_bytes("{not json", 0), {"not valid JSON"}},
      {"json_array", st_bytes("[1,2]", 0), {"must be a JSON object"}},
      {"entry_not_object", st_bytes(R"({"w":5})", 0), {"'w'", "must map to an object"}},
      {"missing_dtype", st_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'w'", "missing 'dtype'"}},
      {"missing_shape", st_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), {"'w'", "missing 'shape'"}},
      {"missing_offsets", st_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", 4), {"'w'", "missing 'data_offsets'"}},
      {"unknown_dtype", st_bytes(R"({"w":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1), {"'w'", "unknown dtype \"F8\""}},
      {"lowercase_dtype", st_bytes(R"({"w":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})", 4), {"unknown dtype"}},
      {"dtype_not_string", st_bytes(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4), {"dtype must be a string"}},
      {"negative_shape", st_bytes(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})", 16), {"'w'", "negative dimension"}},
      {"float_shape", st_bytes(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,4]}})", 4), {"must be integers"}},
      {"shape_not_array", st_bytes(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", 16), {"shape must be an array"}},
      {"offsets_three", st_bytes(R"({"w":{)" + f32_2x2 + R"(,"data_offsets":[0,8,16]}})", 16), {"[begin, end]"}},
      {"offsets_negative", st_bytes(R"({"w":{)" + f32_2x2 + R"(,"data_offsets":[-16,0]}})", 16), {"[begin, end]"}},
      {"offsets_reversed", st_bytes(R"({"w":{)" + f32_2x2 + R"(,"data_offsets":[16,0]}})", 16), {"greater than end"}},
      {"offsets_beyond_data", st_bytes(R"({"w":{)" + f32_2x2 + R"(,"data_offsets":[0,16]}})", 15), {"'w'", "beyond the data area"}},
      {"size_mismatch", st_bytes(R"({"w":{)" + f32_2x2 + R"(,"data_offsets":[0,8]}})", 16), {"'w'", "span 8 bytes", "needs 16"}},
      {"numel_overflow", st_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", 0), {"overflows"}},
      {"bytes_overflow", st_bytes(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0), {"overflows"}},
      {"overlap", st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24), {"'b'", "overlap tensor 'a'"}},
      {"duplicate_name", st_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2), {"'a'", "appears twice"}},
      {"metadata_not_object", st_bytes(R"({"__metadata__":[1]})", 0), {"__metadata__ must be an object"}},
      {"metadata_value_not_string", st_bytes(R"({"__metadata__":{"step":5}})", 0), {"'step'", "must be a string"}},
  };
  TempDir dir;
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    bytes_write(path, c.bytes);
    std::vector<std::string> parts = c.message_parts;
    parts.push_back(path);
    expect_error([&] { SafetensorsFile::open(path); }, "[safetensors] ", parts);
  }
}

TEST(Safetensors, TruncatedGoodFileIsRejected) {
  TempDir dir;
  std::vector<float> v(64, 1.5f);
  const std::string path = dir.file("t.safetensors");
  safetensors_write(path, {{"v", DType::F32, {64}, v.data()}});
  std::filesystem::resize_file(path, file_size_bytes(path) - 4);
  expect_error([&] { SafetensorsFile::open(path); }, "[safetensors] ", {path, "'v'", "beyond the data area"});
  expect_error([&] { SafetensorsFile::open(dir.file("absent.safetensors")); }, "[safetensors] ", {"cannot open"});
}

// Empty tensors may sit anywhere; data bytes that belong to no tensor (a gap, or bytes after the
// last tensor) are refused, as Hugging Face's safetensors refuses them (Stratum accepted both).
TEST(Safetensors, EmptyTensorsAnywhereButNoGapsOrTrailingBytes) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  bytes_write(path, st_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6));
  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[1].name, "z");
  EXPECT_EQ(f.tensors()[2].name, "b");
  const std::string gap = dir.file("gap.safetensors");
  bytes_write(gap, st_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})", 10));
  expect_error([&] { SafetensorsFile::open(gap); }, "[safetensors] ", {gap, "data bytes [4, 8) belong to no tensor"});
  const std::string tail = dir.file("tail.safetensors");
  bytes_write(tail, st_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 7));
  expect_error([&] { SafetensorsFile::open(tail); }, "[safetensors] ", {tail, "3 bytes after the last tensor"});
}

TEST(Safetensors, WriteRejectsBadEntries) {
  TempDir dir;
  const float v[1] = {1.0f};
  const std::string path = dir.file("bad.safetensors");
  expect_error([&] { safetensors_write(path, {{"a", DType::F32, {1}, v}, {"a", DType::F32, {1}, v}}); },
               "[safetensors] ", {"'a'", "used twice"});
  expect_error([&] { safetensors_write(path, {{"a", DType::F32, {-1}, v}}); }, "[safetensors] ", {"'a'", "negative"});
  expect_error([&] { safetensors_write(path, {{"a", DType::F32, {2}, nullptr}}); }, "[safetensors] ", {"null"});
  expect_error([&] { safetensors_write(path, {{"__metadata__", DType::F32, {1}, v}}); }, "[safetensors] ", {"__metadata__"});
  expect_error([&] { safetensors_write(path, {{"", DType::F32, {1}, v}}); }, "[safetensors] ", {"non-empty"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, FailedWriteLeavesPreviousFileIntactAndNoTemporaries) {
  TempDir dir;
  const float good[2] = {1.0f, 2.0f};
  const std::string path = dir.file("model.safetensors");
  safetensors_write(path, {{"w", DType::F32, {2}, good}});
  const std::string before = file_read_all(path);

  // A bad entry after a good one: the write must not touch the existing file.
  EXPECT_THROW(safetensors_write(path, {{"w", DType::F32, {2}, good}, {"x", DType::F32, {4}, nullptr}}), Error);
  EXPECT_EQ(file_read_all(path), before);

  // The final rename fails (the target is a non-empty directory): the temporary is removed.
  const std::string blocked = dir.file("blocked.safetensors");
  std::filesystem::create_directories(blocked + "/inner");
  EXPECT_THROW(safetensors_write(blocked, {{"w", DType::F32, {2}, good}}), Error);

  // A target in a missing directory: nothing is created.
  const std::string missing = dir.file("no_such_dir/model.safetensors");
  expect_error([&] { safetensors_write(missing, {{"w", DType::F32, {2}, good}}); }, "[file] ", {"no_such_dir"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("no_such_dir")));

  // A read-only directory (skipped as root, which ignores permissions).
  const std::string ro = dir.file("ro");
  std::filesystem::create_directories(ro);
  safetensors_write(ro + "/m.safetensors", {{"w", DType::F32, {2}, good}});
  ::chmod(ro.c_str(), 0555);
  if (::geteuid() != 0) {
    EXPECT_THROW(safetensors_write(ro + "/m.safetensors", {{"w", DType::F32, {1}, good}}), Error);
    EXPECT_EQ(file_read_all(ro + "/m.safetensors"), before);
  }
  ::chmod(ro.c_str(), 0755);

  std::size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 3u);  // model.safetensors, blocked.safetensors/, ro/
  EXPECT_EQ(file_read_all(path), before);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
}

// Smoke fuzz: random byte flips and truncations of a valid file either open (and then every
// tensor reads) or throw stratum::Error; never crash (run under ASan/UBSan in CI).
TEST(Safetensors, MutatedFilesOpenOrThrowCleanly) {
  TempDir dir;
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const std::uint16_t h[3] = {0x3C00, 0x4000, 0x4200};
  const std::string good_path = dir.file("good.safetensors");
  safetensors_write(good_path, {{"a", DType::F32, {2, 3}, v}, {"b", DType::F16, {3}, h}}, {{"k", "v"}});
  const std::string good = file_read_all(good_path);
  std::mt19937 rng(1234);
  const std::string path = dir.file("mutant.safetensors");
  int opened = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    bytes_write(path, bytes);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      ++opened;
      for (const auto& t : f.tensors()) {
        std::vector<unsigned char> raw(t.size_bytes);
        f.read_raw(t, raw.data());
      }
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[safetensors] ", 0), 0u) << e.what();
    }
  }
  EXPECT_GT(opened, 0);
}

}  // namespace
}  // namespace stratum
