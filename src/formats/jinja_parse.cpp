// Jinja tokens -> syntax tree (Note [jinja subset] in jinja.h; the tokens from jinja_lex.cpp): a
// recursive-descent parser with Jinja2's precedence (or < and < not < comparisons < + - < ~ <
// * / // % < ** < unary; filters and tests bind to their operand, postfix . [] () first).
#include <set>

#include "formats/jinja_internal.h"
#include "stratum/error.h"

namespace stratum {
namespace jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& where) : t_(std::move(tokens)), where_(where) {}

  std::vector<Node> document(bool& generation) {
    std::string end;
    std::vector<Node> nodes = body({}, end);
    generation = generation_;
    return nodes;
  }

 private:
  using Kind = Token::Kind;
  const Token& peek(std::size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool is_op(const char* op, std::size_t k = 0) const { return peek(k).kind == Kind::Op && peek(k).text == op; }
  bool is_name(const char* name, std::size_t k = 0) const { return peek(k).kind == Kind::Name && peek(k).text == name; }
  [[noreturn]] void error(int line, const std::string& what) const {
    STRATUM_FAIL("[template] ", where_, " line ", line, ": ", what);
  }
  std::string describe(const Token& tok) const {
    switch (tok.kind) {
      case Kind::Eof: return "the end of the template";
      case Kind::VarEnd: return "'}}'";
      case Kind::BlockEnd: return "'%}'";
      case Kind::String: return "a string";
      case Kind::Data: return "text";
      default: return "'" + tok.text + "'";
    }
  }
  // Guards the recursion of nested expressions and statements (a hostile template cannot overflow
  // the stack): each parsing function counts one level, a parenthesis some thirteen; the real chat
  // templates tried need 49 to 64 (docs/formats.md).
  static constexpr int kMaxDepth = 128;
  struct Nest {
    explicit Nest(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.error(p.peek().line, "expressions or blocks nested too deeply (a parse depth of " + std::to_string(kMaxDepth) + ")");
    }
    ~Nest() { --p.depth_; }
    Parser& p;
  };

  void expect_op(const char* op) {
    if (!is_op(op)) error(peek().line, std::string("expected '") + op + "', found " + describe(peek()));
    ++p_;
  }
  void expect_name(const char* name) {
    if (!is_name(name)) error(peek().line, std::string("expected '") + name + "', found " + describe(peek()));
    ++p_;
  }
  std::string name_token() {
    if (peek().kind != Kind::Name) error(peek().line, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void block_end() {
    if (peek().kind != Kind::BlockEnd) error(peek().line, "expected '%}', found " + describe(peek()));
    ++p_;
  }

  // Nodes up to a {% NAME %} with NAME in `ends` (its name consumed, stored in `found`).
  std::vector<Node> body(const std::set<std::string>& ends, std::string& found) {
    const Nest nest(*this);
    std::vector<Node> nodes;
    for (;;) {
      const Token& tok = peek();
      if (tok.kind == Kind::Eof) {
        if (!ends.empty()) error(tok.line, "the template ends before {% " + *ends.rbegin() + " %}");
        return nodes;
      }
      if (tok.kind == Kind::Data) {
        Node n;
        n.kind = Node::Kind::Text;
        n.line = tok.line;
        n.text = next().text;
        nodes.push_back(std::move(n));
      } else if (tok.kind == Kind::VarBegin) {
        ++p_;
        Node n;
        n.kind = Node::Kind::Output;
        n.line = tok.line;
        n.expr = tuple_expr();
        if (peek().kind != Kind::VarEnd) error(peek().line, "expected '}}', found " + describe(peek()));
        ++p_;
        nodes.push_back(std::move(n));
      } else if (tok.kind == Kind::BlockBegin) {
        ++p_;
        const int line = peek().line;
        const std::string name = name_token();
        if (ends.count(name)) {
          found = name;
          return nodes;
        }
        nodes.push_back(statement(name, line));
      } else {
        error(tok.line, "unexpected " + describe(tok));
      }
    }
  }

  Node statement(const std::string& name, int line) {
    const Nest nest(*this);
    Node n;
    n.line = line;
    std::string end;
    if (name == "if") {
      n.kind = Node::Kind::If;
      ExprPtr cond = expr();
      for (;;) {
        block_end();
        std::vector<Node> b = body({"elif", "else", "endif"}, end);
        n.branches.emplace_back(std::move(cond), std::move(b));
        if (end == "endif") break;
        if (end == "else") {
          block_end();
          n.branches.emplace_back(nullptr, body({"endif"}, end));
          break;
        }
        cond = expr();
      }
      block_end();
    } else if (name == "for") {
      n.kind = Node::Kind::For;
      n.names.push_back(name_token());
      while (is_op(",")) {
        ++p_;
        n.names.push_back(name_token());
      }
      expect_name("in");
      n.expr = or_expr();  // `for x in xs if cond`: the `if` filters, it is no conditional expression
      if (is_name("if")) {
        ++p_;
        n.filter = expr();
      }
      if (is_name("recursive")) error(peek().line, "recursive for loops are not supported");
      block_end();
      ++loops_;
      n.body = body({"else", "endfor"}, end);
      --loops_;
      if (end == "else") {
        block_end();
        n.else_body = body({"endfor"}, end);
      }
      block_end();
    } else if (name == "set") {
      n.names.push_back(name_token());
      if (is_op(".")) {
        ++p_;
        n.text = name_token();
      }
      while (n.text.empty() && is_op(",")) {
        ++p_;
        n.names.push_back(name_token());
      }
      if (is_op("=")) {
        ++p_;
        n.kind = Node::Kind::Set;
        n.expr = tuple_expr();
        block_end();
      } else {
        if (n.names.size() > 1 || !n.text.empty()) error(line, "a block {% set %} takes one name");
        n.kind = Node::Kind::SetBlock;
        block_end();
        n.body = body({"endset"}, end);
        block_end();
      }
    } else if (name == "macro") {
      n.kind = Node::Kind::Macro;
      n.names.push_back(name_token());
      expect_op("(");
      while (!is_op(")")) {
        n.names.push_back(name_token());
        ExprPtr d;
        if (is_op("=")) {
          ++p_;
          d = expr();
        }
        n.defaults.push_back(std::move(d));
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      block_end();
      const int saved = loops_;
      loops_ = 0;
      n.body = body({"endmacro"}, end);
      loops_ = saved;
      if (peek().kind == Kind::Name) ++p_;  // {% endmacro name %}
      block_end();
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) error(line, "{% " + name + " %} outside a for loop");
      n.kind = name == "break" ? Node::Kind::Break : Node::Kind::Continue;
      block_end();
    } else if (name == "generation") {
      if (in_generation_) error(line, "a {% generation %} block inside another");
      n.kind = Node::Kind::Generation;
      generation_ = in_generation_ = true;
      block_end();
      n.body = body({"endgeneration"}, end);
      in_generation_ = false;
      block_end();
    } else {
      error(line, "the statement {% " + name + " %} is not supported (Note [jinja subset] in src/formats/jinja.h)");
    }
    return n;
  }

  static ExprPtr make(Expr::Op op, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->line = line;
    e->name = std::move(name);
    return e;
  }

  // An expression, or a tuple of them ("a, b") where a statement allows one.
  ExprPtr tuple_expr() {
    ExprPtr first = expr();
    if (!is_op(",")) return first;
    ExprPtr tuple = make(Expr::Op::Tuple, first->line);
    tuple->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++p_;
      if (peek().kind == Kind::BlockEnd || peek().kind == Kind::VarEnd) break;
      tuple->kids.push_back(expr());
    }
    return tuple;
  }

  ExprPtr expr() {
    const Nest nest(*this);
    ExprPtr e = or_expr();
    while (is_name("if")) {
      const int line = next().line;
      ExprPtr c = make(Expr::Op::Cond, line);
      ExprPtr cond = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++p_;
        otherwise = expr();
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }
  ExprPtr or_expr() {
    const Nest nest(*this);
    ExprPtr e = and_expr();
    while (is_name("or")) {
      ExprPtr o = make(Expr::Op::Or, next().line);
      o->kids.push_back(std::move(e));
      o->kids.push_back(and_expr());
      e = std::move(o);
    }
    return e;
  }
  ExprPtr and_expr() {
    const Nest nest(*this);
    ExprPtr e = not_expr();
    while (is_name("and")) {
      ExprPtr a = make(Expr::Op::And, next().line);
      a->kids.push_back(std::move(e));
      a->kids.push_back(not_expr());
      e = std::move(a);
    }
    return e;
  }
  ExprPtr not_expr() {
    const Nest nest(*this);
    if (is_name("not")) {
      ExprPtr n = make(Expr::Op::Not, next().line);
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = make(Expr::Op::Binary, line, std::move(op));
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }
  ExprPtr compare() {
    const Nest nest(*this);
    ExprPtr e = math1();
    for (;;) {
      const int line = peek().line;
      std::string op;
      if (peek().kind == Kind::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = binary(op, std::move(e), math1(), line);
    }
  }
  ExprPtr math1() {
    const Nest nest(*this);
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), concat(), op.line);
    }
    return e;
  }
  ExprPtr concat() {
    const Nest nest(*this);
    ExprPtr e = math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary("~", std::move(e), math2(), line);
    }
    return e;
  }
  ExprPtr math2() {
    const Nest nest(*this);
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), power(), op.line);
    }
    return e;
  }
  ExprPtr power() {
    const Nest nest(*this);
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary("**", std::move(e), unary(true), line);
    }
    return e;
  }
  ExprPtr unary(bool with_filters) {
    const Nest nest(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      ExprPtr inner = unary(false);
      if (op.text == "-") {
        e = make(Expr::Op::Neg, op.line);
        e->kids.push_back(std::move(inner));
      } else {
        e = std::move(inner);
      }
    } else {
      e = postfix(primary());
    }
    return with_filters ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Nest nest(*this);
    const Token& tok = peek();
    switch (tok.kind) {
      case Kind::Name: {
        ++p_;
        const std::string& n = tok.text;
        ExprPtr lit = make(Expr::Op::Literal, tok.line);
        if (n == "true" || n == "True") lit->literal = Value::boolean(true);
        else if (n == "false" || n == "False") lit->literal = Value::boolean(false);
        else if (n == "none" || n == "None") lit->literal = Value::none();
        else return make(Expr::Op::Name, tok.line, n);
        return lit;
      }
      case Kind::String: {
        std::string s;
        while (peek().kind == Kind::String) s += next().text;  // "a" "b" is "ab"
        ExprPtr lit = make(Expr::Op::Literal, tok.line);
        lit->literal = Value::string(std::move(s));
        return lit;
      }
      case Kind::Int: case Kind::Float: {
        ++p_;
        ExprPtr lit = make(Expr::Op::Literal, tok.line);
        lit->literal = tok.kind == Kind::Int ? Value::integer(tok.i) : Value::real(tok.f);
        return lit;
      }
      case Kind::Op:
        if (tok.text == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            return make(Expr::Op::Tuple, tok.line);
          }
          ExprPtr e = expr();
          if (is_op(",")) {
            ExprPtr tuple = make(Expr::Op::Tuple, tok.line);
            tuple->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              tuple->kids.push_back(expr());
            }
            e = std::move(tuple);
          }
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          ++p_;
          ExprPtr list = make(Expr::Op::List, tok.line);
          while (!is_op("]")) {
            list->kids.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return list;
        }
        if (tok.text == "{") {
          ++p_;
          ExprPtr dict = make(Expr::Op::Dict, tok.line);
          while (!is_op("}")) {
            dict->kids.push_back(expr());
            expect_op(":");
            dict->kids.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return dict;
        }
        break;
      default: break;
    }
    error(tok.line, "expected a value, found " + describe(tok));
  }

  // (args): positional, then name=value ones.
  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Kind::Name && is_op("=", 1)) {
        e.keywords.push_back(next().text);
        ++p_;
        e.kids.push_back(expr());
      } else {
        if (!e.keywords.empty()) error(peek().line, "a positional argument after a keyword argument");
        e.kids.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }

  ExprPtr postfix(ExprPtr e) {
    const Nest nest(*this);
    for (;;) {
      const int line = peek().line;
      if (is_op(".")) {
        ++p_;
        if (peek().kind == Kind::Int) {  // foo.0 is foo[0]
          ExprPtr it = make(Expr::Op::Item, line);
          ExprPtr key = make(Expr::Op::Literal, line);
          key->literal = Value::integer(next().i);
          it->kids.push_back(std::move(e));
          it->kids.push_back(std::move(key));
          e = std::move(it);
          continue;
        }
        ExprPtr a = make(Expr::Op::Attr, line, name_token());
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++p_;
        ExprPtr start;
        if (!is_op(":")) start = expr();
        if (is_op(":")) {
          ++p_;
          ExprPtr s = make(Expr::Op::Slice, line);
          s->kids.push_back(std::move(e));
          s->kids.push_back(std::move(start));
          s->kids.push_back(is_op("]") || is_op(":") ? nullptr : expr());
          ExprPtr step;
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) step = expr();
          }
          s->kids.push_back(std::move(step));
          e = std::move(s);
        } else {
          ExprPtr it = make(Expr::Op::Item, line);
          it->kids.push_back(std::move(e));
          it->kids.push_back(std::move(start));
          e = std::move(it);
        }
        expect_op("]");
      } else if (is_op("(")) {
        ExprPtr c = make(Expr::Op::Call, line);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr filters(ExprPtr e) {
    const Nest nest(*this);
    for (;;) {
      if (is_op("|")) {
        const int line = next().line;
        const std::string name = name_token();
        if (!filter_known(name)) error(line, "the filter '" + name + "' is not supported (Note [jinja subset] in src/formats/jinja.h)");
        ExprPtr f = make(Expr::Op::Filter, line, name);
        f->kids.push_back(std::move(e));
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        bool negated = false;
        if (is_name("not")) {
          ++p_;
          negated = true;
        }
        std::string name = name_token();
        if (name == "True" || name == "False" || name == "None") name[0] = static_cast<char>(name[0] - 'A' + 'a');
        if (!test_known(name)) error(line, "the test '" + name + "' is not supported (Note [jinja subset] in src/formats/jinja.h)");
        ExprPtr t = make(Expr::Op::Test, line, (negated ? "!" : "") + name);
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          call_args(*t);
        } else if (peek().kind == Kind::String || peek().kind == Kind::Int || peek().kind == Kind::Float ||
                   (peek().kind == Kind::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("not") && !is_name("in") && !is_name("is"))) {
          t->kids.push_back(postfix(primary()));  // `is divisibleby 3`, `is equalto 'user'`
        }
        e = std::move(t);
      } else if (is_op("(") && e->op == Expr::Op::Filter) {
        ExprPtr c = make(Expr::Op::Call, peek().line);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  const std::string& where_;
  std::size_t p_ = 0;
  int loops_ = 0;
  int depth_ = 0;
  bool generation_ = false, in_generation_ = false;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate() = default;
JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

JinjaTemplate JinjaTemplate::parse(std::string_view source, const std::string& where) {
  auto impl = std::make_shared<Impl>();
  impl->where = where;
  jinja::Parser parser(jinja::lex(source, where), where);
  impl->nodes = parser.document(impl->generation);
  JinjaTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

bool JinjaTemplate::has_generation() const { return impl_ && impl_->generation; }

}  // namespace stratum
