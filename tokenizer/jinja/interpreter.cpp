#include "tokenizer/jinja/interpreter.h"

#include <cmath>
#include <cstdint>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"

namespace tandem::jinja {

namespace {

// Variables of one scope. `for` bodies and macro calls open one; `if` does not (as in Jinja,
// a `set` inside a loop is gone after it, which is why templates use namespace()).
struct Scope {
  std::unordered_map<std::string, Value> vars;
  const Scope* parent = nullptr;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Interpreter(const Limits& limits) : limits_(limits) {}

  void run(const Body& body, Scope& scope, std::string& out) {
    if (exec(body, scope, out) != Flow::Normal) throw Error("break or continue outside a loop");
  }

 private:
  [[noreturn]] static void fail(int line, const std::string& what) {
    throw Error("line " + std::to_string(line) + ": " + what);
  }

  void step(int line) {
    if (++steps_ > limits_.max_steps) fail(line, "template runs too long");
  }

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, scope, out);
      if (f != Flow::Normal) return f;
      if (out.size() > limits_.max_output_bytes) fail(n->line, "template output too large");
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, Scope& scope, std::string& out) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return Flow::Normal;
      case Node::Kind::Output: out += eval(*n.expr, scope).str(); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond, scope).truthy()) return exec(body, scope, out);
        return Flow::Normal;
      case Node::Kind::For: return exec_for(n, scope, out);
      case Node::Kind::Set: {
        Value v = eval(*n.expr, scope);
        if (!n.attr.empty()) {
          const Value* target = scope.find(n.text);
          if (!target || !target->is_object()) fail(n.line, "cannot set '" + n.attr + "' on '" + n.text + "'");
          Value(*target).set(n.attr, std::move(v));
        } else if (!n.targets.empty()) {
          if (!v.is_array() || v.arr->size() != n.targets.size()) fail(n.line, "cannot unpack into the set targets");
          for (size_t k = 0; k < n.targets.size(); k++) scope.vars[n.targets[k]] = (*v.arr)[k];
        } else {
          scope.vars[n.text] = std::move(v);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string captured;
        Scope inner{{}, &scope};
        exec(n.body, inner, captured);
        scope.vars[n.text] = Value(captured);
        return Flow::Normal;
      }
      case Node::Kind::Macro: scope.vars[n.text] = make_macro(n, scope); return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Scope: return exec(n.body, scope, out);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& n, Scope& scope, std::string& out) {
    const Value seq = eval(*n.expr, scope);
    Array items;
    if (seq.is_array() || seq.is_object() || seq.is_string()) {
      Args none;
      Kwargs no_kw;
      items = *apply_filter("list", seq, none, no_kw).arr;  // dicts give their keys, strings characters
    } else if (!seq.is_undefined() && !seq.is_none()) {
      fail(n.line, std::string("cannot loop over a ") + seq.type_name());
    }
    // Bind the loop variables of one item in `s`.
    auto bind = [&](Scope& s, const Value& item) {
      if (n.targets.size() == 1) {
        s.vars[n.targets[0]] = item;
        return;
      }
      if (!item.is_array() || item.arr->size() != n.targets.size()) fail(n.line, "cannot unpack the loop item");
      for (size_t k = 0; k < n.targets.size(); k++) s.vars[n.targets[k]] = (*item.arr)[k];
    };
    if (n.cond) {
      Array kept;
      for (const Value& item : items) {
        Scope s{{}, &scope};
        bind(s, item);
        if (eval(*n.cond, s).truthy()) kept.push_back(item);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      Scope s{{}, &scope};
      exec(n.else_body, s, out);
      return Flow::Normal;
    }
    const int64_t len = (int64_t)items.size();
    for (int64_t k = 0; k < len; k++) {
      Scope s{{}, &scope};
      bind(s, items[(size_t)k]);
      Object loop = {{"index", Value(k + 1)},
                     {"index0", Value(k)},
                     {"revindex", Value(len - k)},
                     {"revindex0", Value(len - k - 1)},
                     {"first", Value(k == 0)},
                     {"last", Value(k == len - 1)},
                     {"length", Value(len)},
                     {"previtem", k > 0 ? items[(size_t)k - 1] : Value()},
                     {"nextitem", k + 1 < len ? items[(size_t)k + 1] : Value()}};
      loop.emplace_back("cycle", Value::function([k](Args& a, Kwargs&) -> Value {
                          if (a.empty()) throw Error("loop.cycle() needs arguments");
                          return a[(size_t)k % a.size()];
                        }));
      s.vars["loop"] = Value(std::move(loop));
      if (exec(n.body, s, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Node& n, const Scope& defined_in) {
    const Scope* root = &defined_in;  // macros are defined at the top level; they see its variables
    return Value::function([this, &n, root](Args& args, Kwargs& kw) -> Value {
      if (++depth_ > limits_.max_call_depth) fail(n.line, "macro calls nest too deep");
      Scope s{{}, root};
      s.vars[n.text] = root->find(n.text) ? *root->find(n.text) : Value();
      for (size_t k = 0; k < n.params.size(); k++) {
        const auto& [pname, def] = n.params[k];
        Value v = k < args.size() ? args[k] : Value();
        for (const auto& [key, x] : kw)
          if (key == pname) v = x;
        if (v.is_undefined() && def) v = eval(*def, s);
        s.vars[pname] = v;
      }
      std::string out;
      exec(n.body, s, out);
      depth_--;
      return Value(out);
    });
  }

  void eval_args(const Expr& e, Scope& scope, Args& args, Kwargs& kw) {
    for (const ExprPtr& a : e.items) args.push_back(eval(*a, scope));
    for (const auto& [k, v] : e.kwargs) kw.emplace_back(k, eval(*v, scope));
  }

  Value index(const Value& obj, const Value& key, int line) {
    if (obj.is_array()) {
      if (key.kind != Value::Kind::Int) fail(line, "list index must be an integer");
      const int64_t n = (int64_t)obj.arr->size();
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      return k >= 0 && k < n ? (*obj.arr)[(size_t)k] : Value();
    }
    if (obj.is_object()) return obj.get(key.str());
    if (obj.is_string() && key.kind == Value::Kind::Int) {
      Value one = key;
      Value next(key.i + 1);
      if (key.i == -1) return slice(obj, &one, nullptr, nullptr);
      return slice(obj, &one, &next, nullptr);
    }
    return Value();  // undefined, as Jinja's subscript of a missing item
  }

  Value eval(const Expr& e, Scope& scope) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::List: {
        Array a;
        for (const ExprPtr& x : e.items) a.push_back(eval(*x, scope));
        return Value(std::move(a));
      }
      case Expr::Kind::Dict: {
        Value o{Object{}};
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) o.set(eval(*e.items[k], scope).str(), eval(*e.items[k + 1], scope));
        return o;
      }
      case Expr::Kind::Attr: return eval(*e.a, scope).get(e.name);
      case Expr::Kind::Index: return index(eval(*e.a, scope), eval(*e.b, scope), e.line);
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.a, scope);
        Value lo, hi, st;
        if (e.b) lo = eval(*e.b, scope);
        if (e.c) hi = eval(*e.c, scope);
        if (e.d) st = eval(*e.d, scope);
        return slice(obj, e.b ? &lo : nullptr, e.c ? &hi : nullptr, e.d ? &st : nullptr);
      }
      case Expr::Kind::Call: {
        Args args;
        Kwargs kw;
        if (e.a->kind == Expr::Kind::Attr) {
          const Value obj = eval(*e.a->a, scope);
          if (has_method(obj, e.a->name)) {
            eval_args(e, scope, args, kw);
            return call_method(obj, e.a->name, args, kw);
          }
        }
        const Value fn = eval(*e.a, scope);
        if (fn.kind != Value::Kind::Function) fail(e.line, "calling something that is not a function (" + std::string(fn.type_name()) + ")");
        eval_args(e, scope, args, kw);
        return (*fn.fn)(args, kw);
      }
      case Expr::Kind::Filter: {
        Args args;
        Kwargs kw;
        const Value v = eval(*e.a, scope);
        eval_args(e, scope, args, kw);
        return apply_filter(e.name, v, args, kw);
      }
      case Expr::Kind::Test: {
        Args args;
        Kwargs kw;
        const Value v = eval(*e.a, scope);
        eval_args(e, scope, args, kw);
        return Value(apply_test(e.name, v, args) != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.a, scope);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail(e.line, "unary " + e.name + " on a " + v.type_name());
        if (e.name == "+") return v;
        if (v.kind == Value::Kind::Int && v.i != INT64_MIN) return Value(-v.i);
        return Value(-v.as_double());
      }
      case Expr::Kind::Binary: return binary(e, scope);
      case Expr::Kind::Ternary:
        if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
        return e.c ? eval(*e.c, scope) : Value();
    }
    return Value();
  }

  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    Value l = eval(*e.a, scope);
    if (op == "and") return l.truthy() ? eval(*e.b, scope) : l;
    if (op == "or") return l.truthy() ? l : eval(*e.b, scope);
    const Value r = eval(*e.b, scope);
    if (op == "==") return Value(l == r);
    if (op == "!=") return Value(l != r);
    if (op == "<") return Value(less_than(l, r));
    if (op == ">") return Value(less_than(r, l));
    if (op == "<=") return Value(!less_than(r, l));
    if (op == ">=") return Value(!less_than(l, r));
    if (op == "~") return Value(l.str() + r.str());
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) found = r.s.find(l.str()) != std::string::npos;
      else if (r.is_array())
        for (const Value& x : *r.arr) found = found || x == l;
      else if (r.is_object()) found = !r.get(l.str()).is_undefined();
      return Value(found != (op == "not in"));
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value(l.s + r.s);
      if (l.is_array() && r.is_array()) {
        Array a = *l.arr;
        a.insert(a.end(), r.arr->begin(), r.arr->end());
        return Value(std::move(a));
      }
    }
    if (op == "*" && (l.is_string() || r.is_string()) && (l.kind == Value::Kind::Int || r.kind == Value::Kind::Int)) {
      const std::string& s = l.is_string() ? l.s : r.s;
      const int64_t n = l.is_string() ? r.i : l.i;
      if (n > 0 && s.size() * (size_t)n > limits_.max_output_bytes) fail(e.line, "string repetition too large");
      std::string out;
      for (int64_t k = 0; k < n; k++) out += s;
      return Value(out);
    }
    auto num = [](const Value& v) { return v.kind == Value::Kind::Bool ? Value((int64_t)v.b) : v; };
    const Value a = num(l), b = num(r);
    if (!a.is_number() || !b.is_number())
      fail(e.line, "unsupported operand types for " + op + ": " + l.type_name() + " and " + r.type_name());
    const bool ints = a.kind == Value::Kind::Int && b.kind == Value::Kind::Int;
    const double x = a.as_double(), y = b.as_double();
    int64_t exact = 0;  // integer results that overflow int64 fall back to floats
    if (op == "+") return ints && !__builtin_add_overflow(a.i, b.i, &exact) ? Value(exact) : Value(x + y);
    if (op == "-") return ints && !__builtin_sub_overflow(a.i, b.i, &exact) ? Value(exact) : Value(x - y);
    if (op == "*") return ints && !__builtin_mul_overflow(a.i, b.i, &exact) ? Value(exact) : Value(x * y);
    if (op == "/") {
      if (y == 0) fail(e.line, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(e.line, "division by zero");
      if (ints && !(a.i == INT64_MIN && b.i == -1)) {  // Python floors toward negative infinity
        int64_t q = a.i / b.i, m = a.i % b.i;
        if (m != 0 && ((m < 0) != (b.i < 0))) q--, m += b.i;
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(x / y);
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    const double p = std::pow(x, y);
    if (op == "**") return ints && b.i >= 0 && std::fabs(p) < 9e18 ? Value((int64_t)std::llround(p)) : Value(p);
    fail(e.line, "unknown operator " + op);
  }

  const Limits& limits_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string render(const Body& body, const Object& context, const Limits& limits) {
  Scope globals;
  for (auto& [k, v] : builtin_globals()) globals.vars[k] = v;
  for (const auto& [k, v] : context) globals.vars[k] = v;
  Scope top{{}, &globals};
  std::string out;
  Interpreter(limits).run(body, top, out);
  return out;
}

}  // namespace tandem::jinja
