#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <ctime>

#include "tokenizer/utf8.h"

namespace tandem::jinja {

namespace {

const std::string kWhitespace = " \t\n\r\f\v";

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && chars.find(s[a]) != std::string::npos) a++;
  if (right)
    while (b > a && chars.find(s[b - 1]) != std::string::npos) b--;
  return s.substr(a, b - a);
}

std::string chars_arg(const Args& args) {
  return args.empty() || args[0].is_none() ? kWhitespace : args[0].str();
}

std::string upper(std::string s) {
  for (char& c : s) c = (char)std::toupper((unsigned char)c);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = (char)std::toupper((unsigned char)out[0]);
  return out;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha((unsigned char)c);
    c = alpha ? (char)(start ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c)) : c;
    start = !alpha;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0, hit;
  while (count != 0 && (hit = s.find(from, pos)) != std::string::npos) {
    out.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
    count--;
  }
  return out.append(s, pos, std::string::npos);
}

Value split(const std::string& s, const Args& args) {
  Array out;
  const int64_t maxsplit = args.size() > 1 ? args[1].i : -1;
  if (args.empty() || args[0].is_none()) {  // runs of whitespace, no empty pieces
    size_t k = 0;
    int64_t n = 0;
    while (k < s.size()) {
      while (k < s.size() && kWhitespace.find(s[k]) != std::string::npos) k++;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && n == maxsplit) {
        out.emplace_back(strip(s.substr(k), kWhitespace, false, true));
        break;
      }
      size_t e = k;
      while (e < s.size() && kWhitespace.find(s[e]) == std::string::npos) e++;
      out.emplace_back(s.substr(k, e - k));
      n++;
      k = e;
    }
    return Value(std::move(out));
  }
  const std::string sep = args[0].str();
  if (sep.empty()) throw Error("split(): empty separator");
  size_t pos = 0, hit;
  int64_t n = 0;
  while ((maxsplit < 0 || n < maxsplit) && (hit = s.find(sep, pos)) != std::string::npos) {
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
    n++;
  }
  out.emplace_back(s.substr(pos));
  return Value(std::move(out));
}

const Value* kwarg(const Kwargs& kw, const char* name) {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// An argument by position or by keyword, or null.
const Value* arg(const Args& args, const Kwargs& kw, size_t pos, const char* name) {
  if (pos < args.size()) return &args[pos];
  return kwarg(kw, name);
}

Array items_of(const Value& v) {
  if (v.is_array()) return *v.arr;
  Array out;
  if (v.is_object())
    for (const auto& [k, x] : *v.obj) out.emplace_back(k);
  else if (v.is_string())
    for (auto c : utf8_chars(v.s)) out.emplace_back(std::string(c));
  else if (!v.is_undefined() && !v.is_none())
    throw Error(std::string("a ") + v.type_name() + " is not iterable");
  return out;
}

// attribute="a.b" lookups as used by map/selectattr/sort/join.
Value attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string key = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_array() && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
      const size_t idx = std::stoul(key);
      cur = idx < cur.arr->size() ? (*cur.arr)[idx] : Value();
    } else {
      cur = cur.get(key);
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

Value items_pairs(const Value& v) {
  Array out;
  if (v.is_object())
    for (const auto& [k, x] : *v.obj) out.emplace_back(Array{Value(k), x});
  return Value(std::move(out));
}

int64_t to_int(const Value& v) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Float) return (int64_t)v.f;
  if (v.kind == Value::Kind::Bool) return v.b;
  if (v.is_string()) {
    try {
      return std::stoll(v.s);
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

Value select(const Value& seq, Args& args, bool by_attr, bool keep) {
  // select(test, args...) / selectattr(attr, test, args...); without a test, truthiness.
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty()) throw Error("selectattr needs an attribute");
    attr = args[k++].str();
  }
  std::string test = k < args.size() ? args[k++].str() : "";
  Args rest(args.begin() + (long)std::min(k, args.size()), args.end());
  Array out;
  for (const Value& x : items_of(seq)) {
    const Value target = by_attr ? attribute(x, attr) : x;
    const bool ok = test.empty() ? target.truthy() : apply_test(test, target, rest);
    if (ok == keep) out.push_back(x);
  }
  return Value(std::move(out));
}

}  // namespace

Value slice(const Value& obj, const Value* lo, const Value* hi, const Value* step) {
  std::vector<Value> seq;
  const bool is_str = obj.is_string();
  if (is_str) {
    for (auto c : utf8_chars(obj.s)) seq.emplace_back(std::string(c));
  } else if (obj.is_array()) {
    seq = *obj.arr;
  } else {
    throw Error(std::string("cannot slice a ") + obj.type_name());
  }
  const int64_t n = (int64_t)seq.size();
  const int64_t st = step && !step->is_none() ? step->i : 1;
  if (st == 0) throw Error("slice step cannot be zero");
  auto norm = [&](const Value* v, int64_t def) -> int64_t {
    if (!v || v->is_none()) return def;
    int64_t x = v->i;
    if (x < 0) x += n;
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t a = norm(lo, st > 0 ? 0 : n - 1), b = norm(hi, st > 0 ? n : -1);
  Array out;
  for (int64_t k = a; st > 0 ? k < b : k > b;) {
    out.push_back(seq[(size_t)k]);
    if (__builtin_add_overflow(k, st, &k)) break;
  }
  if (!is_str) return Value(std::move(out));
  std::string s;
  for (const Value& c : out) s += c.s;
  return Value(s);
}

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw) {
  if (name == "trim") return Value(strip(v.str(), chars_arg(args), true, true));
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value((int64_t)utf8_chars(v.s).size());
    if (v.is_array()) return Value((int64_t)v.arr->size());
    if (v.is_object()) return Value((int64_t)v.obj->size());
    if (v.is_undefined()) return Value((int64_t)0);
    throw Error(std::string("a ") + v.type_name() + " has no length");
  }
  if (name == "upper") return Value(upper(v.str()));
  if (name == "lower") return Value(lower(v.str()));
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "title") return Value(title(v.str()));
  if (name == "string") return Value(v.str());
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") return v;  // no autoescape
  if (name == "int") return Value(to_int(v));
  if (name == "float") return Value(v.is_number() ? v.as_double() : v.is_string() ? std::atof(v.s.c_str()) : 0.0);
  if (name == "abs") return v.kind == Value::Kind::Int && v.i != INT64_MIN ? Value((int64_t)std::llabs(v.i)) : Value(std::fabs(v.as_double()));
  if (name == "round") {
    const Value* p = arg(args, kw, 0, "precision");
    const double scale = std::pow(10.0, p ? (double)p->i : 0.0);
    return Value(std::round(v.as_double() * scale) / scale);
  }
  if (name == "first" || name == "last") {
    const Array a = items_of(v);
    if (a.empty()) return Value();
    return name == "first" ? a.front() : a.back();
  }
  if (name == "list") return Value(items_of(v));
  if (name == "reverse") {
    if (v.is_string()) {
      const Value backwards((int64_t)-1);
      return slice(v, nullptr, nullptr, &backwards);
    }
    Array a = items_of(v);
    std::reverse(a.begin(), a.end());
    return Value(std::move(a));
  }
  if (name == "join") {
    const Value* sep = arg(args, kw, 0, "d");
    const Value* attr = arg(args, kw, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : items_of(v)) {
      if (!first && sep) out += sep->str();
      first = false;
      out += (attr ? attribute(x, attr->str()) : x).str();
    }
    return Value(out);
  }
  if (name == "default" || name == "d") {
    const Value* def = arg(args, kw, 0, "default_value");
    const Value* boolean = arg(args, kw, 1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_default ? (def ? *def : Value(std::string())) : v;
  }
  if (name == "tojson") {
    const Value* indent = arg(args, kw, 0, "indent");
    const Value* sort = kwarg(kw, "sort_keys");
    return Value(v.to_json(indent && !indent->is_none() ? (int)indent->i : -1, sort && sort->truthy()));
  }
  if (name == "items") return items_pairs(v);
  if (name == "replace") {
    if (args.size() < 2) throw Error("replace needs two arguments");
    return Value(replace_all(v.str(), args[0].str(), args[1].str(), args.size() > 2 ? args[2].i : -1));
  }
  if (name == "map") {
    const Value* attr = kwarg(kw, "attribute");
    Array out;
    for (const Value& x : items_of(v)) {
      if (attr) {
        out.push_back(attribute(x, attr->str()));
      } else {
        if (args.empty()) throw Error("map needs a filter name or attribute=");
        Args rest(args.begin() + 1, args.end());
        Kwargs none;
        out.push_back(apply_filter(args[0].str(), x, rest, none));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select") return select(v, args, false, true);
  if (name == "reject") return select(v, args, false, false);
  if (name == "selectattr") return select(v, args, true, true);
  if (name == "rejectattr") return select(v, args, true, false);
  if (name == "unique") {
    Array out;
    for (const Value& x : items_of(v))
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    return Value(std::move(out));
  }
  if (name == "sort") {
    Array a = items_of(v);
    const Value* rev = arg(args, kw, 0, "reverse");
    const Value* attr = kwarg(kw, "attribute");
    std::stable_sort(a.begin(), a.end(), [&](const Value& x, const Value& y) {
      return attr ? less_than(attribute(x, attr->str()), attribute(y, attr->str())) : less_than(x, y);
    });
    if (rev && rev->truthy()) std::reverse(a.begin(), a.end());
    return Value(std::move(a));
  }
  if (name == "sum") {
    Value total((int64_t)0);
    for (const Value& x : items_of(v))
      total = total.kind == Value::Kind::Int && x.kind == Value::Kind::Int ? Value(total.i + x.i)
                                                                            : Value(total.as_double() + x.as_double());
    return total;
  }
  if (name == "min" || name == "max") {
    const Array a = items_of(v);
    if (a.empty()) return Value();
    return *std::min_element(a.begin(), a.end(), [&](const Value& x, const Value& y) {
      return name == "min" ? less_than(x, y) : less_than(y, x);
    });
  }
  if (name == "indent") {
    const Value* w = arg(args, kw, 0, "width");
    const Value* first = arg(args, kw, 1, "first");
    const std::string pad(w ? (size_t)w->i : 4, ' ');
    const std::string s = v.str();
    std::string out = first && first->truthy() ? pad : "";
    for (size_t k = 0; k < s.size(); k++) {
      out += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
    }
    return Value(out);
  }
  if (name == "dictsort") {
    Value pairs = items_pairs(v);
    std::stable_sort(pairs.arr->begin(), pairs.arr->end(),
                     [](const Value& x, const Value& y) { return (*x.arr)[0].s < (*y.arr)[0].s; });
    return pairs;
  }
  if (name == "wordcount") return Value((int64_t)split(v.str(), {}).arr->size());
  throw Error("unknown filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  using K = Value::Kind;
  auto need = [&](size_t n) {
    if (args.size() < n) throw Error("test '" + name + "' needs an argument");
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::Int;
  if (name == "float") return v.kind == K::Float;
  if (name == "boolean") return v.kind == K::Bool;
  if (name == "true") return v.kind == K::Bool && v.b;
  if (name == "false") return v.kind == K::Bool && !v.b;
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.kind == K::Function;
  if (name == "odd") return v.i % 2 != 0;
  if (name == "even") return v.i % 2 == 0;
  if (name == "lower") return v.is_string() && lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && upper(v.s) == v.s;
  if (name == "divisibleby") return need(1), args[0].i != 0 && (args[0].i == -1 || v.i % args[0].i == 0);
  if (name == "equalto" || name == "eq" || name == "sameas" || name == "==") return need(1), v == args[0];
  if (name == "ne" || name == "!=") return need(1), v != args[0];
  if (name == "lt" || name == "<") return need(1), less_than(v, args[0]);
  if (name == "gt" || name == ">") return need(1), less_than(args[0], v);
  if (name == "le" || name == "<=") return need(1), !less_than(args[0], v);
  if (name == "ge" || name == ">=") return need(1), !less_than(v, args[0]);
  if (name == "in") {
    need(1);
    const Array a = items_of(args[0]);
    if (args[0].is_string()) return v.is_string() && args[0].s.find(v.s) != std::string::npos;
    return std::find(a.begin(), a.end(), v) != a.end();
  }
  throw Error("unknown test '" + name + "'");
}

bool has_method(const Value& obj, const std::string& name) {
  static const std::vector<std::string> str_methods = {
      "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower", "title",
      "capitalize", "replace", "find", "count", "join", "format", "rsplit", "splitlines", "isdigit", "isspace"};
  static const std::vector<std::string> list_methods = {"append", "pop", "index", "count", "insert", "extend"};
  static const std::vector<std::string> dict_methods = {"get", "items", "keys", "values", "update", "pop"};
  auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), name) != v.end(); };
  if (obj.is_string()) return in(str_methods);
  if (obj.is_array()) return in(list_methods);
  if (obj.is_object()) return in(dict_methods);
  return false;
}

Value call_method(const Value& obj, const std::string& name, Args& args, Kwargs& kw) {
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (name == "strip") return Value(strip(s, chars_arg(args), true, true));
    if (name == "lstrip") return Value(strip(s, chars_arg(args), true, false));
    if (name == "rstrip") return Value(strip(s, chars_arg(args), false, true));
    if (name == "split") return split(s, args);
    if (name == "rsplit" && args.size() <= 1) return split(s, args);
    if (name == "splitlines") {
      Array out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find('\n', pos);
        if (e == std::string::npos) e = s.size();
        out.emplace_back(strip(s.substr(pos, e - pos), "\r", false, true));
        pos = e + 1;
      }
      return Value(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
      if (args.empty()) throw Error(name + "() needs an argument");
      Array options = args[0].is_array() ? *args[0].arr : Array{args[0]};
      for (const Value& o : options) {
        const std::string& p = o.s;
        if (p.size() <= s.size() && (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                                           : s.compare(s.size() - p.size(), p.size(), p) == 0))
          return Value(true);
      }
      return Value(false);
    }
    if (name == "upper") return Value(upper(s));
    if (name == "lower") return Value(lower(s));
    if (name == "title") return Value(title(s));
    if (name == "capitalize") return Value(capitalize(s));
    if (name == "replace") {
      if (args.size() < 2) throw Error("replace() needs two arguments");
      return Value(replace_all(s, args[0].str(), args[1].str(), args.size() > 2 ? args[2].i : -1));
    }
    if (name == "find") {
      if (args.empty()) throw Error("find() needs an argument");
      const size_t at = s.find(args[0].str());
      return Value(at == std::string::npos ? (int64_t)-1 : (int64_t)at);
    }
    if (name == "count") {
      if (args.empty() || args[0].str().empty()) throw Error("count() needs a non-empty argument");
      int64_t n = 0;
      for (size_t at = s.find(args[0].s); at != std::string::npos; at = s.find(args[0].s, at + args[0].s.size())) n++;
      return Value(n);
    }
    if (name == "join") {
      std::string out;
      const Array a = args.empty() ? Array{} : items_of(args[0]);
      for (size_t k = 0; k < a.size(); k++) out += (k ? s : "") + a[k].str();
      return Value(out);
    }
    if (name == "isdigit") return Value(!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit));
    if (name == "isspace") return Value(!s.empty() && strip(s, kWhitespace, true, true).empty());
    if (name == "format") {  // positional {} only
      std::string out;
      size_t next = 0;
      for (size_t k = 0; k < s.size(); k++) {
        if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '}') {
          out += next < args.size() ? args[next++].str() : "";
          k++;
        } else {
          out += s[k];
        }
      }
      return Value(out);
    }
  }
  if (obj.is_array()) {
    Array& a = *obj.arr;
    if (name == "append") {
      if (args.empty()) throw Error("append() needs an argument");
      a.push_back(args[0]);
      return Value::none();
    }
    if (name == "extend") {
      for (const Value& x : args.empty() ? Array{} : items_of(args[0])) a.push_back(x);
      return Value::none();
    }
    if (name == "insert") {
      if (args.size() < 2) throw Error("insert() needs two arguments");
      const int64_t at = std::clamp<int64_t>(args[0].i < 0 ? args[0].i + (int64_t)a.size() : args[0].i, 0, (int64_t)a.size());
      a.insert(a.begin() + at, args[1]);
      return Value::none();
    }
    if (name == "pop") {
      if (a.empty()) throw Error("pop from an empty list");
      int64_t at = args.empty() ? (int64_t)a.size() - 1 : args[0].i;
      if (at < 0) at += (int64_t)a.size();
      if (at < 0 || at >= (int64_t)a.size()) throw Error("pop index out of range");
      Value v = a[(size_t)at];
      a.erase(a.begin() + at);
      return v;
    }
    if (name == "index") {
      for (size_t k = 0; k < a.size(); k++)
        if (!args.empty() && a[k] == args[0]) return Value((int64_t)k);
      throw Error("value is not in the list");
    }
    if (name == "count") return Value((int64_t)std::count(a.begin(), a.end(), args.empty() ? Value() : args[0]));
  }
  if (obj.is_object()) {
    if (name == "get") {
      if (args.empty()) throw Error("get() needs a key");
      const Value v = obj.get(args[0].str());
      return v.is_undefined() ? (args.size() > 1 ? args[1] : Value::none()) : v;
    }
    if (name == "items") return items_pairs(obj);
    if (name == "keys") return Value(items_of(obj));
    if (name == "values") {
      Array out;
      for (const auto& [k, x] : *obj.obj) out.push_back(x);
      return Value(std::move(out));
    }
    if (name == "update") {
      Value target = obj;  // shares the dict: update() changes it in place
      if (!args.empty() && args[0].is_object())
        for (const auto& [k, x] : *args[0].obj) target.set(k, x);
      for (const auto& [k, x] : kw) target.set(k, x);
      return Value::none();
    }
    if (name == "pop") {
      if (args.empty()) throw Error("pop() needs a key");
      auto& o = *obj.obj;
      for (auto it = o.begin(); it != o.end(); ++it)
        if (it->first == args[0].str()) {
          Value v = it->second;
          o.erase(it);
          return v;
        }
      if (args.size() > 1) return args[1];
      throw Error("key '" + args[0].str() + "' not found");
    }
  }
  throw Error(std::string("a ") + obj.type_name() + " has no method '" + name + "'");
}

Object builtin_globals() {
  Object g;
  g.emplace_back("raise_exception", Value::function([](Args& a, Kwargs&) -> Value {
                   throw Error("template error: " + (a.empty() ? std::string("raise_exception") : a[0].str()));
                 }));
  g.emplace_back("range", Value::function([](Args& a, Kwargs&) -> Value {
                   if (a.empty() || a.size() > 3) throw Error("range() takes 1 to 3 arguments");
                   const int64_t start = a.size() > 1 ? a[0].i : 0, stop = a.size() > 1 ? a[1].i : a[0].i;
                   const int64_t step = a.size() > 2 ? a[2].i : 1;
                   if (step == 0) throw Error("range() step cannot be zero");
                   Array out;
                   for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
                     if (out.size() >= 1000000) throw Error("range() over a million items");
                     out.emplace_back(k);
                     if (__builtin_add_overflow(k, step, &k)) break;
                   }
                   return Value(std::move(out));
                 }));
  auto make_dict = [](Args& a, Kwargs& kw) -> Value {
    Value o{Object{}};
    if (!a.empty() && a[0].is_object())
      for (const auto& [k, x] : *a[0].obj) o.set(k, x);
    for (const auto& [k, x] : kw) o.set(k, x);
    return o;
  };
  g.emplace_back("namespace", Value::function(make_dict));
  g.emplace_back("dict", Value::function(make_dict));
  g.emplace_back("strftime_now", Value::function([](Args& a, Kwargs&) -> Value {
                   const std::time_t now = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   char buf[256];
                   const size_t n = std::strftime(buf, sizeof(buf), a.empty() ? "%Y-%m-%d" : a[0].str().c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  return g;
}

}  // namespace tandem::jinja
