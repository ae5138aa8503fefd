// The Jinja engine's values with Python's semantics (Note [jinja subset] in jinja.h): str(),
// json.dumps, truthiness, ==, <, the arithmetic operators, `in`, subscripts, slices by code point.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "formats/jinja_internal.h"

namespace stratum::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Args::get(std::size_t i, const char* name, Value fallback) const {
  if (i < positional.size()) return positional[i];
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}

void fail(int line, std::string what) { throw RenderError{line, std::move(what)}; }

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s.empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->items.empty();
    default: return true;
  }
}

namespace {
double number(const Value& v) { return v.kind == Value::Kind::Float ? v.f : v.kind == Value::Kind::Bool ? (v.b ? 1 : 0) : static_cast<double>(v.i); }
std::int64_t whole(const Value& v) { return v.kind == Value::Kind::Bool ? (v.b ? 1 : 0) : v.i; }
bool is_whole(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }

// The byte offset of every code point of s, and s.size() last.
std::vector<std::size_t> code_point_offsets(std::string_view s) {
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

// Python's float repr: the shortest digits that read back, fixed between 1e-4 and 1e16.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const std::size_t e_at = sci.find('e');
  const int exp = std::stoi(sci.substr(e_at + 1));
  std::string digits;
  bool negative = false;
  for (std::size_t k = 0; k < e_at; ++k) {
    if (sci[k] == '-') negative = true;
    else if (sci[k] != '.') digits += sci[k];
  }
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else {
      const std::size_t point = static_cast<std::size_t>(exp) + 1;
      if (digits.size() <= point) out += digits + std::string(point - digits.size(), '0') + ".0";
      else out += digits.substr(0, point) + "." + digits.substr(point);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + e;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string repr(const Value& v) {
  if (v.kind != Value::Kind::String) return to_str(v);
  const bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char c : v.s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') out += std::string("\\") + c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else out += c;
  }
  return out + q;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", u);
          out += hex;
        } else out += c;
    }
  }
  out += '"';
}

void json_value(const Value& v, int indent, int level, int line, std::string& out) {
  auto newline = [&](int l) {
    if (indent >= 0) out += "\n" + std::string(static_cast<std::size_t>(indent * l), ' ');
  };
  const char* comma = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
      return;
    case Value::Kind::String: json_string(v.s, out); return;
    case Value::Kind::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += comma;
        newline(level + 1);
        json_value((*v.list)[k], indent, level + 1, line, out);
      }
      newline(level);
      out += ']';
      return;
    case Value::Kind::Dict:
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) out += comma;
        newline(level + 1);
        json_string(v.dict->items[k].first, out);
        out += ": ";
        json_value(v.dict->items[k].second, indent, level + 1, line, out);
      }
      newline(level);
      out += '}';
      return;
    default: fail(line, "tojson: an object of type " + type_name(v) + " is not JSON serializable");
  }
}

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > 128) fail(0, "the context nests deeper than 128 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      return u > static_cast<std::uint64_t>(INT64_MAX) ? Value::real(static_cast<double>(u))
                                                        : Value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json_at(e, depth + 1));
      return Value::of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.set(k, from_json_at(e, depth + 1));
      return Value::of_dict(std::move(d));
    }
    default: return Value::none();
  }
}
}  // namespace

std::size_t code_points(std::string_view s) { return code_point_offsets(s).size() - 1; }

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      return out + (!v.tuple ? "]" : v.list->size() == 1 ? ",)" : ")");
    }
    case Value::Kind::Dict: case Value::Kind::Namespace: {
      std::string out = v.kind == Value::Kind::Dict ? "{" : "<Namespace {";
      for (std::size_t k = 0; k < v.dict->items.size(); ++k) {
        const auto& [key, val] = v.dict->items[k];
        // A namespace holding itself (set ns.self = ns) prints as Python's "{...}" does, not forever.
        const bool self = val.dict == v.dict;
        out += (k ? ", " : "") + repr(Value::string(key)) + ": " + (self ? std::string("...") : repr(val));
      }
      return out + (v.kind == Value::Kind::Dict ? "}" : "}>");
    }
    case Value::Kind::Function: return "<function>";
  }
  return "";
}

std::string to_json(const Value& v, int indent, int line) {
  std::string out;
  json_value(v, indent, 0, line, out);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return is_whole(a) && is_whole(b) ? whole(a) == whole(b) : number(a) == number(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::String: return a.s == b.s;
    case Value::Kind::List:
      return a.tuple == b.tuple && a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), [](const Value& x, const Value& y) { return equal(x, y); });
    case Value::Kind::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (o == nullptr || !equal(v, *o)) return false;
      }
      return true;
    case Value::Kind::Namespace: return a.dict == b.dict;
    case Value::Kind::Function: return a.fn == b.fn;
    default: return true;  // Undefined, None
  }
}

int compare(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (is_whole(a) && is_whole(b)) return whole(a) < whole(b) ? -1 : whole(a) > whole(b) ? 1 : 0;
    return number(a) < number(b) ? -1 : number(a) > number(b) ? 1 : 0;
  }
  if (a.kind == Value::Kind::String && b.kind == Value::Kind::String) return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
  if (a.kind == Value::Kind::List && b.kind == Value::Kind::List) {
    for (std::size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k)
      if (const int c = compare((*a.list)[k], (*b.list)[k], line); c != 0) return c;
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(line, "cannot order " + type_name(a) + " and " + type_name(b));
}

bool contains(const Value& container, const Value& x, int line) {
  switch (container.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (x.kind != Value::Kind::String) fail(line, "'in <string>' needs a string on its left, not " + type_name(x));
      return container.s.find(x.s) != std::string::npos;
    case Value::Kind::List:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& e) { return equal(e, x); });
    case Value::Kind::Dict: case Value::Kind::Namespace:
      return x.kind == Value::Kind::String && container.dict->find(x.s) != nullptr;
    default: fail(line, "'in' needs a string, list or dict on its right, not " + type_name(container));
  }
}

Value binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  if (op == "==") return Value::boolean(equal(a, b));
  if (op == "!=") return Value::boolean(!equal(a, b));
  if (op == "<") return Value::boolean(compare(a, b, line) < 0);
  if (op == ">") return Value::boolean(compare(a, b, line) > 0);
  if (op == "<=") return Value::boolean(compare(a, b, line) <= 0);
  if (op == ">=") return Value::boolean(compare(a, b, line) >= 0);
  if (op == "in") return Value::boolean(contains(b, a, line));
  if (op == "not in") return Value::boolean(!contains(b, a, line));
  if (!a.defined() || !b.defined()) fail(line, "an undefined value used with '" + op + "'");
  const bool ints = is_whole(a) && is_whole(b);
  if (a.is_number() && b.is_number()) {
    const double x = number(a), y = number(b);
    std::int64_t r = 0;
    const std::int64_t p = whole(a), q = whole(b);
    // Python's ints do not overflow; past 64 bits the template is refused rather than wrapped.
    auto checked = [&](bool overflowed) {
      if (overflowed) fail(line, "an integer result of '" + op + "' beyond 64 bits");
      return Value::integer(r);
    };
    if (op == "+") return ints ? checked(__builtin_add_overflow(p, q, &r)) : Value::real(x + y);
    if (op == "-") return ints ? checked(__builtin_sub_overflow(p, q, &r)) : Value::real(x - y);
    if (op == "*") return ints ? checked(__builtin_mul_overflow(p, q, &r)) : Value::real(x * y);
    if ((op == "/" || op == "//" || op == "%") && y == 0) fail(line, "division by zero");
    if (op == "/") return Value::real(x / y);
    if (ints && q == -1 && p == INT64_MIN && (op == "//" || op == "%")) return checked(op == "//");
    if (op == "//") {
      if (!ints) return Value::real(std::floor(x / y));
      const std::int64_t d = p / q;
      return Value::integer(d * q != p && ((p < 0) != (q < 0)) ? d - 1 : d);
    }
    if (op == "%") {
      if (!ints) {
        const double m = std::fmod(x, y);
        return Value::real(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
      }
      const std::int64_t m = p % q;
      return Value::integer(m != 0 && ((m < 0) != (q < 0)) ? m + q : m);
    }
    if (op == "**") {
      if (ints && q >= 0) {  // |p| >= 2 overflows within 63 factors
        r = p == 0 ? (q == 0 ? 1 : 0) : p == 1 ? 1 : p == -1 ? (q % 2 ? -1 : 1) : 1;
        for (std::int64_t k = 0; k < q && (p < -1 || p > 1); ++k)
          if (__builtin_mul_overflow(r, p, &r)) checked(true);
        return Value::integer(r);
      }
      return Value::real(std::pow(x, y));
    }
  }
  if (op == "+" && a.kind == Value::Kind::String && b.kind == Value::Kind::String) {
    if (!a.safe && !b.safe) return Value::string(a.s + b.s);
    // Markup + str escapes the plain one (Jinja's |safe strings are markupsafe's Markup).
    Value joined = Value::string((a.safe ? a.s : html_escape(a.s)) + (b.safe ? b.s : html_escape(b.s)));
    joined.safe = true;
    return joined;
  }
  if (op == "+" && a.kind == Value::Kind::List && b.kind == Value::Kind::List) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "*" && is_whole(a) && (b.kind == Value::Kind::String || b.kind == Value::Kind::List)) return binary(op, b, a, line);
  if (op == "*" && (a.kind == Value::Kind::String || a.kind == Value::Kind::List) && is_whole(b)) {
    const std::int64_t n = std::max<std::int64_t>(whole(b), 0);
    const std::size_t unit = a.kind == Value::Kind::String ? a.s.size() : a.list->size();
    if (unit > 0 && static_cast<std::uint64_t>(n) > (64u << 20) / unit) fail(line, "a repetition longer than 64 Mi");
    if (a.kind == Value::Kind::String) {
      std::string s;
      for (std::int64_t k = 0; k < n; ++k) s += a.s;
      return Value::string(std::move(s));
    }
    List l;
    for (std::int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "%" && a.kind == Value::Kind::String) fail(line, "printf-style '%' formatting of strings is not supported");
  fail(line, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value item(const Value& obj, const Value& key, int line) {
  switch (obj.kind) {
    case Value::Kind::Undefined: fail(line, "a subscript of an undefined value");
    case Value::Kind::Dict: case Value::Kind::Namespace:
      if (key.kind == Value::Kind::String)
        if (const Value* v = obj.dict->find(key.s)) return *v;
      return Value();
    case Value::Kind::List: case Value::Kind::String: {
      if (!is_whole(key)) return Value();
      std::vector<std::size_t> at;
      const std::int64_t n = obj.kind == Value::Kind::List ? static_cast<std::int64_t>(obj.list->size())
                                                            : static_cast<std::int64_t>((at = code_point_offsets(obj.s)).size() - 1);
      std::int64_t k = whole(key);
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value();
      if (obj.kind == Value::Kind::List) return (*obj.list)[static_cast<std::size_t>(k)];
      return Value::string(obj.s.substr(at[static_cast<std::size_t>(k)], at[static_cast<std::size_t>(k) + 1] - at[static_cast<std::size_t>(k)]));
    }
    default: return Value();
  }
}

Value attribute(const Value& obj, const std::string& name, int line) {
  if (!obj.defined()) fail(line, "the attribute '" + name + "' of an undefined value");
  return item(obj, Value::string(name), line);
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (obj.kind != Value::Kind::List && obj.kind != Value::Kind::String)
    fail(line, "a slice of " + type_name(obj) + " (slices are for lists and strings)");
  for (const Value* b : {&start, &stop, &step})
    if (b->defined() && b->kind != Value::Kind::None && !is_whole(*b)) fail(line, "slice bounds must be integers or none");
  const std::vector<std::size_t> at = obj.kind == Value::Kind::String ? code_point_offsets(obj.s) : std::vector<std::size_t>{};
  const std::int64_t n = obj.kind == Value::Kind::List ? static_cast<std::int64_t>(obj.list->size())
                                                        : static_cast<std::int64_t>(at.size() - 1);
  const std::int64_t st = is_whole(step) ? whole(step) : 1;
  if (st == 0) fail(line, "a slice step of zero");
  auto bound = [&](const Value& v, std::int64_t dflt) {
    if (!is_whole(v)) return dflt;
    std::int64_t k = whole(v);
    if (k < 0) k += n;
    return st > 0 ? std::clamp<std::int64_t>(k, 0, n) : std::clamp<std::int64_t>(k, -1, n - 1);
  };
  const std::int64_t b = bound(start, st > 0 ? 0 : n - 1), e = bound(stop, st > 0 ? n : -1);
  List l;
  std::string s;
  for (std::int64_t k = b; st > 0 ? k < e : k > e;) {
    const auto u = static_cast<std::size_t>(k);
    if (obj.kind == Value::Kind::List) l.push_back((*obj.list)[u]);
    else s.append(obj.s, at[u], at[u + 1] - at[u]);
    if (__builtin_add_overflow(k, st, &k)) break;
  }
  return obj.kind == Value::Kind::List ? Value::of_list(std::move(l)) : Value::string(std::move(s));
}

std::vector<Value> iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      const std::vector<std::size_t> at = code_point_offsets(v.s);
      std::vector<Value> chars;
      for (std::size_t k = 0; k + 1 < at.size(); ++k) chars.push_back(Value::string(v.s.substr(at[k], at[k + 1] - at[k])));
      return chars;
    }
    default: fail(line, "'" + type_name(v) + "' object is not iterable");
  }
}

}  // namespace stratum::jinja
