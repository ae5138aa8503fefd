// Text from outside (a corrupt file's bytes that a message quotes) made safe for one terminal
// line: control bytes and bytes that are not UTF-8 as \xNN, valid UTF-8 as it is. Error lines
// (cli/main.cpp), verify's report and the tokenizer's quotes all print through it.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace stratum {

inline std::string printable_text(std::string_view text) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  auto escape = [&](unsigned char c) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  };
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) escape(c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    const std::size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool valid = len > 0 && i + len <= n;
    for (std::size_t k = 1; valid && k < len; ++k) valid = (p[i + k] & 0xc0) == 0x80;
    if (!valid) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text.data() + i, len);
    i += len;
  }
  return out;
}

}  // namespace stratum
