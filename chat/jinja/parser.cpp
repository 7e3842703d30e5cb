#include "chat/jinja/parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <set>

namespace tandem::jinja {

namespace {

// ---- Template text into text / {{ expression }} / {% statement %} segments ----

struct Segment {
  enum class Kind { Text, Expr, Stmt } kind;
  std::string code;
  int line;
};

// Line numbers of positions asked for in increasing order, counted once through the text.
class LineCounter {
 public:
  explicit LineCounter(std::string_view src) : src_(src) {}
  int at(size_t pos) {
    pos = std::min(pos, src_.size());
    if (pos < counted_) counted_ = 0, line_ = 1;  // never happens in order; stays correct anyway
    for (; counted_ < pos; counted_++) line_ += src_[counted_] == '\n';
    return line_;
  }

 private:
  std::string_view src_;
  size_t counted_ = 0;
  int line_ = 1;
};

[[noreturn]] void fail(int line, const std::string& what) { throw Error("line " + std::to_string(line) + ": " + what); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The end of a tag: the position of its closing "}}" / "%}" / "#}", skipping string literals.
size_t find_close(std::string_view src, size_t from, char type) {
  const char first = type == '{' ? '}' : type;
  char quote = 0;
  for (size_t k = from; k + 1 < src.size(); k++) {
    const char c = src[k];
    if (quote) {
      if (c == '\\') k++;
      else if (c == quote) quote = 0;
    } else if (type != '#' && (c == '\'' || c == '"')) {
      quote = c;
    } else if (c == first && src[k + 1] == '}') {
      return k;
    }
  }
  return std::string_view::npos;
}

std::vector<Segment> segment(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(src.size() >= 2 && src[src.size() - 2] == '\r' ? 2 : 1);
  std::vector<Segment> out;
  LineCounter lines(src);
  size_t pos = 0;
  bool strip_all = false, strip_newline = false;  // what the previous tag asks of the next text
  while (true) {
    const int text_line = lines.at(pos);
    size_t open = pos;
    while ((open = src.find('{', open)) != std::string_view::npos) {
      if (open + 1 < src.size() && (src[open + 1] == '{' || src[open + 1] == '%' || src[open + 1] == '#')) break;
      open++;
    }
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (strip_all) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) k++;
      text.erase(0, k);
    } else if (strip_newline) {
      if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
      else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Segment::Kind::Text, text, text_line});
      break;
    }
    const char type = src[open + 1];
    size_t inner = open + 2;
    const char mod = inner < src.size() ? src[inner] : 0;
    if (mod == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (type != '{' && mod != '+') {
      // lstrip_blocks: a block tag alone after indentation takes that indentation with it.
      size_t k = open;
      while (k > 0 && (src[k - 1] == ' ' || src[k - 1] == '\t')) k--;
      if (k == 0 || src[k - 1] == '\n') {
        const size_t n = std::min(open - k, text.size());
        text.erase(text.size() - n);
      }
    }
    if (mod == '-' || mod == '+') inner++;
    const int line = lines.at(open);
    if (!text.empty()) out.push_back({Segment::Kind::Text, text, text_line});
    const size_t close = find_close(src, inner, type);
    if (close == std::string_view::npos) fail(line, "unclosed tag");
    const bool strip_after = close > inner && src[close - 1] == '-';
    std::string code(src.substr(inner, close - inner - (strip_after ? 1 : 0)));
    pos = close + 2;
    strip_all = strip_after;
    strip_newline = !strip_after && type != '{';
    if (type == '#') continue;
    if (type == '{') {
      out.push_back({Segment::Kind::Expr, code, line});
      continue;
    }
    // {% raw %} ... {% endraw %}: the text between is literal.
    size_t a = 0, b = code.size();
    while (a < b && is_space(code[a])) a++;
    while (b > a && is_space(code[b - 1])) b--;
    if (code.substr(a, b - a) == "raw") {
      const size_t end = src.find("endraw", pos);
      const size_t tag = end == std::string_view::npos ? end : src.rfind("{%", end);
      if (tag == std::string_view::npos || tag < pos) fail(line, "raw without endraw");
      std::string raw(src.substr(pos, tag - pos));
      if (src[tag + 2] == '-')
        while (!raw.empty() && is_space(raw.back())) raw.pop_back();
      if (!raw.empty()) out.push_back({Segment::Kind::Text, raw, line});
      const size_t c2 = find_close(src, end, '%');
      if (c2 == std::string_view::npos) fail(line, "unclosed endraw");
      strip_all = src[c2 - 1] == '-';
      strip_newline = !strip_all;
      pos = c2 + 2;
      continue;
    }
    out.push_back({Segment::Kind::Stmt, code, line});
  }
  return out;
}

// ---- Expression tokens ----

struct Tok {
  enum class Kind { Name, Number, String, Op, End } kind;
  std::string text;
  Value value;
};

std::vector<Tok> lex(const std::string& code, int line) {
  std::vector<Tok> toks;
  size_t k = 0;
  while (k < code.size()) {
    const char c = code[k];
    if (is_space(c)) {
      k++;
    } else if (std::isalpha((unsigned char)c) || c == '_') {
      size_t e = k;
      while (e < code.size() && (std::isalnum((unsigned char)code[e]) || code[e] == '_')) e++;
      toks.push_back({Tok::Kind::Name, code.substr(k, e - k), {}});
      k = e;
    } else if (std::isdigit((unsigned char)c)) {
      size_t e = k;
      bool is_float = false;
      while (e < code.size() && (std::isdigit((unsigned char)code[e]) || code[e] == '_')) e++;
      if (e + 1 < code.size() && code[e] == '.' && std::isdigit((unsigned char)code[e + 1])) {
        is_float = true;
        e++;
        while (e < code.size() && std::isdigit((unsigned char)code[e])) e++;
      }
      std::string digits;
      for (size_t j = k; j < e; j++)
        if (code[j] != '_') digits += code[j];
      // Integers past int64 (Python has big ints) become floats rather than failing.
      int64_t as_int = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), as_int);
      const bool fits = !is_float && ec == std::errc() && end == digits.data() + digits.size();
      toks.push_back({Tok::Kind::Number, digits, fits ? Value(as_int) : Value(std::strtod(digits.c_str(), nullptr))});
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t e = k + 1;
      for (; e < code.size() && code[e] != c; e++) {
        if (code[e] == '\\' && e + 1 < code.size()) {
          const char n = code[++e];
          switch (n) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            default: s += '\\', s += n;
          }
        } else {
          s += code[e];
        }
      }
      if (e >= code.size()) fail(line, "unterminated string");
      toks.push_back({Tok::Kind::String, s, Value(s)});
      k = e + 1;
    } else {
      static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
      std::string op(1, c);
      for (const char* t : two)
        if (code.compare(k, 2, t) == 0) op = t;
      if (op.size() == 1 && std::string("+-*/%~<>=()[]{},.:|").find(c) == std::string::npos)
        fail(line, std::string("unexpected character '") + c + "'");
      toks.push_back({Tok::Kind::Op, op, {}});
      k += op.size();
    }
  }
  toks.push_back({Tok::Kind::End, "", {}});
  return toks;
}

// ---- Expressions, by Jinja's precedence ----

[[noreturn]] void too_deep(int line, int max_nesting) {
  fail(line, "template nesting deeper than " + std::to_string(max_nesting) + " (max_nesting)");
}

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line, int max_nesting) : t_(std::move(toks)), line_(line), max_(max_nesting) {}

  bool at_end() const { return t_[p_].kind == Tok::Kind::End; }
  bool peek_name(const char* n, size_t ahead = 0) const {
    const Tok& t = t_[std::min(p_ + ahead, t_.size() - 1)];
    return t.kind == Tok::Kind::Name && t.text == n;
  }
  bool peek_op(const char* o) const { return t_[p_].kind == Tok::Kind::Op && t_[p_].text == o; }
  bool accept_name(const char* n) { return peek_name(n) ? (p_++, true) : false; }
  bool accept_op(const char* o) { return peek_op(o) ? (p_++, true) : false; }
  void expect_op(const char* o) {
    if (!accept_op(o)) fail(line_, std::string("expected '") + o + "' but found '" + t_[p_].text + "'");
  }
  std::string expect_name() {
    if (t_[p_].kind != Tok::Kind::Name) fail(line_, "expected a name but found '" + t_[p_].text + "'");
    return t_[p_++].text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected '" + t_[p_].text + "'");
  }

  ExprPtr expression(bool ternary = true) {
    const Deeper deeper(*this);
    ExprPtr e = or_expr();
    while (ternary && peek_name("if")) {
      p_++;
      auto t = make(Expr::Kind::Ternary);
      t->a = std::move(e);
      t->b = or_expr();
      if (accept_name("else")) t->c = expression();
      e = done(std::move(t));
    }
    return e;
  }

  // `a, b` without brackets (set and for targets' values) becomes a list.
  ExprPtr tuple_or_expression(bool ternary = true) {
    ExprPtr first = expression(ternary);
    if (!peek_op(",")) return first;
    auto list = make(Expr::Kind::List);
    list->items.push_back(std::move(first));
    while (accept_op(",") && !at_end()) list->items.push_back(expression(ternary));
    return done(std::move(list));
  }

 private:
  // One level of parser recursion (brackets, `not`, signs, conditional chains).
  struct Deeper {
    ExprParser& p;
    explicit Deeper(ExprParser& parser) : p(parser) {
      if (++p.depth_ > p.max_) too_deep(p.line_, p.max_);
    }
    ~Deeper() { --p.depth_; }
  };

  // A finished node: its depth from its children's. Operator chains (a+b+c..., a.b.c...) are
  // parsed by loops, not recursion, yet make trees as deep as they are long, which evaluation
  // and destruction then recurse through: the depth is bounded here.
  ExprPtr done(ExprPtr e) {
    int d = 0;
    for (const Expr* c : {e->a.get(), e->b.get(), e->c.get(), e->d.get()})
      if (c) d = std::max(d, c->depth);
    for (const ExprPtr& x : e->items) d = std::max(d, x->depth);
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    e->depth = d + 1;
    if (e->depth > max_) too_deep(line_, max_);
    return e;
  }

  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>(k);
    e->line = line_;
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return done(std::move(e));
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (accept_name("or")) e = binary("or", std::move(e), and_expr());
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (accept_name("and")) e = binary("and", std::move(e), not_expr());
    return e;
  }
  ExprPtr not_expr() {
    if (accept_name("not")) {
      const Deeper deeper(*this);
      auto e = make(Expr::Kind::Unary);
      e->name = "not";
      e->a = not_expr();
      return done(std::move(e));
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = concat();
    while (true) {
      const Tok& t = t_[p_];
      if (t.kind == Tok::Kind::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                      t.text == "<=" || t.text == ">=")) {
        p_++;
        e = binary(t.text, std::move(e), concat());
      } else if (accept_name("in")) {
        e = binary("in", std::move(e), concat());
      } else if (peek_name("not") && peek_name("in", 1)) {
        p_ += 2;
        e = binary("not in", std::move(e), concat());
      } else {
        return e;
      }
    }
  }
  ExprPtr concat() {
    ExprPtr e = math1();
    while (accept_op("~")) e = binary("~", std::move(e), math1());
    return e;
  }
  ExprPtr math1() {
    ExprPtr e = math2();
    while (peek_op("+") || peek_op("-")) {
      const std::string op = t_[p_++].text;
      e = binary(op, std::move(e), math2());
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const std::string op = t_[p_++].text;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary();
    while (accept_op("**")) e = binary("**", std::move(e), unary());
    return e;
  }
  // As in Jinja, a sign binds tighter than a filter: -3|abs is (-3)|abs.
  ExprPtr unary(bool with_filters = true) {
    ExprPtr e;
    if (peek_op("-") || peek_op("+")) {
      const Deeper deeper(*this);
      e = make(Expr::Kind::Unary);
      e->name = t_[p_++].text;
      e->a = unary(false);
      e = done(std::move(e));
    } else {
      e = postfix(primary());
    }
    if (with_filters) e = filters(std::move(e));
    return e;
  }

  void call_args(Expr& e) {
    // after '(': positional args, then name=value keyword args
    while (!accept_op(")")) {
      if (t_[p_].kind == Tok::Kind::Name && t_[p_ + 1].kind == Tok::Kind::Op && t_[p_ + 1].text == "=") {
        std::string key = t_[p_].text;
        p_ += 2;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        e.items.push_back(expression());
      }
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (accept_op(".")) {
        auto a = make(Expr::Kind::Attr);
        a->a = std::move(e);
        if (t_[p_].kind == Tok::Kind::Number) {  // x.0 is x[0]
          a->kind = Expr::Kind::Index;
          a->b = make(Expr::Kind::Literal);
          a->b->literal = t_[p_++].value;
        } else {
          a->name = expect_name();
        }
        e = done(std::move(a));
      } else if (accept_op("[")) {
        ExprPtr lo, hi, step;
        bool slice = false;
        if (!peek_op(":")) lo = expression();
        if (accept_op(":")) {
          slice = true;
          if (!peek_op("]") && !peek_op(":")) hi = expression();
          if (accept_op(":") && !peek_op("]")) step = expression();
        }
        expect_op("]");
        auto x = make(slice ? Expr::Kind::Slice : Expr::Kind::Index);
        x->a = std::move(e);
        x->b = std::move(lo);
        x->c = std::move(hi);
        x->d = std::move(step);
        e = done(std::move(x));
      } else if (accept_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->a = std::move(e);
        call_args(*c);
        e = done(std::move(c));
      } else {
        return e;
      }
    }
  }

  // Filters and tests, each possibly followed by a call or more filters.
  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        auto f = make(Expr::Kind::Filter);
        f->name = expect_name();
        while (accept_op(".")) f->name.append(".").append(expect_name());
        f->a = std::move(e);
        if (accept_op("(")) call_args(*f);
        e = done(std::move(f));
      } else if (peek_name("is")) {
        p_++;
        auto t = make(Expr::Kind::Test);
        t->negated = accept_name("not");
        t->name = expect_name();
        t->a = std::move(e);
        if (accept_op("(")) {
          call_args(*t);
        } else {
          static const std::set<std::string> stop = {"and", "or", "else", "if", "not", "in", "is"};
          const Tok& n = t_[p_];
          if (n.kind == Tok::Kind::Number || n.kind == Tok::Kind::String ||
              (n.kind == Tok::Kind::Name && !stop.count(n.text)))
            t->items.push_back(postfix(primary()));
        }
        e = done(std::move(t));
      } else if (peek_op("(") || peek_op(".") || peek_op("[")) {
        e = postfix(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr primary() {
    const Tok t = t_[p_];
    if (t.kind == Tok::Kind::End) fail(line_, "expression ends too early");
    p_++;
    if (t.kind == Tok::Kind::Number || t.kind == Tok::Kind::String) {
      auto e = make(Expr::Kind::Literal);
      e->literal = t.value;
      while (t.kind == Tok::Kind::String && t_[p_].kind == Tok::Kind::String) e->literal.s += t_[p_++].text;
      return e;
    }
    if (t.kind == Tok::Kind::Name) {
      auto e = make(Expr::Kind::Literal);
      if (t.text == "true" || t.text == "True") e->literal = Value(true);
      else if (t.text == "false" || t.text == "False") e->literal = Value(false);
      else if (t.text == "none" || t.text == "None") e->literal = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = t.text;
      }
      return e;
    }
    if (t.text == "(") {
      if (accept_op(")")) return make(Expr::Kind::List);
      ExprPtr e = tuple_or_expression();
      expect_op(")");
      return e;
    }
    if (t.text == "[") {
      auto e = make(Expr::Kind::List);
      while (!accept_op("]")) {
        e->items.push_back(expression());
        if (!accept_op(",")) {
          expect_op("]");
          break;
        }
      }
      return done(std::move(e));
    }
    if (t.text == "{") {
      auto e = make(Expr::Kind::Dict);
      while (!accept_op("}")) {
        e->items.push_back(expression());
        expect_op(":");
        e->items.push_back(expression());
        if (!accept_op(",")) {
          expect_op("}");
          break;
        }
      }
      return done(std::move(e));
    }
    fail(line_, "unexpected '" + t.text + "'");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  int line_;
  int max_;
  int depth_ = 0;
};

// ---- Statements ----

class TemplateParser {
 public:
  TemplateParser(std::vector<Segment> segs, int max_nesting) : segs_(std::move(segs)), max_(max_nesting) {}

  Body parse() {
    std::string stop;
    Body b = body({}, &stop);
    return b;
  }

 private:
  // Parses nodes until a statement whose keyword is in `stops`; leaves its parser in `rest_`.
  Body body(const std::set<std::string>& stops, std::string* stopped_by) {
    Body out;
    while (i_ < segs_.size()) {
      const Segment& s = segs_[i_++];
      if (s.kind == Segment::Kind::Text) {
        auto n = node(Node::Kind::Text, s.line);
        n->text = s.code;
        out.push_back(std::move(n));
        continue;
      }
      auto p = std::make_unique<ExprParser>(lex(s.code, s.line), s.line, max_);
      if (s.kind == Segment::Kind::Expr) {
        auto n = node(Node::Kind::Output, s.line);
        n->expr = p->expression();
        p->expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string kw = p->expect_name();
      if (stops.count(kw)) {
        *stopped_by = kw;
        rest_ = std::move(p);
        line_ = s.line;
        return out;
      }
      out.push_back(statement(kw, *p, s.line));
    }
    if (!stops.empty()) fail(segs_.empty() ? 1 : segs_.back().line, "missing {% " + *stops.rbegin() + " %}");
    return out;
  }

  NodePtr node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>(k);
    n->line = line;
    return n;
  }

  // {% if %}...{% elif %}...{% else %}...{% endif %}: one branch per condition, the else's with none.
  NodePtr if_statement(ExprParser& p, int line) {
    std::string stop;
    auto n = node(Node::Kind::If, line);
    ExprPtr cond = p.expression();
    p.expect_end();
    while (true) {
      Body b = body({"elif", "else", "endif"}, &stop);
      n->branches.emplace_back(std::move(cond), std::move(b));
      if (stop == "endif") break;
      if (stop == "else") {
        rest_->expect_end();
        n->branches.emplace_back(nullptr, body({"endif"}, &stop));
        break;
      }
      cond = rest_->expression();
      rest_->expect_end();
    }
    rest_->expect_end();
    return n;
  }

  // {% for a, b in items if cond recursive %}...{% else %}...{% endfor %} ('recursive' is read and ignored).
  NodePtr for_statement(ExprParser& p, int line) {
    std::string stop;
    auto n = node(Node::Kind::For, line);
    n->targets.push_back(p.expect_name());
    while (p.accept_op(",")) n->targets.push_back(p.expect_name());
    if (!p.accept_name("in")) fail(line, "expected 'in' in for loop");
    n->expr = p.tuple_or_expression(false);
    if (p.accept_name("if")) n->cond = p.expression(false);
    p.accept_name("recursive");
    p.expect_end();
    n->body = body({"else", "endfor"}, &stop);
    if (stop == "else") {
      rest_->expect_end();
      n->else_body = body({"endfor"}, &stop);
    }
    rest_->expect_end();
    return n;
  }

  // {% set x = ... %}, {% set ns.attr = ... %}, {% set a, b = ... %}, or the block form {% set x %}...{% endset %}.
  NodePtr set_statement(ExprParser& p, int line) {
    std::string stop;
    auto n = node(Node::Kind::Set, line);
    n->text = p.expect_name();
    if (p.accept_op(".")) n->attr = p.expect_name();
    if (n->attr.empty() && p.peek_op(",")) {
      n->targets.push_back(n->text);
      while (p.accept_op(",")) n->targets.push_back(p.expect_name());
    }
    if (p.accept_op("=")) {
      n->expr = p.tuple_or_expression();
      p.expect_end();
      return n;
    }
    p.expect_end();
    n->kind = Node::Kind::SetBlock;
    n->body = body({"endset"}, &stop);
    rest_->expect_end();
    return n;
  }

  // {% macro name(a, b=default) %}...{% endmacro %}
  NodePtr macro_statement(ExprParser& p, int line) {
    std::string stop;
    auto n = node(Node::Kind::Macro, line);
    n->text = p.expect_name();
    p.expect_op("(");
    while (!p.accept_op(")")) {
      std::string param = p.expect_name();
      ExprPtr def;
      if (p.accept_op("=")) def = p.expression();
      n->params.emplace_back(std::move(param), std::move(def));
      if (!p.accept_op(",")) {
        p.expect_op(")");
        break;
      }
    }
    p.expect_end();
    n->body = body({"endmacro"}, &stop);
    return n;
  }

  NodePtr statement(const std::string& kw, ExprParser& p, int line) {
    struct Deeper {  // statements inside statements: body() and statement() recurse
      int& depth;
      Deeper(int& d, int max, int line) : depth(++d) {
        if (depth > max) too_deep(line, max);
      }
      ~Deeper() { --depth; }
    } deeper(depth_, max_, line);
    if (kw == "if") return if_statement(p, line);
    if (kw == "for") return for_statement(p, line);
    if (kw == "set") return set_statement(p, line);
    if (kw == "macro") return macro_statement(p, line);
    if (kw == "break" || kw == "continue") {
      p.expect_end();
      return node(kw == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body as is
      std::string stop;
      auto n = node(Node::Kind::Scope, line);
      n->body = body({"endgeneration"}, &stop);
      return n;
    }
    fail(line, "unsupported statement {% " + kw + " %}");
  }

  std::vector<Segment> segs_;
  int max_;
  int depth_ = 0;
  size_t i_ = 0;
  std::unique_ptr<ExprParser> rest_;  // the stopping statement's remaining tokens
  int line_ = 0;
};

}  // namespace

Body parse_template(std::string_view source, int max_nesting) { return TemplateParser(segment(source), max_nesting).parse(); }

}  // namespace tandem::jinja
