// Tests for src/data/token_file: raw uint16, llm.c shard and masked shard round trips, version-2
// shards, format detection, a malformed-input table, write validation, and a mutation smoke fuzz.
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

// Note [loss mask]: a masked shard holds each token's 32 bits as kept in memory (bit 31: no loss
// target), behind llm.c's header with its own magic; ids of any width, read back as written and
// told from an llm.c shard by content. One target at least: a file of prompts alone is refused.
TEST(TokenFile, MaskedShardRoundTripKeepsTheLossMask) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = {token_no_loss(1), token_no_loss(70000), 5, 128255, token_no_loss(0), 0,
                                            token_no_loss(2147483647)};
  EXPECT_EQ(token_target_count(tokens.data(), tokens.size()), 3u);
  EXPECT_EQ(token_id(tokens[1]), 70000);
  EXPECT_FALSE(token_is_target(tokens[4]));
  EXPECT_EQ(token_id(tokens[6]), 2147483647);
  const std::string path = dir.file("sft.bin");
  token_file_write_masked(path, tokens);
  const std::string bytes = file_read_all(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20261129);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 7);
  std::uint32_t first = 0;
  std::memcpy(&first, bytes.data() + 1024, sizeof(first));
  EXPECT_EQ(first, 0x80000001u);
  const TokenFileData data = token_file_read(path);
  EXPECT_EQ(data.format, TokenFileFormat::MaskedShard);
  EXPECT_EQ(data.tokens, tokens);
  EXPECT_EQ(data_file_reading(path).kind, DataFileKind::MaskedShard);
  const std::string before = file_read_all(path);
  EXPECT_THROW(token_file_write_masked(path, {token_no_loss(3), token_no_loss(4)}), Error);
  EXPECT_THROW(token_file_write_masked(path, {}), Error);
  EXPECT_EQ(file_read_all(path), before);
}

// Ids above 65535 (Llama 3's, Qwen2's vocabularies) make a version-2 shard of uint32 ids, read
// back as they were; ids that fit stay version 1.
TEST(TokenFile, LlmcShardOfLargeIdsIsVersion2) {
  TempDir dir;
  std::vector<std::int32_t> tokens = tokens_random(3000, 4);
  tokens[1234] = 151643;  // Qwen2's <|endoftext|>
  tokens[2999] = 128255;
  token_file_write_llmc(dir.file("wide.bin"), tokens);
  const std::string bytes = file_read_all(dir.file("wide.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 4 * 3000);
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[1], 2);
  EXPECT_EQ(header[2], 3000);
  EXPECT_EQ(token_file_read(dir.file("wide.bin")).tokens, tokens);
}

TEST(TokenFile, LargeFilesSpanSeveralChunks) {
  TempDir dir;
  const std::vector<std::int32_t> tokens = tokens_random(3'000'001, 3);  // odd, > several 1 MiB chunks
  token_file_write_raw_u16(dir.file("big.bin"), tokens);
  token_file_write_llmc(dir.file("big_shard.bin"), tokens);
  EXPECT_EQ(token_file_read(dir.file("big.bin")).tokens, tokens);
  EXPECT_EQ(token_file_read(dir.file("big_shard.bin")).tokens, tokens);
}

// Note [data by content]: text or tokens is decided by the bytes, not the name (a text file named
// .bin was read as uint16 ids; a token file named otherwise was refused as text), and the
// reading that overrode the name is said.
TEST(TokenFile, DataFilesAreReadByContent) {
  TempDir dir;
  token_file_write_llmc(dir.file("shard.dat"), {1, 2, 3});
  token_file_write_raw_u16(dir.file("raw.tokens"), {1, 2, 3});
  bytes_write(dir.file("notes.txt"), "hello world");
  bytes_write(dir.file("xy"), "xy");
  bytes_write(dir.file("xy.bin"), "xy");
  const std::string verse = "First Citizen:\nBefore we proceed any further, hear me speak.\n\tAll: Speak, speak.\r\n";
  bytes_write(dir.file("text.bin"), verse);
  bytes_write(dir.file("unicode.txt"), "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x99\x82 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e text");
  // Ids >= 8192 whose bytes are all printable still read as tokens once a NUL or a bad sequence shows.
  token_file_write_raw_u16(dir.file("ids.dat"), {0x6968, 0x2020, 0x6f77, 0x6c72, 0x2064, 0x6968, 0x2020, 0xff41, 198});
  bytes_write(dir.file("odd.dat"), std::string("\xff\xfe\x01\x02 abcdefghijklmnop", 21));
  bytes_write(dir.file("controls.txt"), std::string(40, '\x01') + std::string(60, 'a'));

  const auto kind = [&](const std::string& name) { return data_file_reading(dir.file(name)).kind; };
  const auto note = [&](const std::string& name) { return data_file_reading(dir.file(name)).note; };
  EXPECT_EQ(kind("shard.dat"), DataFileKind::LlmcShard);
  EXPECT_EQ(note("shard.dat"), "");
  EXPECT_EQ(kind("raw.tokens"), DataFileKind::RawU16);
  EXPECT_NE(note("raw.tokens").find("reading it as raw uint16 token ids"), std::string::npos) << note("raw.tokens");
  EXPECT_EQ(kind("notes.txt"), DataFileKind::Text);
  EXPECT_EQ(kind("xy"), DataFileKind::Text);  // under 16 bytes: the name decides
  EXPECT_EQ(kind("xy.bin"), DataFileKind::RawU16);
  EXPECT_EQ(note("xy.bin"), "");
  EXPECT_EQ(kind("text.bin"), DataFileKind::Text);
  EXPECT_NE(note("text.bin").find("holds UTF-8 text: reading it as text"), std::string::npos) << note("text.bin");
  EXPECT_EQ(kind("unicode.txt"), DataFileKind::Text);
  EXPECT_EQ(note("unicode.txt"), "");
  EXPECT_EQ(kind("ids.dat"), DataFileKind::RawU16);
  EXPECT_EQ(kind("controls.txt"), DataFileKind::RawU16);  // 40% control bytes is not text
  EXPECT_EQ(data_file_reading(testing::source_path("tests/golden/tiny_gpt2/tokens.bin")).kind, DataFileKind::RawU16);
  const auto fails_with = [](const std::string& path, const std::string& words) {
    try {
      data_file_reading(path);
      ADD_FAILURE() << path << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  fails_with(dir.file("odd.dat"), "neither UTF-8 text (byte 0 is not) nor a raw uint16 token file");
  fails_with(dir.file("missing.bin"), "does not exist");
  fails_with(dir.path(), "is a directory");
  fails_with("/dev/null", "is not a regular file");
  std::filesystem::create_symlink(dir.file("loop"), dir.file("loop"));
  fails_with(dir.file("loop"), "symbolic link loop");
  bytes_write(dir.file("empty.bin"), "");
  fails_with(dir.file("empty.bin"), "is empty");
  // A raw stream read back without the .bin extension still reads as raw.
  EXPECT_EQ(token_file_read(dir.file("raw.tokens")).tokens, (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(TokenFile, FormatNames) {
  EXPECT_EQ(token_file_format_name(TokenFileFormat::RawU16), "raw-u16");
  EXPECT_EQ(token_file_format_name(TokenFileFormat::LlmcShard), "llmc-shard");
  EXPECT_EQ(token_file_format_name(TokenFileFormat::MaskedShard), "masked-shard");
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
      {"masked_header_truncated", shard_bytes(20261129, 1, 2, "").substr(0, 9), {"masked shard header is truncated"}},
      {"masked_truncated", shard_bytes(20261129, 1, 2, le_bytes(std::vector<std::uint32_t>{5})),
       {"masked shard is truncated", "2 tokens (8 bytes)", "only 4 bytes"}},
      {"masked_uint16_payload", shard_bytes(20261129, 1, 2, two_tokens), {"masked shard is truncated"}},
      {"masked_bad_version", shard_bytes(20261129, 2, 1, le_bytes(std::vector<std::uint32_t>{5})),
       {"masked shard version 2", "bit 31 the loss mask"}},
      {"masked_zero_tokens", shard_bytes(20261129, 1, 0, ""), {"masked shard header says 0 tokens"}},
      {"masked_extra_bytes", shard_bytes(20261129, 1, 1, le_bytes(std::vector<std::uint32_t>{5, 6})),
       {"masked shard has 4 unexpected bytes"}},
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
  for (const auto& tokens : bad) EXPECT_THROW(token_file_write_raw_u16(path, tokens), Error);
  for (const auto& tokens : {bad[1], bad[2]}) EXPECT_THROW(token_file_write_llmc(path, tokens), Error);
  try {
    token_file_write_raw_u16(path, {1, 2, 70000});
    ADD_FAILURE() << "expected stratum::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[data.tokens] ", 0), 0u) << msg;
    EXPECT_NE(msg.find("token 2 has id 70000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("an llm.c shard holds larger ones"), std::string::npos) << msg;
  }
  EXPECT_EQ(file_read_all(path), before);
  EXPECT_THROW(token_file_write_raw_u16(dir.file("nope/t.bin"), {1}), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("nope")));
}

// Smoke fuzz: mutated shards either read or throw stratum::Error with the component prefix.
TEST(TokenFile, MutatedFilesReadOrThrowCleanly) {
  TempDir dir;
  token_file_write_llmc(dir.file("good.bin"), tokens_random(64, 4));
  std::vector<std::int32_t> masked = tokens_random(64, 5);
  for (std::size_t i = 0; i < masked.size(); i += 3) masked[i] = token_no_loss(masked[i]);
  token_file_write_masked(dir.file("masked.bin"), masked);
  const std::string shards[] = {file_read_all(dir.file("good.bin")), file_read_all(dir.file("masked.bin"))};
  std::mt19937 rng(99);
  const std::string path = dir.file("mutant.bin");
  for (int iter = 0; iter < 1000; ++iter) {
    const std::string& good = shards[iter % 2];
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
