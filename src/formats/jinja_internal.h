// The Jinja engine's values, syntax tree and built-ins, shared by jinja_parse.cpp (source -> tree),
// jinja_render.cpp (tree -> text) and jinja_builtins.cpp (filters, tests, methods, str/tojson).
// Not for use outside src/formats/jinja*.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/jinja.h"

namespace stratum::jinja {

struct Value;
using List = std::vector<Value>;
// A dict (or a namespace's attributes) in insertion order, as Python's; keys are strings.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};
struct Args;
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  bool safe = false;
  bool tuple = false;  // a List that is a Python tuple (a (a, b) literal, items(), dictsort): str() shows (a, b)  // a string marked |safe (Jinja's Markup): `+` HTML-escapes a plain string joined to it
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace (a namespace's attributes are set in place)
  std::shared_ptr<const Function> fn;

  static Value none() { return with(Kind::None); }
  static Value boolean(bool v) { Value x = with(Kind::Bool); x.b = v; return x; }
  static Value integer(std::int64_t v) { Value x = with(Kind::Int); x.i = v; return x; }
  static Value real(double v) { Value x = with(Kind::Float); x.f = v; return x; }
  static Value string(std::string v) { Value x = with(Kind::String); x.s = std::move(v); return x; }
  static Value of_list(List v) { Value x = with(Kind::List); x.list = std::make_shared<const List>(std::move(v)); return x; }
  static Value of_tuple(List v) { Value x = of_list(std::move(v)); x.tuple = true; return x; }
  static Value of_dict(Dict v, Kind kind = Kind::Dict) {
    Value x = with(kind);
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  static Value function(Function f) { Value x = with(Kind::Function); x.fn = std::make_shared<const Function>(std::move(f)); return x; }
  bool defined() const { return kind != Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }

 private:
  static Value with(Kind k) { Value x; x.kind = k; return x; }
};

// Arguments of a call, filter or test: positional, then keyword ones by name.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;
  // The i-th positional argument or the keyword `name`, else `fallback`; consumed names are not
  // checked (a call that passes an argument nobody reads is not an error here, as in Python's kwargs).
  Value get(std::size_t i, const char* name, Value fallback = Value()) const;
};

// A render-time error at `line` ("[template] <where> line N: what"): the renderer adds where.
struct RenderError {
  int line;
  std::string what;
};
[[noreturn]] void fail(int line, std::string what);

// Python semantics of the values.
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string type_name(const Value& v);
std::string to_str(const Value& v);                      // str(v); Undefined -> ""
std::string to_json(const Value& v, int indent, int line);  // json.dumps(v, ensure_ascii=False, indent)
std::size_t code_points(std::string_view s);
Value from_json(const nlohmann::ordered_json& j);

// Built-ins (jinja_builtins.cpp); each throws RenderError (via fail) at args.line.
Value apply_filter(const std::string& name, const Value& input, Args& args);
bool apply_test(const std::string& name, const Value& input, Args& args);  // false for an unknown name: checked at parse
bool filter_known(const std::string& name);
bool test_known(const std::string& name);
// A method call `obj.name(args)` on a string or dict; false when obj has no such method.
bool call_method(const Value& obj, const std::string& name, Args& args, Value& result);
Value global_function(const std::string& name);  // namespace, range, dict, raise_exception, strftime_now; else Undefined
Value item(const Value& obj, const Value& key, int line);     // obj[key], Jinja's getitem: missing -> Undefined
Value attribute(const Value& obj, const std::string& name, int line);  // obj.name: attribute, else item
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
std::vector<Value> iterate(const Value& v, int line);  // for-loop items: list, dict keys, string code points
Value binary(const std::string& op, const Value& a, const Value& b, int line);
bool contains(const Value& container, const Value& x, int line);
int compare(const Value& a, const Value& b, int line);  // <0, 0, >0 for numbers and strings

// The lexer's tokens (jinja_lex.cpp): text between tags (the whitespace controls, trim_blocks and
// lstrip_blocks applied), tag delimiters, and the expression tokens inside tags.
struct Token {
  enum class Kind { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Kind kind = Kind::Eof;
  std::string text;
  int line = 0;
  std::int64_t i = 0;  // Int
  double f = 0;        // Float
};

// Throws Error "[template] <where> line N: ..." for an unclosed tag, comment or string.
std::vector<Token> lex(std::string_view source, const std::string& where);

// The syntax tree.
struct Expr {
  enum class Op { Literal, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Not, Neg, Binary, And, Or, Cond };
  Op op = Op::Literal;
  int line = 0;
  std::string name;  // Name, Attr, Filter and Test names; Binary's operator; Test: "!" first when negated
  Value literal;
  std::vector<std::unique_ptr<Expr>> kids;  // operands (a null kid: an absent slice bound / else)
  std::vector<std::string> keywords;        // Call/Filter/Test: names of the last keywords.size() kids
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Generation };
  Kind kind = Kind::Text;
  int line = 0;
  std::string text;                  // Text; Set's namespace attribute ("" for names)
  ExprPtr expr;                      // Output; Set's value; For's iterable
  ExprPtr filter;                    // For's `if`
  std::vector<std::string> names;    // For's and Set's targets; Macro: its name then its parameters
  std::vector<ExprPtr> defaults;     // Macro: each parameter's default (null: none)
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // If: (condition, null for else; body)
  std::vector<Node> body, else_body;  // For, SetBlock, Macro, Generation
};

}  // namespace stratum::jinja

struct stratum::JinjaTemplate::Impl {
  std::string where;
  std::vector<jinja::Node> nodes;
  bool generation = false;
};
