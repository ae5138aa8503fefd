// The Jinja engine's filters, tests, string and dict methods and globals (Note [jinja subset] in
// jinja.h), each as Jinja2 3.1 and Python 3 define it.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <set>

#include "formats/jinja_internal.h"

namespace stratum::jinja {

namespace {
const char* const kSpaces = " \t\n\r\f\v";

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::string set = chars.kind == Value::Kind::String ? chars.s : kSpaces;
  std::size_t b = 0, e = s.size();
  if (left) while (b < e && set.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

// ASCII case mapping (a chat template's roles and markers are ASCII; other letters pass unchanged).
char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
char upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }
bool letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
std::string mapped(std::string s, char (*f)(char)) {
  for (char& c : s) c = f(c);
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = mapped(s, lower);
  if (!out.empty()) out[0] = upper(out[0]);
  return out;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    c = start ? upper(c) : lower(c);
    start = !letter(c);
  }
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count) {
  std::string out;
  std::size_t at = 0;
  for (std::int64_t done = 0; count < 0 || done < count; ++done) {
    if (old.empty()) {  // Python inserts `with` between every character (and at both ends)
      if (at > s.size()) break;
      out += with;
      if (at < s.size()) out += s[at];
      ++at;
      continue;
    }
    const std::size_t hit = s.find(old, at);
    if (hit == std::string::npos) break;
    out.append(s, at, hit - at);
    out += with;
    at = hit + old.size();
  }
  if (at < s.size()) out.append(s, at, std::string::npos);
  return out;
}

// str.split / str.rsplit: by runs of whitespace when sep is none, else by sep exactly.
List split(const std::string& s, const Value& sep, std::int64_t max, bool from_right, int line) {
  std::vector<std::string> parts;
  if (sep.kind != Value::Kind::String) {  // runs of whitespace; past max splits the rest is one part, as it stands
    const auto npos = std::string::npos;
    if (!from_right) {
      for (std::size_t i = s.find_first_not_of(kSpaces); i != npos;) {
        if (max >= 0 && static_cast<std::int64_t>(parts.size()) == max) {
          parts.push_back(s.substr(i));
          break;
        }
        const std::size_t j = std::min(s.find_first_of(kSpaces, i), s.size());
        parts.push_back(s.substr(i, j - i));
        i = s.find_first_not_of(kSpaces, j);
      }
    } else {
      for (std::size_t e = s.find_last_not_of(kSpaces); e != npos;) {  // e: a part's last character
        if (max >= 0 && static_cast<std::int64_t>(parts.size()) == max) {
          parts.push_back(s.substr(0, e + 1));
          break;
        }
        const std::size_t b = s.find_last_of(kSpaces, e);
        const std::size_t from = b == npos ? 0 : b + 1;
        parts.push_back(s.substr(from, e + 1 - from));
        e = b == npos ? npos : s.find_last_not_of(kSpaces, b);
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    if (sep.s.empty()) fail(line, "split: an empty separator");
    if (!from_right) {
      std::size_t at = 0;
      for (std::int64_t k = 0; max < 0 || k < max; ++k) {
        const std::size_t hit = s.find(sep.s, at);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(at, hit - at));
        at = hit + sep.s.size();
      }
      parts.push_back(s.substr(at));
    } else {
      std::size_t end = s.size();
      std::vector<std::string> rev;
      for (std::int64_t k = 0; max < 0 || k < max; ++k) {
        if (end < sep.s.size()) break;
        const std::size_t hit = s.rfind(sep.s, end - sep.s.size());
        if (hit == std::string::npos) break;
        rev.push_back(s.substr(hit + sep.s.size(), end - hit - sep.s.size()));
        end = hit;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  List out;
  for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::int64_t integer_arg(const Value& v, std::int64_t fallback, int line, const char* what) {
  if (!v.defined() || v.kind == Value::Kind::None) return fallback;
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Bool) return v.b ? 1 : 0;
  fail(line, std::string(what) + " must be an integer, not " + type_name(v));
}

const std::string& string_arg(const Value& v, int line, const char* what) {
  if (v.kind != Value::Kind::String) fail(line, std::string(what) + " must be a string, not " + type_name(v));
  return v.s;
}

bool number_like(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Float || v.kind == Value::Kind::Bool; }

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "abs", "capitalize", "count", "d", "default", "dictsort", "first", "float", "indent", "int", "items", "join", "last", "length",
      "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
      "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper"};
  return names;
}
const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "float", "ge",
      "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
      "sequence", "string", "true", "undefined", "upper", "==", "!=", "<", ">", "<=", ">="};
  return names;
}

// The attribute path "a.b" of a value (selectattr, map, sort, join, sum).
Value attr_path(const Value& v, const std::string& path, int line) {
  Value cur = v;
  std::size_t at = 0;
  while (at <= path.size()) {
    const std::size_t dot = std::min(path.find('.', at), path.size());
    const std::string part = path.substr(at, dot - at);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    cur = digits ? item(cur, Value::integer(std::stoll(part)), line) : attribute(cur, part, line);
    at = dot + 1;
  }
  return cur;
}
}  // namespace

bool filter_known(const std::string& name) { return filter_names().count(name) > 0; }
bool test_known(const std::string& name) { return test_names().count(name) > 0; }

bool apply_test(const std::string& name, const Value& v, Args& args) {
  const int line = args.line;
  const Value a = args.get(0, "value");
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "none") return v.kind == Value::Kind::None;
  if (name == "boolean") return v.kind == Value::Kind::Bool;
  if (name == "true") return v.kind == Value::Kind::Bool && v.b;
  if (name == "false") return v.kind == Value::Kind::Bool && !v.b;
  if (name == "integer") return v.kind == Value::Kind::Int;
  if (name == "float") return v.kind == Value::Kind::Float;
  if (name == "number") return number_like(v);
  if (name == "string") return v.kind == Value::Kind::String;
  if (name == "mapping") return v.kind == Value::Kind::Dict;
  if (name == "iterable") return v.kind == Value::Kind::Undefined || v.kind == Value::Kind::List || v.kind == Value::Kind::Dict || v.kind == Value::Kind::String;
  if (name == "sequence") return v.kind == Value::Kind::List || v.kind == Value::Kind::Dict || v.kind == Value::Kind::String;
  if (name == "callable") return v.kind == Value::Kind::Function;
  if (name == "escaped") return false;
  if (name == "lower") return v.kind == Value::Kind::String && mapped(v.s, lower) == v.s && std::any_of(v.s.begin(), v.s.end(), letter);
  if (name == "upper") return v.kind == Value::Kind::String && mapped(v.s, upper) == v.s && std::any_of(v.s.begin(), v.s.end(), letter);
  if (name == "even" || name == "odd") {
    const std::int64_t k = integer_arg(v, 0, line, "the value of 'even'/'odd'");
    return (k % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const std::int64_t d = integer_arg(a, 0, line, "divisibleby's argument");
    if (d == 0) fail(line, "divisibleby 0");
    return d == -1 || integer_arg(v, 0, line, "the value of 'divisibleby'") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, a);
  if (name == "ne" || name == "!=") return !equal(v, a);
  if (name == "lt" || name == "<") return compare(v, a, line) < 0;
  if (name == "gt" || name == ">") return compare(v, a, line) > 0;
  if (name == "le" || name == "<=") return compare(v, a, line) <= 0;
  if (name == "ge" || name == ">=") return compare(v, a, line) >= 0;
  if (name == "in") return contains(a, v, line);
  if (name == "sameas") {  // identity: the singletons None/True/False, else the same container
    if (v.kind != a.kind) return false;
    if (v.kind == Value::Kind::None || v.kind == Value::Kind::Undefined) return true;
    if (v.kind == Value::Kind::Bool) return v.b == a.b;
    if (v.kind == Value::Kind::List) return v.list == a.list;
    if (v.kind == Value::Kind::Dict || v.kind == Value::Kind::Namespace) return v.dict == a.dict;
    return equal(v, a);
  }
  return false;
}

Value apply_filter(const std::string& name, const Value& v, Args& args) {
  const int line = args.line;
  auto as_list = [&](const Value& x) { return iterate(x, line); };
  if (name == "length" || name == "count") {
    if (v.kind == Value::Kind::String) return Value::integer(static_cast<std::int64_t>(code_points(v.s)));
    if (v.kind == Value::Kind::List) return Value::integer(static_cast<std::int64_t>(v.list->size()));
    if (v.kind == Value::Kind::Dict) return Value::integer(static_cast<std::int64_t>(v.dict->items.size()));
    if (!v.defined()) return Value::integer(0);
    fail(line, "length of " + type_name(v));
  }
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe") {
    Value marked = v.kind == Value::Kind::String ? v : Value::string(to_str(v));
    marked.safe = true;
    return marked;
  }
  if (name == "dictsort") {
    if (v.kind != Value::Kind::Dict) fail(line, "dictsort of " + type_name(v) + " (a dict's filter)");
    const bool case_sensitive = truthy(args.get(0, "case_sensitive"));
    const Value by = args.get(1, "by", Value::string("key"));
    const bool by_value = by.kind == Value::Kind::String && by.s == "value";
    List items;
    for (const auto& [k, x] : v.dict->items) items.push_back(Value::of_tuple({Value::string(k), x}));
    auto key = [&](const Value& pair) {
      Value k = (*pair.list)[by_value ? 1 : 0];
      if (!case_sensitive && k.kind == Value::Kind::String) k.s = mapped(k.s, lower);
      return k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return compare(key(x), key(y), line) < 0; });
    if (truthy(args.get(2, "reverse"))) std::reverse(items.begin(), items.end());
    return Value::of_list(std::move(items));
  }
  if (name == "trim") return Value::string(strip(to_str(v), args.get(0, "chars"), true, true));
  if (name == "lower") return Value::string(mapped(to_str(v), lower));
  if (name == "upper") return Value::string(mapped(to_str(v), upper));
  if (name == "capitalize") return Value::string(capitalize(to_str(v)));
  if (name == "title") return Value::string(title(to_str(v)));
  if (name == "replace")
    return Value::string(replace(to_str(v), to_str(args.get(0, "old")), to_str(args.get(1, "new")),
                                 integer_arg(args.get(2, "count"), -1, line, "replace's count")));
  if (name == "tojson") {
    const Value indent = args.get(0, "indent");
    return Value::string(to_json(v, indent.kind == Value::Kind::Int ? static_cast<int>(std::clamp<std::int64_t>(indent.i, 0, 64)) : -1, line));
  }
  if (name == "default" || name == "d") {
    const bool boolean = truthy(args.get(1, "boolean", Value::boolean(false)));
    if (!v.defined() || (boolean && !truthy(v))) return args.get(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "int" || name == "float") {
    const Value fallback = args.get(0, "default", name == "int" ? Value::integer(0) : Value::real(0));
    double d = 0;
    if (v.kind == Value::Kind::Int) return name == "int" ? v : Value::real(static_cast<double>(v.i));
    if (v.kind == Value::Kind::Bool) return name == "int" ? Value::integer(v.b) : Value::real(v.b);
    if (v.kind == Value::Kind::Float) d = v.f;
    else if (v.kind == Value::Kind::String) {
      const std::string t = strip(v.s, Value(), true, true);
      char* end = nullptr;
      if (name == "int") {
        errno = 0;
        const long long k = std::strtoll(t.c_str(), &end, 10);
        if (!t.empty() && end && *end == '\0' && errno == 0) return Value::integer(k);
      }
      d = std::strtod(t.c_str(), &end);
      if (t.empty() || end == nullptr || *end != '\0') return fallback;
    } else {
      return fallback;
    }
    if (name == "float") return Value::real(d);
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return Value::integer(static_cast<std::int64_t>(d));
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::Int && v.i == INT64_MIN) fail(line, "abs of the smallest 64-bit integer");
    if (v.kind == Value::Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.kind == Value::Kind::Float) return Value::real(std::fabs(v.f));
    fail(line, "abs of " + type_name(v));
  }
  if (name == "round") {
    if (!number_like(v)) fail(line, "round of " + type_name(v));
    const double p = std::pow(10.0, static_cast<double>(integer_arg(args.get(0, "precision"), 0, line, "round's precision")));
    const Value method = args.get(1, "method", Value::string("common"));
    const double x = (v.kind == Value::Kind::Float ? v.f : static_cast<double>(v.kind == Value::Kind::Bool ? v.b : v.i)) * p;
    const double r = method.kind == Value::Kind::String && method.s == "floor" ? std::floor(x)
                     : method.kind == Value::Kind::String && method.s == "ceil" ? std::ceil(x)
                                                                                 : std::round(x);
    return Value::real(r / p);
  }
  if (name == "first" || name == "last") {
    const std::vector<Value> items = as_list(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::of_list(as_list(v));
  if (name == "reverse") {
    if (v.kind == Value::Kind::String) {
      std::string s;
      const std::vector<Value> chars = as_list(v);
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) s += it->s;
      return Value::string(std::move(s));
    }
    std::vector<Value> items = as_list(v);
    std::reverse(items.begin(), items.end());
    return Value::of_list(std::move(items));
  }
  if (name == "items") {
    if (!v.defined()) return Value::of_list({});
    if (v.kind != Value::Kind::Dict) fail(line, "items of " + type_name(v) + " (a dict's filter)");
    List l;
    for (const auto& [k, x] : v.dict->items) l.push_back(Value::of_tuple({Value::string(k), x}));
    return Value::of_list(std::move(l));
  }
  if (name == "join") {
    const Value attr = args.get(1, "attribute");
    std::string out, sep = to_str(args.get(0, "d", Value::string("")));
    bool first = true;
    for (const Value& x : as_list(v)) {
      out += (first ? "" : sep) + to_str(attr.kind == Value::Kind::String ? attr_path(x, attr.s, line) : x);
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "indent") {
    const Value width = args.get(0, "width", Value::integer(4));
    const std::string pad = width.kind == Value::Kind::String ? width.s : std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(integer_arg(width, 4, line, "indent's width"), 0, 1024)), ' ');
    const bool first = truthy(args.get(1, "first", Value::boolean(false)));
    const bool blank = truthy(args.get(2, "blank", Value::boolean(false)));
    const std::string s = to_str(v);
    std::string out;
    std::size_t at = 0;
    for (bool head = true; at <= s.size(); head = false) {
      const std::size_t nl = std::min(s.find('\n', at), s.size());
      const std::string ln = s.substr(at, nl - at);
      if ((!head || first) && (blank || !strip(ln, Value(), true, true).empty())) out += pad;
      out += ln;
      if (nl < s.size()) out += '\n';
      at = nl + 1;
    }
    return Value::string(std::move(out));
  }
  if ((name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" || name == "map") && !truthy(v))
    return Value::of_list({});  // Jinja's `if seq:`: none (or an empty value) gives nothing
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name.size() > 6;
    const bool keep_when = name[0] == 's';
    const std::size_t first_arg = attr ? 1 : 0;
    const std::string path = attr ? string_arg(args.get(0, "attribute"), line, "the attribute") : "";
    const Value tname = args.get(first_arg, "test");
    Args targs;
    targs.line = line;
    for (std::size_t k = first_arg + 1; k < args.positional.size(); ++k) targs.positional.push_back(args.positional[k]);
    List out;
    for (const Value& x : as_list(v)) {
      const Value subject = attr ? attr_path(x, path, line) : x;
      bool pass = truthy(subject);
      if (tname.defined()) {  // a test named at render time: unknown ones are refused here, not at parse
        const std::string& test = string_arg(tname, line, "the test's name");
        if (!test_known(test)) fail(line, "the test '" + test + "' is not supported");
        pass = apply_test(test, subject, targs);
      }
      if (pass == keep_when) out.push_back(x);
    }
    return Value::of_list(std::move(out));
  }
  if (name == "map") {
    const Value attr = args.get(99, "attribute");
    List out;
    if (attr.kind == Value::Kind::String) {
      const Value dflt = args.get(99, "default");
      for (const Value& x : as_list(v)) {
        Value y = attr_path(x, attr.s, line);
        out.push_back(!y.defined() && dflt.defined() ? dflt : y);
      }
      return Value::of_list(std::move(out));
    }
    const std::string fname = string_arg(args.get(0, "name"), line, "map's filter name");
    if (!filter_known(fname) || fname == "map") fail(line, "map: the filter '" + fname + "' is not supported");
    Args fargs;
    fargs.line = line;
    fargs.positional.assign(args.positional.begin() + 1, args.positional.end());
    for (const Value& x : as_list(v)) out.push_back(apply_filter(fname, x, fargs));
    return Value::of_list(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "sum") {
    const Value attr = args.get(name == "sort" ? 2 : name == "sum" ? 0 : 1, "attribute");
    std::vector<Value> items = as_list(v);
    auto key = [&](const Value& x) { return attr.kind == Value::Kind::String ? attr_path(x, attr.s, line) : x; };
    if (name == "sum") {
      Value total = args.get(1, "start", Value::integer(0));
      for (const Value& x : items) total = binary("+", total, key(x), line);
      return total;
    }
    if (name == "unique") {
      List out;
      for (const Value& x : items)
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(key(x), key(y)); })) out.push_back(x);
      return Value::of_list(std::move(out));
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return compare(key(x), key(y), line) < 0; });
    if (name == "sort") {
      if (truthy(args.get(0, "reverse"))) std::reverse(items.begin(), items.end());
      return Value::of_list(std::move(items));
    }
    if (items.empty()) return Value();
    return name == "min" ? items.front() : items.back();
  }
  fail(line, "the filter '" + name + "' is not supported");
}

bool call_method(const Value& obj, const std::string& name, Args& args, Value& result) {
  const int line = args.line;
  if (obj.kind == Value::Kind::String) {
    const std::string& s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      result = Value::string(strip(s, args.get(0, "chars"), name != "rstrip", name != "lstrip"));
    } else if (name == "split" || name == "rsplit") {
      result = Value::of_list(split(s, args.get(0, "sep"), integer_arg(args.get(1, "maxsplit"), -1, line, "maxsplit"), name == "rsplit", line));
    } else if (name == "splitlines") {
      List l;
      std::size_t at = 0;
      while (at < s.size()) {
        const std::size_t nl = std::min(s.find_first_of("\n\r", at), s.size());
        l.push_back(Value::string(s.substr(at, nl - at)));
        at = nl + (s.compare(nl, 2, "\r\n") == 0 ? 2 : 1);
      }
      result = Value::of_list(std::move(l));
    } else if (name == "startswith" || name == "endswith") {
      const Value p = args.get(0, "prefix");
      std::vector<Value> options = p.kind == Value::Kind::List ? *p.list : std::vector<Value>{p};
      bool hit = false;
      for (const Value& o : options) {
        const std::string& t = string_arg(o, line, name.c_str());
        hit = hit || (t.size() <= s.size() && (name == "startswith" ? s.compare(0, t.size(), t) == 0
                                                                     : s.compare(s.size() - t.size(), t.size(), t) == 0));
      }
      result = Value::boolean(hit);
    } else if (name == "upper" || name == "lower") {
      result = Value::string(mapped(s, name == "upper" ? upper : lower));
    } else if (name == "title") {
      result = Value::string(title(s));
    } else if (name == "capitalize") {
      result = Value::string(capitalize(s));
    } else if (name == "replace") {
      result = Value::string(replace(s, string_arg(args.get(0, "old"), line, "replace's old"),
                                     string_arg(args.get(1, "new"), line, "replace's new"),
                                     integer_arg(args.get(2, "count"), -1, line, "replace's count")));
    } else if (name == "find" || name == "count") {
      const std::string t = string_arg(args.get(0, "sub"), line, name.c_str());
      if (name == "find") {
        const std::size_t hit = s.find(t);
        result = Value::integer(hit == std::string::npos ? -1 : static_cast<std::int64_t>(code_points(s.substr(0, hit))));
      } else {
        std::int64_t n = 0;
        if (t.empty()) n = static_cast<std::int64_t>(code_points(s)) + 1;
        else
          for (std::size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) ++n;
        result = Value::integer(n);
      }
    } else if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& x : iterate(args.get(0, "iterable"), line)) {
        out += (first ? "" : s) + string_arg(x, line, "join's items");
        first = false;
      }
      result = Value::string(std::move(out));
    } else {
      return false;
    }
    return true;
  }
  if (obj.kind == Value::Kind::Dict) {
    if (name == "get") {
      const Value key = args.get(0, "key");
      const Value* v = key.kind == Value::Kind::String ? obj.dict->find(key.s) : nullptr;
      result = v != nullptr ? *v : args.get(1, "default", Value::none());
    } else if (name == "items" || name == "keys" || name == "values") {
      List l;
      for (const auto& [k, v] : obj.dict->items)
        l.push_back(name == "items" ? Value::of_tuple({Value::string(k), v}) : name == "keys" ? Value::string(k) : v);
      result = Value::of_list(std::move(l));
    } else {
      return false;
    }
    return true;
  }
  return false;
}

Value global_function(const std::string& name) {
  if (name == "range") {
    return Value::function([](Args& a) {
      std::int64_t start = 0, stop = 0, step = 1;
      const std::size_t n = a.positional.size();
      if (n == 0 || n > 3) fail(a.line, "range takes 1 to 3 integers");
      stop = integer_arg(a.positional[n == 1 ? 0 : 1], 0, a.line, "range's bound");
      if (n > 1) start = integer_arg(a.positional[0], 0, a.line, "range's start");
      if (n > 2) step = integer_arg(a.positional[2], 1, a.line, "range's step");
      if (step == 0) fail(a.line, "range's step is zero");
      List l;
      for (std::int64_t k = start; step > 0 ? k < stop : k > stop;) {
        if (l.size() >= 100000) fail(a.line, "a range longer than 100000 (Jinja's sandbox limit)");
        l.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, step, &k)) break;
      }
      return Value::of_list(std::move(l));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::function([ns](Args& a) {
      Dict d;
      for (const Value& p : a.positional) {
        if (p.kind != Value::Kind::Dict) fail(a.line, "namespace()/dict() take a dict or name=value arguments");
        for (const auto& [k, v] : p.dict->items) d.set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d.set(k, v);
      return Value::of_dict(std::move(d), ns ? Value::Kind::Namespace : Value::Kind::Dict);
    });
  }
  if (name == "raise_exception") {
    return Value::function([](Args& a) -> Value { fail(a.line, "the template raised an error: " + to_str(a.get(0, "message"))); });
  }
  if (name == "strftime_now") {
    return Value::function([](Args& a) {
      const std::string format = string_arg(a.get(0, "format"), a.line, "strftime_now's format");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const std::size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
      return Value::string(std::string(buf, n));
    });
  }
  return Value();
}

}  // namespace stratum::jinja
