// llm.c shard and raw uint16 token files; see token_file.h.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "core/file_util.h"
#include "core/file_descriptor.h"
#include "stratum/error.h"

namespace stratum {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; big-endian hosts are not supported");

namespace {

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kMaskedMagic = 20261129;  // Note [loss mask]: llm.c's header, uint32 tokens with bit 31
constexpr std::size_t kLlmcHeaderInts = 256;
constexpr std::size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(std::int32_t);
constexpr std::size_t kStagingBytes = 1 << 20;  // bounded buffer for one-pass conversion

std::string where(const std::string& path) { return "[data.tokens] '" + path + "'"; }


// pread exactly size_bytes at offset; retries short reads and EINTR.
void read_exact(const std::string& path, int fd, std::uint64_t offset, void* dst, std::size_t size_bytes) {
  char* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < size_bytes) {
    const ssize_t n = ::pread(fd, out + done, size_bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    STRATUM_CHECK(n >= 0, where(path), ": read failed at offset ", offset + done, ": ", std::strerror(errno));
    STRATUM_CHECK(n > 0, where(path), ": unexpected end of file at offset ", offset + done,
                  " (was it truncated while being read?)");
    done += static_cast<std::size_t>(n);
  }
}

// Reads count little-endian Elem values starting at offset into tokens (already sized). masked:
// uint32 values whose bit 31 is the loss mask, kept as it is (Note [loss mask]).
template <class Elem>
void tokens_read(const std::string& path, int fd, std::uint64_t offset, std::vector<std::int32_t>& tokens,
                 bool masked = false) {
  const std::size_t chunk = kStagingBytes / sizeof(Elem);
  std::vector<Elem> staging(std::min(chunk, tokens.size()));  // (chunk,) raw token ids
  for (std::size_t first = 0; first < tokens.size(); first += chunk) {
    const std::size_t count = std::min(chunk, tokens.size() - first);
    read_exact(path, fd, offset + first * sizeof(Elem), staging.data(), count * sizeof(Elem));
    for (std::size_t i = 0; i < count; ++i) {
      if constexpr (sizeof(Elem) == 4) {
        STRATUM_CHECK(masked || staging[i] <= static_cast<Elem>(INT32_MAX), where(path), ": token ", first + i,
                      " has id ", staging[i], ", above the supported maximum ", INT32_MAX);
      }
      tokens[first + i] = static_cast<std::int32_t>(staging[i]);
    }
  }
}

// Whether every id fits uint16; throws for no tokens or a negative id, and (u16_only) for an id
// above 65535.
bool tokens_check(const std::string& path, const std::vector<std::int32_t>& tokens, bool u16_only) {
  STRATUM_CHECK(!tokens.empty(), where(path), ": refusing to write a token file with zero tokens");
  bool u16 = true;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    STRATUM_CHECK(tokens[i] >= 0 && (!u16_only || tokens[i] <= 65535), where(path), ": token ", i, " has id ",
                  tokens[i], u16_only ? "; uint16 token files hold ids 0..65535 (an llm.c shard holds larger ones)"
                                      : "; token ids are never negative");
    u16 = u16 && tokens[i] <= 65535;
  }
  return u16;
}

template <class Elem>
void tokens_sink(const ByteSink& sink, const std::vector<std::int32_t>& tokens) {
  std::vector<Elem> staging(std::min(kStagingBytes / sizeof(Elem), tokens.size()));  // (chunk,) ids
  for (std::size_t first = 0; first < tokens.size(); first += staging.size()) {
    const std::size_t count = std::min(staging.size(), tokens.size() - first);
    for (std::size_t i = 0; i < count; ++i) staging[i] = static_cast<Elem>(tokens[first + i]);
    sink(staging.data(), count * sizeof(Elem));
  }
}

}  // namespace

// Note [data by content]: a file's name does not decide how it is read (a text file named
// .bin was trained on as uint16 ids, a token file without .bin was refused as text). Text and
// raw uint16 ids are told apart by content, which is unambiguous beyond a few bytes: real token
// streams hold ids below 256 (NUL bytes) and below 8192 (control bytes), and ids whose bytes are
// both printable make no valid UTF-8 continuation runs for long.
namespace {

// Whether `bytes` (the first `size` bytes of a file; `cut` when the file goes on) read as UTF-8
// text; `bad_at` is the first offending byte's offset when not.
bool looks_like_text(const unsigned char* bytes, std::size_t size, bool cut, std::size_t* bad_at) {
  std::size_t controls = 0;
  for (std::size_t i = 0; i < size;) {
    const unsigned char c = bytes[i];
    *bad_at = i;
    if (c == 0) return false;
    if (c < 0x80) {
      if ((c < 0x20 && (c < 0x09 || c > 0x0d)) || c == 0x7f) ++controls;
      ++i;
      continue;
    }
    const std::size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if (i + k == size) return cut;  // a sequence cut by the sample's end
      if ((bytes[i + k] & 0xc0) != 0x80) return false;
    }
    // Overlong three- and four-byte forms, surrogates and code points above U+10FFFF.
    if ((c == 0xe0 && bytes[i + 1] < 0xa0) || (c == 0xed && bytes[i + 1] >= 0xa0) ||
        (c == 0xf0 && bytes[i + 1] < 0x90) || (c == 0xf4 && bytes[i + 1] >= 0x90))
      return false;
    i += len;
  }
  *bad_at = size;
  return controls * 100 <= size;
}

bool named_bin(const std::string& path) { return path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0; }

}  // namespace

DataFileReading data_file_reading(const std::string& path) {
  constexpr std::size_t kSampleBytes = 64 << 10, kTinyBytes = 16;
  const std::string problem = file_read_problem(path);
  STRATUM_CHECK(problem.empty(), where(path), " ", problem);
  FileDescriptor fd(file_open_read(path));
  STRATUM_CHECK(fd.get() >= 0, where(path), ": cannot open: ", std::strerror(errno));
  struct stat st {};
  STRATUM_CHECK(::fstat(fd.get(), &st) == 0, where(path), ": cannot stat: ", std::strerror(errno));
  const auto size_bytes = static_cast<std::uint64_t>(st.st_size);
  STRATUM_CHECK(size_bytes > 0, where(path), " is empty; give a text file or a token file");
  std::vector<unsigned char> sample(static_cast<std::size_t>(std::min<std::uint64_t>(size_bytes, kSampleBytes)));
  read_exact(path, fd.get(), 0, sample.data(), sample.size());
  DataFileReading out;
  std::int32_t magic = 0;
  if (sample.size() >= sizeof(magic)) std::memcpy(&magic, sample.data(), sizeof(magic));
  if (magic == kLlmcMagic || magic == kMaskedMagic) {
    out.kind = magic == kLlmcMagic ? DataFileKind::LlmcShard : DataFileKind::MaskedShard;
    return out;
  }
  std::size_t bad_at = 0;
  const bool text = looks_like_text(sample.data(), sample.size(), sample.size() < size_bytes, &bad_at);
  if (text && size_bytes < kTinyBytes) {
    out.kind = named_bin(path) ? DataFileKind::RawU16 : DataFileKind::Text;
    if (named_bin(path)) out.not_text = "it is named .bin and too short to tell text from token ids";
    return out;
  }
  if (text) {
    out.kind = DataFileKind::Text;
    if (named_bin(path))
      out.note = "'" + path + "' is named .bin but holds UTF-8 text: reading it as text, not as uint16 token ids";
    return out;
  }
  // Text with a stray byte: a token file is not valid UTF-8 for long (half of all ids have a low
  // byte of 0x80 or more, which rarely continues a sequence), so kTextRun valid bytes mean text.
  constexpr std::size_t kTextRun = 4096;
  STRATUM_CHECK(bad_at < kTextRun || bad_at >= sample.size(), where(path), " is UTF-8 text up to byte ", bad_at,
                ", which is not UTF-8: re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove the stray "
                "bytes; a token file would not read as text that far");
  STRATUM_CHECK(size_bytes % 2 == 0, where(path), " is neither UTF-8 text (byte ", bad_at,
                " is not) nor a raw uint16 token file (it has an odd number of bytes, ", size_bytes,
                "); give a text file or a token file made by 'stratum prepare'");
  out.kind = DataFileKind::RawU16;
  out.not_text = bad_at < sample.size() ? "byte " + std::to_string(bad_at) + " is not UTF-8"
                                        : "over 1% of its first bytes are control characters";
  if (!named_bin(path))
    out.note = "'" + path + "' is not UTF-8 text (" + out.not_text + "): reading it as raw uint16 token ids";
  return out;
}

TokenFileData token_file_read(const std::string& path) {
  FileDescriptor fd(file_open_read(path));
  STRATUM_CHECK(fd.get() >= 0, where(path), ": cannot open: ", std::strerror(errno),
                errno == ENOENT ? " (check the path, or run 'stratum prepare' to make token files)" : "");
  struct stat st {};
  STRATUM_CHECK(::fstat(fd.get(), &st) == 0, where(path), ": cannot stat: ", std::strerror(errno));
  STRATUM_CHECK(S_ISREG(st.st_mode), where(path), " is not a regular file");
  const auto size_bytes = static_cast<std::uint64_t>(st.st_size);
  STRATUM_CHECK(size_bytes > 0, where(path), " is empty; expected token ids");

  std::int32_t magic = 0;
  if (size_bytes >= sizeof(magic)) read_exact(path, fd.get(), 0, &magic, sizeof(magic));
  TokenFileData out;
  if (magic != kLlmcMagic && magic != kMaskedMagic) {
    STRATUM_CHECK(size_bytes % 2 == 0, where(path), " has ", size_bytes,
                  " bytes, an odd count; a raw uint16 token file has an even size (wrong format?)");
    out.format = TokenFileFormat::RawU16;
    out.tokens.resize(static_cast<std::size_t>(size_bytes / 2));
    tokens_read<std::uint16_t>(path, fd.get(), 0, out.tokens);
    return out;
  }

  const bool masked = magic == kMaskedMagic;
  const char* kind = masked ? "masked shard" : "llm.c shard";
  out.format = masked ? TokenFileFormat::MaskedShard : TokenFileFormat::LlmcShard;
  STRATUM_CHECK(size_bytes >= kLlmcHeaderBytes, where(path), ": ", kind, " header is truncated: file has ",
                size_bytes, " bytes, the header needs ", kLlmcHeaderBytes);
  std::int32_t header[kLlmcHeaderInts];
  read_exact(path, fd.get(), 0, header, kLlmcHeaderBytes);
  const std::int32_t version = header[1];
  if (masked)
    STRATUM_CHECK(version == 1, where(path), ": unsupported masked shard version ", version,
                  "; expected 1 (uint32 tokens, bit 31 the loss mask)");
  else
    STRATUM_CHECK(version == 1 || version == 2, where(path), ": unsupported llm.c shard version ", version,
                  "; expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  const std::int32_t ntok = header[2];
  STRATUM_CHECK(ntok > 0, where(path), ": ", kind, " header says ", ntok, " tokens; expected at least 1");
  const std::uint64_t elem_bytes = version == 1 && !masked ? 2 : 4;
  const std::uint64_t want_bytes = static_cast<std::uint64_t>(ntok) * elem_bytes;
  const std::uint64_t have_bytes = size_bytes - kLlmcHeaderBytes;
  STRATUM_CHECK(have_bytes >= want_bytes, where(path), ": ", kind, " is truncated: header says ", ntok,
                " tokens (", want_bytes, " bytes) but only ", have_bytes, " bytes follow the header");
  STRATUM_CHECK(have_bytes == want_bytes, where(path), ": ", kind, " has ", have_bytes - want_bytes,
                " unexpected bytes after the ", ntok, " tokens its header declares");
  out.tokens.resize(static_cast<std::size_t>(ntok));
  if (elem_bytes == 2) {
    tokens_read<std::uint16_t>(path, fd.get(), kLlmcHeaderBytes, out.tokens);
  } else {
    tokens_read<std::uint32_t>(path, fd.get(), kLlmcHeaderBytes, out.tokens, masked);
  }
  return out;
}

void token_file_write_raw_u16(const std::string& path, const std::vector<std::int32_t>& tokens) {
  tokens_check(path, tokens, true);
  file_write_atomic(path, [&](const ByteSink& sink) { tokens_sink<std::uint16_t>(sink, tokens); });
}

namespace {
// llm.c's 256-int32 header {magic, version, count} and the tokens as uint16 (u16) or as their 32
// bits, written atomically; `kind` names the layout in the count's refusal.
void shard_write(const std::string& path, const char* kind, std::int32_t magic, std::int32_t version, bool u16,
                 const std::vector<std::int32_t>& tokens) {
  STRATUM_CHECK(tokens.size() <= static_cast<std::size_t>(INT32_MAX), where(path), ": ", tokens.size(),
                " tokens do not fit ", kind, " (at most ", INT32_MAX, ")");
  std::int32_t header[kLlmcHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  file_write_atomic(path, [&](const ByteSink& sink) {
    sink(header, kLlmcHeaderBytes);
    if (u16) tokens_sink<std::uint16_t>(sink, tokens);
    else tokens_sink<std::uint32_t>(sink, tokens);
  });
}
}  // namespace

void token_file_write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens) {
  const bool u16 = tokens_check(path, tokens, false);
  shard_write(path, "an llm.c shard", kLlmcMagic, u16 ? 1 : 2, u16, tokens);
}

void token_file_write_masked(const std::string& path, const std::vector<std::int32_t>& tokens) {
  STRATUM_CHECK(!tokens.empty(), where(path), ": refusing to write a token file with zero tokens");
  STRATUM_CHECK(std::any_of(tokens.begin(), tokens.end(), token_is_target), where(path),
                ": no token is a loss target; a masked shard needs at least one");
  shard_write(path, "a masked shard", kMaskedMagic, 1, false, tokens);  // the 32 bits as held (Note [loss mask])
}

std::size_t token_target_count(const std::int32_t* tokens, std::size_t n) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += token_is_target(tokens[i]) ? 1 : 0;
  return count;
}

std::string token_file_format_name(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::RawU16: return "raw-u16";
    case TokenFileFormat::LlmcShard: return "llmc-shard";
    case TokenFileFormat::MaskedShard: return "masked-shard";
  }
  STRATUM_ASSERT(false && "unknown TokenFileFormat");
  return "";
}

}  // namespace stratum
