// Tests for src/data/token_file: raw uint16 and llm.c shard round trips, version-2 shards,
// format detection, a malformed-input table, write validation, and a mutation smoke fuzz.
#include "data/token_file.h"

#include <gtest/gtest.h>

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

template <class T>
std::string le_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// llm.c shard bytes: 256-int32 header {magic, version, ntok, 0...} then `payload`.
std::string shard_bytes(std::int32_t magic, std::int32_t version, std::int32_t ntok, const std::string& payload) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = ntok;
  return le_bytes(header) + payload;
}

std::vector<std::int32_t> tokens_random(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> out(n);
  for (auto& t : out) t = static_cast<std::int32_t>(rng() % 65536);
  return out;
}

TEST(TokenFile, RawU16RoundTripIsLittleEndianUint16) {
  TempDir dir;
  std::vector<std::int32_t> tokens = tokens_random(1000, 1);
  tokens[0] = 0;
  tokens[1] = 65535;
  tokens[2] = 0x0102;
  const std::string path = dir.file("train.bin");
  token_file_write_raw_u16(path, tokens);
  const std::string bytes = file_read_all(path);
  ASSERT_EQ(bytes.size(), 2000u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[4]), 0x02);
  EXPECT_EQ(static_cast<unsigned char>(bytes[5]), 0x01);
  const TokenFileData data = token_file_read(path);
  EXPECT_EQ(data.format, TokenFileFormat::RawU16);
  EXPECT_EQ(data.tokens, tokens);
}

TEST(TokenFile, LlmcShardRoundTripHasTheLlmcHeader) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = tokens_random(777, 2);
  const std::string path = dir.file("shard_000.bin");
  token_file_write_llmc(path, tokens);
  const std::string bytes = file_read_all(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * 777);
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 777);
  const TokenFileData data = token_file_read(path);
  EXPECT_EQ(data.format, TokenFileFormat::LlmcShard);
  EXPECT_EQ(data.tokens, tokens);
}

TEST(TokenFile, ReadsVersion2ShardsWithUint32Tokens) {
  TempDir dir;
  const std::vector<std::uint32_t> ids = {0, 1, 70000, 128255, 2147483647u};
  const std::string path = dir.file("llama.bin");
  bytes_write(path, shard_bytes(20240520, 2, 5, le_bytes(ids)));
  const TokenFileData data = token_file_read(path);
  EXPECT_EQ(data.format, TokenFileFormat::LlmcShard);
  EXPECT_EQ(data.tokens, (std::vector<std::int32_t>{0, 1, 70000, 128255, 2147483647}));
}

TEST(TokenFile, LargeFilesSpanSeveralChunks) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = tokens_random(3'000'001, 3);  // odd, > several 1 MiB chunks
  token_file_write_raw_u16(dir.file("big.bin"), tokens);
  token_file_write_llmc(dir.file("big_shard.bin"), tokens);
  EXPECT_EQ(token_file_read(dir.file("big.bin")).tokens, tokens);
  EXPECT_EQ(token_file_read(dir.file("big_shard.bin")).tokens, tokens);
}

TEST(TokenFile, DetectsTokenFilesByMagicOrExtension) {
  TempDir dir;
  token_file_write_llmc(dir.file("shard.dat"), {1, 2, 3});
  token_file_write_raw_u16(dir.file("raw.tokens"), {1, 2, 3});
  bytes_write(dir.file("notes.txt"), "hello world");
  bytes_write(dir.file("xy"), "xy");
  EXPECT_TRUE(token_file_is_token_file(dir.file("shard.dat")));
  EXPECT_FALSE(token_file_is_token_file(dir.file("raw.tokens")));
  EXPECT_FALSE(token_file_is_token_file(dir.file("notes.txt")));
  EXPECT_FALSE(token_file_is_token_file(dir.file("xy")));
  EXPECT_TRUE(token_file_is_token_file(dir.file("not_yet_written.bin")));
  EXPECT_FALSE(token_file_is_token_file(dir.file("missing.txt")));
  EXPECT_FALSE(token_file_is_token_file(dir.file("")));
  // A raw stream read back without the .bin extension still reads as raw.
  EXPECT_EQ(token_file_read(dir.file("raw.tokens")).tokens, (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(TokenFile, FormatNames) {
  EXPECT_EQ(token_file_format_name(TokenFileFormat::RawU16), "raw-u16");
  EXPECT_EQ(token_file_format_name(TokenFileFormat::LlmcShard), "llmc-shard");
}

struct MalformedCase {
  const char* name;
  std::string bytes;  // "<none>" means the file is not created
  std::vector<std::string> message_parts;
};

TEST(TokenFile, MalformedInputTable) {
  const std::string two_tokens = le_bytes(std::vector<std::uint16_t>{5, 6});
  const std::vector<MalformedCase> cases = {
      {"missing_file", "<none>", {"cannot open"}},
      {"empty_file", "", {"is empty"}},
      {"one_byte", "x", {"odd"}},
      {"odd_sized_raw", std::string(2001, 'a'), {"2001 bytes", "odd"}},
      {"shard_header_truncated", shard_bytes(20240520, 1, 2, "").substr(0, 100), {"header is truncated", "100 bytes"}},
      {"shard_tokens_truncated", shard_bytes(20240520, 1, 3, two_tokens), {"truncated", "3 tokens", "only 4 bytes"}},
      {"shard_v2_truncated", shard_bytes(20240520, 2, 2, two_tokens), {"truncated", "8 bytes"}},
      {"shard_bad_version", shard_bytes(20240520, 3, 2, two_tokens), {"version 3"}},
      {"shard_version_zero", shard_bytes(20240520, 0, 2, two_tokens), {"version 0"}},
      {"shard_zero_tokens", shard_bytes(20240520, 1, 0, ""), {"0 tokens"}},
      {"shard_negative_tokens", shard_bytes(20240520, 1, -5, two_tokens), {"-5 tokens"}},
      {"shard_extra_bytes", shard_bytes(20240520, 1, 1, two_tokens), {"2 unexpected bytes"}},
      {"shard_v2_id_too_big", shard_bytes(20240520, 2, 1, le_bytes(std::vector<std::uint32_t>{0x80000000u})), {"2147483648"}},
  };
  TempDir dir;
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".bin");
    if (c.bytes != "<none>") bytes_write(path, c.bytes);
    try {
      token_file_read(path);
      ADD_FAILURE() << "expected stratum::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[data.tokens] ", 0), 0u) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const auto& part : c.message_parts) EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
    }
  }
}

TEST(TokenFile, WritesRejectOutOfRangeIdsAndLeaveOldFiles) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  token_file_write_raw_u16(path, {7, 8});
  const std::string before = file_read_all(path);
  const std::vector<std::vector<std::int32_t>> bad = {{1, 65536}, {-1}, {}};
  for (const auto& tokens : bad) {
    EXPECT_THROW(token_file_write_raw_u16(path, tokens), Error);
    EXPECT_THROW(token_file_write_llmc(path, tokens), Error);
  }
  try {
    token_file_write_llmc(path, {1, 2, 70000});
    ADD_FAILURE() << "expected stratum::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[data.tokens] ", 0), 0u) << msg;
    EXPECT_NE(msg.find("token 2 has id 70000"), std::string::npos) << msg;
  }
  EXPECT_EQ(file_read_all(path), before);
  EXPECT_THROW(token_file_write_raw_u16(dir.file("nope/t.bin"), {1}), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("nope")));
}

// Smoke fuzz: mutated shards either read or throw stratum::Error with the component prefix.
TEST(TokenFile, MutatedFilesReadOrThrowCleanly) {
  TempDir dir;
  token_file_write_llmc(dir.file("good.bin"), tokens_random(64, 4));
  const std::string good = file_read_all(dir.file("good.bin"));
  std::mt19937 rng(99);
  const std::string path = dir.file("mutant.bin");
  for (int iter = 0; iter < 500; ++iter) {
    std::string bytes = good;
    const std::size_t pos = rng() % 16;  // hit the header fields most of the time
    bytes[pos] = static_cast<char>(rng());
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    bytes_write(path, bytes);
    try {
      const TokenFileData data = token_file_read(path);
      EXPECT_FALSE(data.tokens.empty());
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[data.tokens] ", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace stratum
