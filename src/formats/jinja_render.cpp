// Jinja syntax tree -> text (Note [jinja subset] in jinja.h). Scopes as Jinja2's: the template's
// top level and its if blocks share one scope; each for-loop iteration and each macro call has its
// own, so a `set` inside a loop is gone after it (what namespace() is for).
#include "formats/jinja_internal.h"
#include "stratum/error.h"

namespace stratum {
namespace jinja {
namespace {

constexpr int kMaxCallDepth = 8;  // recursive macros (a tool schema's nesting) stay below

class Renderer {
 public:
  explicit Renderer(const JinjaTemplate::Impl& t) : t_(t) {}

  JinjaTemplate::Rendered run(const nlohmann::ordered_json& context) {
    frames_.emplace_back();
    if (context.is_object())
      for (const auto& [k, v] : context.items()) frames_[0].emplace_back(k, from_json(v));
    JinjaTemplate::Rendered r;
    out_ = &r.text;
    root_out_ = &r.text;
    generation_ = &r.generation;
    exec(t_.nodes);
    return r;
  }

 private:
  using Frame = std::vector<std::pair<std::string, Value>>;
  enum class Flow { Next, Break, Continue };

  Value lookup(const std::string& name) const {
    auto find = [&](const Frame& f) -> const Value* {
      for (auto it = f.rbegin(); it != f.rend(); ++it)
        if (it->first == name) return &it->second;
      return nullptr;
    };
    for (std::size_t k = frames_.size(); k-- > floor_;)
      if (const Value* v = find(frames_[k])) return *v;
    if (const Value* v = find(frames_[0])) return *v;
    return global_function(name);
  }
  void assign(const std::string& name, Value v) {
    Frame& f = frames_.back();
    for (auto& [k, old] : f)
      if (k == name) {
        old = std::move(v);
        return;
      }
    f.emplace_back(name, std::move(v));
  }
  void assign_targets(const std::vector<std::string>& names, const Value& v, int line) {
    if (names.size() == 1) {
      assign(names[0], v);
      return;
    }
    const std::vector<Value> parts = iterate(v, line);
    if (parts.size() != names.size())
      fail(line, "cannot unpack " + std::to_string(parts.size()) + " value(s) into " + std::to_string(names.size()) + " names");
    for (std::size_t k = 0; k < names.size(); ++k) assign(names[k], parts[k]);
  }

  Flow exec(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) {
      const Flow f = exec(n);
      if (f != Flow::Next) return f;
    }
    return Flow::Next;
  }

  Flow exec(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Text: *out_ += n.text; break;
      case Node::Kind::Output: *out_ += to_str(eval(*n.expr)); break;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (cond == nullptr || truthy(eval(*cond))) return exec(body);
        break;
      case Node::Kind::For: return exec_for(n);
      case Node::Kind::Set: {
        Value v = eval(*n.expr);
        if (!n.text.empty()) {
          const Value ns = lookup(n.names[0]);
          if (ns.kind != Value::Kind::Namespace)
            fail(n.line, "set " + n.names[0] + "." + n.text + ": '" + n.names[0] + "' is " + type_name(ns) + ", not a namespace()");
          ns.dict->set(n.text, std::move(v));
        } else {
          assign_targets(n.names, v, n.line);
        }
        break;
      }
      case Node::Kind::SetBlock: assign(n.names[0], Value::string(capture(n.body))); break;
      case Node::Kind::Macro: assign(n.names[0], macro(n)); break;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Generation: {
        if (out_ != root_out_) fail(n.line, "{% generation %} inside a macro or a block set is not supported");
        const std::size_t begin = out_->size();
        const Flow f = exec(n.body);
        generation_->emplace_back(begin, out_->size());
        return f;
      }
    }
    return Flow::Next;
  }

  std::string capture(const std::vector<Node>& body) {
    std::string text;
    std::string* saved = out_;
    out_ = &text;
    exec(body);
    out_ = saved;
    return text;
  }

  Flow exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.expr), n.line);
    if (n.filter != nullptr) {
      std::vector<Value> kept;
      for (const Value& x : items) {
        frames_.emplace_back();
        assign_targets(n.names, x, n.line);
        const bool keep = truthy(eval(*n.filter));
        frames_.pop_back();
        if (keep) kept.push_back(x);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body);
    const auto count = static_cast<std::int64_t>(items.size());
    for (std::int64_t k = 0; k < count; ++k) {
      Dict loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(count - k));
      loop.set("revindex0", Value::integer(count - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == count - 1));
      loop.set("length", Value::integer(count));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      if (k > 0) loop.set("previtem", items[static_cast<std::size_t>(k - 1)]);
      if (k + 1 < count) loop.set("nextitem", items[static_cast<std::size_t>(k + 1)]);
      loop.set("cycle", Value::function([k](Args& a) {
                 if (a.positional.empty()) fail(a.line, "loop.cycle needs at least one value");
                 return a.positional[static_cast<std::size_t>(k) % a.positional.size()];
               }));
      frames_.emplace_back();
      assign_targets(n.names, items[static_cast<std::size_t>(k)], n.line);
      assign("loop", Value::of_dict(std::move(loop)));
      const Flow f = exec(n.body);
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Next;
  }

  Value macro(const Node& n) {
    return Value::function([this, &n](Args& a) {
      if (depth_ >= kMaxCallDepth) fail(a.line, "macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      const std::size_t params = n.names.size() - 1;
      if (a.positional.size() > params)
        fail(a.line, "the macro '" + n.names[0] + "' takes " + std::to_string(params) + " argument(s), given " +
                         std::to_string(a.positional.size()));
      const std::size_t saved_floor = floor_;
      frames_.emplace_back();
      floor_ = frames_.size() - 1;  // a macro sees its arguments and the top level, not its caller's loops
      ++depth_;
      for (std::size_t k = 0; k < params; ++k) {
        Value v = a.get(k, n.names[k + 1].c_str());
        if (!v.defined() && n.defaults[k] != nullptr) v = eval(*n.defaults[k]);
        assign(n.names[k + 1], v);
      }
      Value result = Value::string(capture(n.body));
      --depth_;
      frames_.pop_back();
      floor_ = saved_floor;
      return result;
    });
  }

  Args arguments(const Expr& e, std::size_t first) {
    Args a;
    a.line = e.line;
    const std::size_t keyword_from = e.kids.size() - e.keywords.size();
    for (std::size_t k = first; k < e.kids.size(); ++k) {
      Value v = eval(*e.kids[k]);
      if (k < keyword_from) a.positional.push_back(std::move(v));
      else a.keyword.emplace_back(e.keywords[k - keyword_from], std::move(v));
    }
    return a;
  }

  // One expression's value. The operations with many locals are functions of their own, so that
  // eval's frame (one per nesting level) stays small: a recursive macro or a deep expression
  // recurses through it (the fuzz target's stack is 128 KiB under ASan).
  Value eval(const Expr& e) {
    switch (e.op) {
      case Expr::Op::Literal: return e.literal;
      case Expr::Op::Name: return lookup(e.name);
      case Expr::Op::List: case Expr::Op::Tuple: case Expr::Op::Dict: return eval_container(e);
      case Expr::Op::Attr: return attribute(eval(*e.kids[0]), e.name, e.line);
      case Expr::Op::Item: return item(eval(*e.kids[0]), eval(*e.kids[1]), e.line);
      case Expr::Op::Slice: return eval_slice(e);
      case Expr::Op::Call: return eval_call(e);
      case Expr::Op::Filter: case Expr::Op::Test: return eval_filter(e);
      case Expr::Op::Not: return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::Op::Neg: return negate(eval(*e.kids[0]), e.line);
      case Expr::Op::Binary: return binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]), e.line);
      case Expr::Op::And: case Expr::Op::Or: {
        Value a = eval(*e.kids[0]);
        return truthy(a) == (e.op == Expr::Op::And) ? eval(*e.kids[1]) : a;
      }
      case Expr::Op::Cond:
        if (truthy(eval(*e.kids[1]))) return eval(*e.kids[0]);
        return e.kids[2] != nullptr ? eval(*e.kids[2]) : Value();
    }
    return Value();
  }

  [[gnu::noinline]] Value eval_container(const Expr& e) {
    if (e.op != Expr::Op::Dict) {
      List l;
      for (const auto& k : e.kids) l.push_back(eval(*k));
      return e.op == Expr::Op::Tuple ? Value::of_tuple(std::move(l)) : Value::of_list(std::move(l));
    }
    Dict d;
    for (std::size_t k = 0; k + 1 < e.kids.size(); k += 2) {
      const Value key = eval(*e.kids[k]);
      if (key.kind != Value::Kind::String) fail(e.line, "a dict literal's keys must be strings, not " + type_name(key));
      d.set(key.s, eval(*e.kids[k + 1]));
    }
    return Value::of_dict(std::move(d));
  }

  [[gnu::noinline]] Value eval_slice(const Expr& e) {
    auto bound = [&](std::size_t k) { return e.kids[k] != nullptr ? eval(*e.kids[k]) : Value::none(); };
    return slice(eval(*e.kids[0]), bound(1), bound(2), bound(3), e.line);
  }

  [[gnu::noinline]] Value eval_call(const Expr& e) {
    const Expr& callee = *e.kids[0];
    if (callee.op == Expr::Op::Attr) {  // obj.method(args)
      const Value obj = eval(*callee.kids[0]);
      Args a = arguments(e, 1);
      Value result;
      if (call_method(obj, callee.name, a, result)) return result;
      const Value f = attribute(obj, callee.name, e.line);
      if (f.kind != Value::Kind::Function) fail(e.line, "'" + type_name(obj) + "' object has no method '" + callee.name + "'");
      return (*f.fn)(a);
    }
    const Value f = eval(callee);
    if (f.kind != Value::Kind::Function)
      fail(e.line, callee.op == Expr::Op::Name && !f.defined() ? "'" + callee.name + "' is undefined"
                                                                : "'" + type_name(f) + "' object is not callable");
    Args a = arguments(e, 1);
    return (*f.fn)(a);
  }

  [[gnu::noinline]] Value eval_filter(const Expr& e) {
    const Value input = eval(*e.kids[0]);
    Args a = arguments(e, 1);
    if (e.op == Expr::Op::Test) {
      const bool negated = e.name[0] == '!';
      return Value::boolean(apply_test(negated ? e.name.substr(1) : e.name, input, a) != negated);
    }
    return apply_filter(e.name, input, a);
  }

  static Value negate(const Value& v, int line) {
    if (v.kind == Value::Kind::Int && v.i == INT64_MIN) fail(line, "the negation of the smallest 64-bit integer");
    if (v.kind == Value::Kind::Int) return Value::integer(-v.i);
    if (v.kind == Value::Kind::Float) return Value::real(-v.f);
    if (v.kind == Value::Kind::Bool) return Value::integer(v.b ? -1 : 0);
    fail(line, "unary '-' of " + type_name(v));
  }

  const JinjaTemplate::Impl& t_;
  std::vector<Frame> frames_;
  std::size_t floor_ = 1;
  int depth_ = 0;
  std::string* out_ = nullptr;
  std::string* root_out_ = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>>* generation_ = nullptr;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::Rendered JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  STRATUM_ASSERT(impl_ != nullptr);
  try {
    jinja::Renderer r(*impl_);
    return r.run(context);
  } catch (const jinja::RenderError& e) {
    if (e.line > 0) STRATUM_FAIL("[template] ", impl_->where, " line ", e.line, ": ", e.what);
    STRATUM_FAIL("[template] ", impl_->where, ": ", e.what);
  }
}

}  // namespace stratum
