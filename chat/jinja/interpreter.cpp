#include "chat/jinja/interpreter.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "chat/jinja/budget.h"
#include "chat/jinja/builtins.h"

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

[[noreturn]] void fail(int line, const std::string& what) { throw Error("line " + std::to_string(line) + ": " + what); }

// Python's int ** int for a non-negative exponent, by squaring; past int64 is an error.
int64_t int_power(int64_t base, int64_t exp, int line) {
  int64_t result = 1;
  const int64_t b0 = base, e0 = exp;
  auto overflow = [&] { fail(line, "integer overflow in " + std::to_string(b0) + " ** " + std::to_string(e0)); };
  while (true) {
    if ((exp & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
    exp >>= 1;
    if (exp == 0) return result;
    if (__builtin_mul_overflow(base, base, &base)) overflow();
  }
}

class Interpreter {
 public:
  explicit Interpreter(Budget& budget) : budget_(budget) {}

  void run(const Body& body, Scope& scope, StringBuilder& out) {
    if (exec(body, scope, out) != Flow::Normal) throw Error("break or continue outside a loop");
  }

 private:
  Flow exec(const Body& body, Scope& scope, StringBuilder& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, Scope& scope, StringBuilder& out) {
    const Budget::Nest nest(budget_);
    budget_.step();
    switch (n.kind) {
      case Node::Kind::Text: out.append(n.text); return Flow::Normal;
      case Node::Kind::Output: out.append_str(to_str(eval(*n.expr, scope), budget_)); return Flow::Normal;
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
          budget_.note_insert(*target, v);
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
        StringBuilder captured(budget_, "{% set %} block");
        Scope inner{{}, &scope};
        exec(n.body, inner, captured);
        scope.vars[n.text] = captured.take();
        return Flow::Normal;
      }
      case Node::Kind::Macro: scope.vars[n.text] = make_macro(n, scope); return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Scope: return exec(n.body, scope, out);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& n, Scope& scope, StringBuilder& out) {
    const Value seq = eval(*n.expr, scope);
    if (!seq.is_array() && !seq.is_object() && !seq.is_string() && !seq.is_undefined() && !seq.is_none())
      fail(n.line, std::string("cannot loop over a ") + seq.type_name());
    // Bind the loop variables of one item in `s`.
    auto bind = [&](Scope& s, const Value& item) {
      if (n.targets.size() == 1) {
        s.vars[n.targets[0]] = item;
        return;
      }
      if (!item.is_array() || item.arr->size() != n.targets.size()) fail(n.line, "cannot unpack the loop item");
      for (size_t k = 0; k < n.targets.size(); k++) s.vars[n.targets[k]] = (*item.arr)[k];
    };
    // A list is visited in place, by index (no copy per loop: nested loops over the messages
    // stay cheap); dicts give their keys and strings their characters, as a new list.
    std::shared_ptr<Array> items = seq.is_array() ? seq.arr : std::make_shared<Array>(items_of(seq, budget_));
    if (n.cond) {
      Array kept;
      for (size_t k = 0; k < items->size(); k++) {
        budget_.step();
        const Value item = (*items)[k];
        Scope s{{}, &scope};
        bind(s, item);
        if (eval(*n.cond, s).truthy()) {
          budget_.grow_list(kept.size() + 1, "filtered loop items");
          kept.push_back(item);
        }
      }
      items = std::make_shared<Array>(std::move(kept));
    }
    if (items->empty()) {
      Scope s{{}, &scope};
      exec(n.else_body, s, out);
      return Flow::Normal;
    }
    // One `loop` object per loop, advanced in place each iteration, as Jinja's LoopContext.
    const int64_t len = (int64_t)items->size();
    auto item_at = [&](int64_t k) { return k >= 0 && k < (int64_t)items->size() ? (*items)[(size_t)k] : Value(); };
    auto index = std::make_shared<int64_t>(0);
    Value loop{Object{{"index", Value()}, {"index0", Value()}, {"revindex", Value()}, {"revindex0", Value()},
                      {"first", Value()}, {"last", Value()}, {"length", Value(len)}, {"previtem", Value()},
                      {"nextitem", Value()}}};
    loop.obj->emplace_back("cycle", Value::function([index](Args& a, Kwargs&) -> Value {
                             if (a.empty()) throw Error("loop.cycle() needs arguments");
                             return a[(size_t)*index % a.size()];
                           }));
    // Each iteration starts with only the loop variables in its scope; the scope object is
    // reused (cleared only when the body set something) because empty loops must be cheap.
    Scope s{{}, &scope};
    // The body may shrink the list it walks (pop): stop where it ends.
    for (int64_t k = 0; k < len && k < (int64_t)items->size(); k++) {
      budget_.step();  // an empty body still costs a step per iteration
      *index = k;
      Object& o = *loop.obj;
      o[0].second = Value(k + 1);
      o[1].second = Value(k);
      o[2].second = Value(len - k);
      o[3].second = Value(len - k - 1);
      o[4].second = Value(k == 0);
      o[5].second = Value(k == len - 1);
      o[7].second = item_at(k - 1);
      o[8].second = k + 1 < len ? item_at(k + 1) : Value();
      if (s.vars.size() > n.targets.size() + 1) s.vars.clear();
      bind(s, item_at(k));
      if (k == 0 || s.vars.size() <= n.targets.size()) s.vars["loop"] = loop;
      if (exec(n.body, s, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Node& n, const Scope& defined_in) {
    const Scope* root = &defined_in;  // macros are defined at the top level; they see its variables
    return Value::function([this, &n, root](Args& args, Kwargs& kw) -> Value {
      const Budget::Nest nest(budget_);
      struct Call {
        int& depth;
        explicit Call(int& d) : depth(++d) {}
        ~Call() { --depth; }
      } call(calls_);
      if (calls_ > budget_.limits().max_call_depth)
        fail(n.line, "macro calls nested deeper than " + std::to_string(budget_.limits().max_call_depth) + " (max_call_depth)");
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
      StringBuilder out(budget_, "macro output");
      exec(n.body, s, out);
      return out.take();
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
    if (obj.is_object()) {
      budget_.step((int64_t)obj.obj->size());
      return obj.get(to_str(key, budget_).s);
    }
    if (obj.is_string() && key.kind == Value::Kind::Int) {
      if (key.i == INT64_MAX) return Value(std::string());
      const Value one = key, next(key.i + 1);
      return slice(obj, &one, key.i == -1 ? nullptr : &next, nullptr, budget_);
    }
    return Value();  // undefined, as Jinja's subscript of a missing item
  }

  // [a, b, ...]: each item's string is charged, since the list holds a copy.
  Value eval_list(const Expr& e, Scope& scope) {
    budget_.allocate_items(e.items.size(), "list");
    Array a;
    a.reserve(e.items.size());
    for (const ExprPtr& x : e.items) {
      a.push_back(eval(*x, scope));
      budget_.spend(a.back().s.size());  // a copy of the string lives in the list
    }
    return Value(std::move(a));
  }

  // {k: v, ...}: keys and values alternate in e.items, each key evaluated before its value.
  Value eval_dict(const Expr& e, Scope& scope) {
    budget_.allocate_items(e.items.size() / 2, "dict");
    Value o{Object{}};
    for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
      const Value key = to_str(eval(*e.items[k], scope), budget_);
      if (!key.taint.empty()) o.data = true;  // a key from request data
      budget_.step((int64_t)o.obj->size());
      Value v = eval(*e.items[k + 1], scope);
      budget_.spend(v.s.size());
      o.set(key.s, std::move(v));
    }
    return o;
  }

  // f(...) or obj.method(...): a built-in method of the object wins over an attribute of that name.
  Value eval_call(const Expr& e, Scope& scope) {
    Args args;
    Kwargs kw;
    if (e.a->kind == Expr::Kind::Attr) {
      const Value obj = eval(*e.a->a, scope);
      if (has_method(obj, e.a->name)) {
        eval_args(e, scope, args, kw);
        return call_method(obj, e.a->name, args, kw, budget_);
      }
    }
    const Value fn = eval(*e.a, scope);
    if (fn.kind != Value::Kind::Function) fail(e.line, "calling something that is not a function (" + std::string(fn.type_name()) + ")");
    eval_args(e, scope, args, kw);
    return (*fn.fn)(args, kw);
  }

  // not, + and -; negating INT64_MIN is an overflow, as in binary arithmetic.
  Value eval_unary(const Expr& e, Scope& scope) {
    const Value v = eval(*e.a, scope);
    if (e.name == "not") return Value(!v.truthy());
    if (!v.is_number()) fail(e.line, "unary " + e.name + " on a " + v.type_name());
    if (e.name == "+") return v;
    if (v.kind == Value::Kind::Int) {
      if (v.i == INT64_MIN) fail(e.line, "integer overflow in -(" + std::to_string(v.i) + ")");
      return Value(-v.i);
    }
    return Value(-v.f);
  }

  Value eval(const Expr& e, Scope& scope) {
    const Budget::Nest nest(budget_);
    budget_.step();
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::List: return eval_list(e, scope);
      case Expr::Kind::Dict: return eval_dict(e, scope);
      case Expr::Kind::Attr: {
        const Value obj = eval(*e.a, scope);
        if (obj.is_object()) budget_.step((int64_t)obj.obj->size());
        return obj.get(e.name);
      }
      case Expr::Kind::Index: {
        const Value obj = eval(*e.a, scope);
        return index(obj, eval(*e.b, scope), e.line);
      }
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.a, scope);
        Value lo, hi, st;
        if (e.b) lo = eval(*e.b, scope);
        if (e.c) hi = eval(*e.c, scope);
        if (e.d) st = eval(*e.d, scope);
        return slice(obj, e.b ? &lo : nullptr, e.c ? &hi : nullptr, e.d ? &st : nullptr, budget_);
      }
      case Expr::Kind::Call: return eval_call(e, scope);
      case Expr::Kind::Filter: {
        Args args;
        Kwargs kw;
        const Value v = eval(*e.a, scope);
        eval_args(e, scope, args, kw);
        return apply_filter(e.name, v, args, kw, budget_);
      }
      case Expr::Kind::Test: {
        Args args;
        Kwargs kw;
        const Value v = eval(*e.a, scope);
        eval_args(e, scope, args, kw);
        return Value(apply_test(e.name, v, args, budget_) != e.negated);
      }
      case Expr::Kind::Unary: return eval_unary(e, scope);
      case Expr::Kind::Binary: return binary(e, scope);
      case Expr::Kind::Ternary:
        if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
        return e.c ? eval(*e.c, scope) : Value();
    }
    return Value();
  }

  // str * int, sized before it is built.
  Value repeat(const Value& str, int64_t n, int line) {
    if (n <= 0 || str.s.empty()) return Value(std::string());
    const size_t max = budget_.limits().max_value_bytes;
    if ((uint64_t)n > max / str.s.size())
      fail(line, "string repetition of " + std::to_string(str.s.size()) + " bytes x " + std::to_string(n) +
                     " is over the limit of " + std::to_string(max) + " bytes (max_value_bytes)");
    const size_t total = str.s.size() * (size_t)n;
    budget_.allocate(total, "string repetition");
    std::string out = str.s;  // doubled: a few memcpys, however many copies
    out.reserve(total);
    while (out.size() * 2 <= total) out.append(out);
    out.append(out, 0, total - out.size());
    ByteSpans taint;
    if (str.taint == taint_whole(str.s.size())) {
      taint = taint_whole(total);
    } else if (!str.taint.empty()) {
      budget_.step(n);
      for (int64_t k = 0; k < n; k++) taint_append(taint, str.taint, (size_t)k * str.s.size());
    }
    return Value(std::move(out), std::move(taint));
  }

  [[noreturn]] void overflow(const Expr& e, const Value& a, const Value& b) {
    fail(e.line, "integer overflow in " + a.scalar_str() + " " + e.name + " " + b.scalar_str());
  }

  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    Value l = eval(*e.a, scope);
    if (op == "and") return l.truthy() ? eval(*e.b, scope) : l;
    if (op == "or") return l.truthy() ? l : eval(*e.b, scope);
    const Value r = eval(*e.b, scope);
    if (op == "==") return Value(equals(l, r, budget_));
    if (op == "!=") return Value(!equals(l, r, budget_));
    if (op == "<") return Value(less_than(l, r, budget_));
    if (op == ">") return Value(less_than(r, l, budget_));
    if (op == "<=") return Value(!less_than(r, l, budget_));
    if (op == ">=") return Value(!less_than(l, r, budget_));
    if (op == "~" || (op == "+" && l.is_string() && r.is_string())) {
      StringBuilder out(budget_, op == "~" ? "~ result" : "string concatenation");
      out.append_str(to_str(l, budget_));
      out.append_str(to_str(r, budget_));
      return out.take();
    }
    if (op == "in" || op == "not in") return Value(is_in(l, r) != (op == "not in"));
    if (op == "+" && l.is_array() && r.is_array()) {
      budget_.allocate_items(l.arr->size() + r.arr->size(), "list concatenation");
      budget_.step((int64_t)(l.arr->size() + r.arr->size()));
      Array a = *l.arr;
      a.insert(a.end(), r.arr->begin(), r.arr->end());
      return Value(std::move(a));
    }
    if (op == "*" && (l.is_string() || r.is_string()) && (l.kind == Value::Kind::Int || r.kind == Value::Kind::Int))
      return repeat(l.is_string() ? l : r, l.is_string() ? r.i : l.i, e.line);
    return arithmetic(e, l, r);
  }

  // `l in r`: a substring of a string, an item of a list, a key of a dict; false for anything else.
  bool is_in(const Value& l, const Value& r) {
    bool found = false;
    if (r.is_string()) {
      found = find_text(r.s, to_str(l, budget_).s) != std::string::npos;
    } else if (r.is_array()) {
      for (const Value& x : *r.arr)
        if ((found = equals(x, l, budget_))) break;
    } else if (r.is_object()) {
      budget_.step((int64_t)r.obj->size());
      found = !r.get(to_str(l, budget_).s).is_undefined();
    }
    return found;
  }

  // Numbers (booleans count as 0 and 1): integers stay exact, with overflow an error, and // and %
  // floor as Python's do.
  Value arithmetic(const Expr& e, const Value& l, const Value& r) {
    const std::string& op = e.name;
    auto num = [](const Value& v) { return v.kind == Value::Kind::Bool ? Value((int64_t)v.b) : v; };
    const Value a = num(l), b = num(r);
    if (!a.is_number() || !b.is_number())
      fail(e.line, "unsupported operand types for " + op + ": " + l.type_name() + " and " + r.type_name());
    const bool ints = a.kind == Value::Kind::Int && b.kind == Value::Kind::Int;
    const double x = a.as_double(), y = b.as_double();
    int64_t exact = 0;
    if (op == "+") {
      if (!ints) return Value(x + y);
      if (__builtin_add_overflow(a.i, b.i, &exact)) overflow(e, a, b);
      return Value(exact);
    }
    if (op == "-") {
      if (!ints) return Value(x - y);
      if (__builtin_sub_overflow(a.i, b.i, &exact)) overflow(e, a, b);
      return Value(exact);
    }
    if (op == "*") {
      if (!ints) return Value(x * y);
      if (__builtin_mul_overflow(a.i, b.i, &exact)) overflow(e, a, b);
      return Value(exact);
    }
    if (op == "/") {
      if (y == 0) fail(e.line, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(e.line, "division by zero");
      if (ints) {  // Python floors toward negative infinity
        if (a.i == INT64_MIN && b.i == -1) {
          if (op == "%") return Value((int64_t)0);
          overflow(e, a, b);
        }
        int64_t q = a.i / b.i, m = a.i % b.i;
        if (m != 0 && ((m < 0) != (b.i < 0))) q--, m += b.i;
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(x / y);
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (ints && b.i >= 0) return Value(int_power(a.i, b.i, e.line));
      if (x == 0 && y < 0) fail(e.line, "division by zero (0 to a negative power)");
      return Value(std::pow(x, y));
    }
    fail(e.line, "unknown operator " + op);
  }

  Budget& budget_;
  int calls_ = 0;
};

}  // namespace

RenderedPrompt render(const Body& body, const Object& context, const Limits& limits) {
  Budget budget(limits);
  Scope globals;
  for (auto& [k, v] : builtin_globals(budget)) globals.vars[k] = v;
  for (const auto& [k, v] : context) globals.vars[k] = v;
  Scope top{{}, &globals};
  StringBuilder out(budget, "template output", true);
  Interpreter(budget).run(body, top, out);
  RenderedPrompt p;
  p.text = out.str();
  p.data_spans = out.taint();
  return p;
}

}  // namespace tandem::jinja
