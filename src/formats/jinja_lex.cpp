// Jinja source -> tokens (Note [jinja subset] in jinja.h): the text between tags with the
// whitespace controls (- and +), trim_blocks and lstrip_blocks applied as Jinja2's lexer applies
// them, and the names, literals and operators inside each tag.
#include <cerrno>
#include <cstdlib>

#include "formats/jinja_internal.h"
#include "stratum/error.h"

namespace stratum::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& where) : src_(source), where_(where) {
    // keep_trailing_newline=False: one final newline is not part of the template.
    if (src_.size() >= 2 && src_.substr(src_.size() - 2) == "\r\n") src_.remove_suffix(2);
    else if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
  }

  std::vector<Token> run() {
    bool strip_next = false;  // the last tag ended with '-': the data after it loses its leading whitespace
    while (pos_ < src_.size()) {
      std::size_t t = src_.find('{', pos_);
      while (t != std::string_view::npos && (t + 1 >= src_.size() || (src_[t + 1] != '{' && src_[t + 1] != '%' && src_[t + 1] != '#')))
        t = src_.find('{', t + 1);
      const std::size_t data_end = t == std::string_view::npos ? src_.size() : t;
      std::string data(src_.substr(pos_, data_end - pos_));
      const int data_line = line_;
      const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
      advance_to(data_end);
      if (strip_next) data.erase(0, first_not_space(data));
      strip_next = false;
      if (t != std::string_view::npos) {
        const char kind = src_[t + 1];
        const char control = t + 2 < src_.size() ? src_[t + 2] : '\0';
        if (control == '-') {
          data.erase(last_not_space(data));
        } else if (control != '+' && kind != '{') {  // lstrip_blocks: a block or comment tag alone on its line
          const std::size_t nl = data.rfind('\n');
          const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
          if ((nl != std::string::npos || line_starting) && data.find_first_not_of(" \t", from) == std::string::npos)
            data.erase(from);
        }
      }
      if (!data.empty()) tokens_.push_back({Token::Kind::Data, std::move(data), data_line});
      if (t == std::string_view::npos) break;
      const char kind = src_[t + 1];
      const char control = t + 2 < src_.size() ? src_[t + 2] : '\0';
      advance_to(t + 2 + ((control == '-' || control == '+') ? 1 : 0));
      if (kind == '#') {
        const std::size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) error(line_, "a comment {# without its #}");
        const char before = end > pos_ ? src_[end - 1] : '\0';
        advance_to(end + 2);
        strip_next = before == '-';
        if (before != '+' && before != '-') trim_newline();
        continue;
      }
      strip_next = tag(kind == '{');
    }
    tokens_.push_back({Token::Kind::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  static std::size_t first_not_space(const std::string& s) {
    std::size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
  }
  static std::size_t last_not_space(const std::string& s) {
    std::size_t i = s.size();
    while (i > 0 && is_space(s[i - 1])) --i;
    return i;
  }
  void advance_to(std::size_t to) {
    for (; pos_ < to && pos_ < src_.size(); ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }
  void trim_newline() {  // trim_blocks: the newline right after a block or comment tag
    if (pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);
    else if (src_.substr(pos_, 2) == "\r\n") advance_to(pos_ + 2);
  }
  [[noreturn]] void error(int line, const std::string& what) const {
    STRATUM_FAIL("[template] ", where_, " line ", line, ": ", what);
  }
  bool at(std::string_view s) const { return src_.substr(pos_, s.size()) == s; }

  // The tokens of one {{ }} or {% %} tag after its opening; returns whether it ended with '-'.
  bool tag(bool variable) {
    const int open_line = line_;
    tokens_.push_back({variable ? Token::Kind::VarBegin : Token::Kind::BlockBegin, "", line_});
    int depth = 0;  // open brackets: a '}}' inside a dict literal does not end the tag
    const std::string_view close = variable ? "}}" : "%}";
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) error(open_line, variable ? "a {{ without its }}" : "a {% without its %}");
      if (depth == 0) {
        const bool minus = src_[pos_] == '-' && src_.substr(pos_ + 1, 2) == close;
        const bool plus = !variable && src_[pos_] == '+' && src_.substr(pos_ + 1, 2) == close;
        if (minus || plus || at(close)) {
          advance_to(pos_ + 2 + (minus || plus ? 1 : 0));
          tokens_.push_back({variable ? Token::Kind::VarEnd : Token::Kind::BlockEnd, "", line_});
          if (!variable && !minus && !plus) trim_newline();
          return minus;
        }
      }
      const char c = src_[pos_];
      if (is_name_start(c)) {
        std::size_t e = pos_;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        tokens_.push_back({Token::Kind::Name, std::string(src_.substr(pos_, e - pos_)), line_});
        advance_to(e);
      } else if (is_digit(c)) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                           "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (at(o)) {
            op = o;
            break;
          }
        if (op == nullptr) error(line_, std::string("unexpected character '") + c + "'");
        const std::string text = op;
        if (text == "(" || text == "[" || text == "{") ++depth;
        if ((text == ")" || text == "]" || text == "}") && depth > 0) --depth;
        tokens_.push_back({Token::Kind::Op, text, line_});
        advance_to(pos_ + text.size());
      }
    }
  }

  void number() {
    std::size_t e = pos_;
    std::string digits;
    auto run = [&] {
      while (e < src_.size() && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && is_digit(src_[e + 1]))))
        if (src_[e++] != '_') digits += src_[e - 1];
    };
    run();
    bool real = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      real = true;
      digits += src_[e++];
      run();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      std::size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        real = true;
        digits += 'e';
        digits.append(src_.substr(e + 1, k - e - 1));
        e = k;
        run();
      }
    }
    Token tok{real ? Token::Kind::Float : Token::Kind::Int, digits, line_};
    if (real) tok.f = std::strtod(digits.c_str(), nullptr);
    else {
      errno = 0;
      tok.i = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno != 0) error(line_, "the integer " + digits + " is too large");
    }
    tokens_.push_back(tok);
    advance_to(e);
  }

  void string_literal(char quote) {
    const int start_line = line_;
    std::string out;
    std::size_t e = pos_ + 1;
    for (;; ++e) {
      if (e >= src_.size()) error(start_line, "a string without its closing quote");
      const char c = src_[e];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++e >= src_.size()) error(start_line, "a string without its closing quote");
      const char x = src_[e];
      switch (x) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': out += '\0'; break;
        case '\\': case '\'': case '"': out += x; break;
        case '\n': break;  // a line continuation
        case 'x': case 'u': case 'U': {
          const std::size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
          if (e + n >= src_.size()) error(start_line, "a short \\" + std::string(1, x) + " escape");
          const std::string hex(src_.substr(e + 1, n));
          if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            error(start_line, "a bad \\" + std::string(1, x) + " escape");
          const std::uint32_t cp = static_cast<std::uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(start_line, "an escape outside Unicode");
          append_utf8(out, cp);
          e += n;
          break;
        }
        default: out += '\\'; out += x;  // Python keeps an unknown escape as written
      }
    }
    tokens_.push_back({Token::Kind::String, std::move(out), start_line});
    advance_to(e + 1);
  }

  std::string_view src_;
  const std::string& where_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& where) { return Lexer(source, where).run(); }

}  // namespace stratum::jinja
