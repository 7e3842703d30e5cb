#include "chat/jinja/builtins.h"

#include <string.h>  // memmem

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>

#include "tokenizer/utf8.h"

namespace tandem::jinja {

namespace {

const std::string kWhitespace = " \t\n\r\f\v";

// The byte length of the character at s[i], as utf8_chars() splits (an invalid byte alone).
size_t char_len(const std::string& s, size_t i) {
  const size_t len = (size_t)utf8_seq_len((unsigned char)s[i]);
  if (len == 1 || i + len > s.size()) return 1;
  for (size_t k = 1; k < len; k++)
    if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 1;
  return len;
}

size_t char_count(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += char_len(s, i)) n++;
  return n;
}

// Bytes [b, e) of a string value, with their taint.
Value substr(const Value& s, size_t b, size_t e) {
  Value out(s.s.substr(b, e - b));
  if (!s.taint.empty()) out.taint = taint_slice(s.taint, b, e);
  return out;
}

Value strip(const Value& s, const std::string& chars, bool left, bool right) {
  size_t a = 0, b = s.s.size();
  if (left)
    while (a < b && chars.find(s.s[a]) != std::string::npos) a++;
  if (right)
    while (b > a && chars.find(s.s[b - 1]) != std::string::npos) b--;
  return substr(s, a, b);
}

std::string chars_arg(const Args& args, Budget& budget) {
  return args.empty() || args[0].is_none() ? kWhitespace : to_str(args[0], budget).s;
}

// Case changes keep every byte in place, so the taint stays as it is.
template <typename Fn>
Value map_bytes(Value s, Fn fn) {
  for (char& c : s.s) c = fn(c);
  return s;
}
char upper_char(char c) { return (char)std::toupper((unsigned char)c); }
char lower_char(char c) { return (char)std::tolower((unsigned char)c); }
Value upper(const Value& s) { return map_bytes(s, upper_char); }
Value lower(const Value& s) { return map_bytes(s, lower_char); }
Value capitalize(const Value& s) {
  Value out = lower(s);
  if (!out.s.empty()) out.s[0] = upper_char(out.s[0]);
  return out;
}
Value title(const Value& s) {
  Value out = s;
  bool start = true;
  for (char& c : out.s) {
    const bool alpha = std::isalpha((unsigned char)c);
    c = alpha ? (start ? upper_char(c) : lower_char(c)) : c;
    start = !alpha;
  }
  return out;
}

Value replace_all(const Value& s, const Value& from, const Value& to, int64_t count, Budget& budget) {
  if (from.s.empty()) return s;
  StringBuilder out(budget, "replace() result");
  size_t pos = 0, hit;
  while (count != 0 && (hit = find_text(s.s, from.s, pos)) != std::string::npos) {
    budget.step();
    out.append_part(s, pos, hit);
    // Replacing request data (or what request data chose) gives request data.
    if (!from.taint.empty() || taint_overlaps(s.taint, hit, hit + from.s.size())) out.append_data(to.s);
    else out.append_str(to);
    pos = hit + from.s.size();
    count--;
  }
  out.append_part(s, pos, s.s.size());
  return out.take();
}

// Python str.split: by runs of whitespace (no empty pieces) or by a separator.
Value split(const Value& s, const Args& args, Budget& budget) {
  Array out;
  auto add = [&](Value piece) {
    budget.step();
    budget.grow_list(out.size() + 1, "split() result");
    out.push_back(std::move(piece));
  };
  const int64_t maxsplit = args.size() > 1 ? args[1].i : -1;
  const std::string& t = s.s;
  if (args.empty() || args[0].is_none()) {
    size_t k = 0;
    int64_t n = 0;
    while (k < t.size()) {
      while (k < t.size() && kWhitespace.find(t[k]) != std::string::npos) k++;
      if (k >= t.size()) break;
      if (maxsplit >= 0 && n == maxsplit) {
        add(strip(substr(s, k, t.size()), kWhitespace, false, true));
        break;
      }
      size_t e = k;
      while (e < t.size() && kWhitespace.find(t[e]) == std::string::npos) e++;
      add(substr(s, k, e));
      n++;
      k = e;
    }
    return Value(std::move(out));
  }
  const std::string sep = to_str(args[0], budget).s;
  if (sep.empty()) throw Error("split(): empty separator");
  size_t pos = 0, hit;
  int64_t n = 0;
  while ((maxsplit < 0 || n < maxsplit) && (hit = find_text(t, sep, pos)) != std::string::npos) {
    add(substr(s, pos, hit));
    pos = hit + sep.size();
    n++;
  }
  add(substr(s, pos, t.size()));
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

// A dict's key as a string value: request data when the dict came from the request.
Value key_value(const Value& dict, const std::string& key) {
  return dict.data ? Value::data_string(key) : Value(key);
}

// attribute="a.b" lookups as used by map/selectattr/sort/join.
Value attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string key = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_array() && !key.empty() && key.size() < 19 && std::all_of(key.begin(), key.end(), ::isdigit)) {
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

Value items_pairs(const Value& v, Budget& budget) {
  Array out;
  if (v.is_object()) {
    budget.step((int64_t)v.obj->size());
    budget.allocate_items(v.obj->size() * 3, "items() result");  // the list and each pair
    for (const auto& [k, x] : *v.obj) out.emplace_back(Array{key_value(v, k), x});
  }
  return Value(std::move(out));
}

// int(x) as Python truncates; a float outside int64 (or NaN) is an error, not undefined behaviour.
int64_t to_int(const Value& v) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Float) {
    if (!(v.f > -9.2e18 && v.f < 9.2e18)) throw Error("int(): " + v.scalar_str() + " is out of range");
    return (int64_t)v.f;
  }
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

Value select(const Value& seq, Args& args, bool by_attr, bool keep, Budget& budget) {
  // select(test, args...) / selectattr(attr, test, args...); without a test, truthiness.
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty()) throw Error("selectattr needs an attribute");
    attr = to_str(args[k++], budget).s;
  }
  std::string test = k < args.size() ? to_str(args[k++], budget).s : "";
  Args rest(args.begin() + (long)std::min(k, args.size()), args.end());
  Array out;
  for (const Value& x : items_of(seq, budget)) {
    budget.step();
    const Value target = by_attr ? attribute(x, attr) : x;
    const bool ok = test.empty() ? target.truthy() : apply_test(test, target, rest, budget);
    if (ok == keep) out.push_back(x);
  }
  return Value(std::move(out));
}

Value join(const Value& seq, const Value* sep, const Value* attr, Budget& budget) {
  StringBuilder out(budget, "join() result");
  const Value sep_str = sep ? to_str(*sep, budget) : Value(std::string());
  const std::string attr_name = attr ? to_str(*attr, budget).s : "";
  bool first = true;
  for (const Value& x : items_of(seq, budget)) {
    budget.step();
    if (!first) out.append_str(sep_str);
    first = false;
    out.append_str(to_str(attr ? attribute(x, attr_name) : x, budget));
  }
  return out.take();
}

// Python str.format with positional {} only.
Value format(const Value& s, const Args& args, Budget& budget) {
  StringBuilder out(budget, "format() result");
  size_t next = 0, run = 0;
  for (size_t k = 0; k < s.s.size(); k++) {
    if (s.s[k] == '{' && k + 1 < s.s.size() && s.s[k + 1] == '}') {
      budget.step();
      out.append_part(s, run, k);
      if (next < args.size()) out.append_str(to_str(args[next++], budget));
      run = k + 2;
      k++;
    }
  }
  out.append_part(s, run, s.s.size());
  return out.take();
}

Value indent(const Value& s, const Value* width, const Value* first, Budget& budget) {
  const int64_t w = width ? width->i : 4;
  if (w < 0) throw Error("indent width cannot be negative");
  StringBuilder out(budget, "indent() result");
  if (first && first->truthy()) out.append_repeat(' ', (size_t)w);
  size_t run = 0;
  for (size_t k = 0; k < s.s.size(); k++) {
    if (s.s[k] == '\n' && k + 1 < s.s.size() && s.s[k + 1] != '\n') {
      budget.step();
      out.append_part(s, run, k + 1);
      out.append_repeat(' ', (size_t)w);
      run = k + 1;
    }
  }
  out.append_part(s, run, s.s.size());
  return out.take();
}

Value sum(const Value& seq, Budget& budget) {
  Value total((int64_t)0);
  for (const Value& x : items_of(seq, budget)) {
    budget.step();
    int64_t exact = 0;
    if (total.kind == Value::Kind::Int && x.kind == Value::Kind::Int) {
      if (__builtin_add_overflow(total.i, x.i, &exact)) throw Error("sum(): integer overflow");
      total = Value(exact);
    } else {
      total = Value(total.as_double() + x.as_double());
    }
  }
  return total;
}

Value python_string_count(const Value& s, const Args& args, Budget& budget) {
  if (args.empty()) throw Error("count() needs a non-empty argument");
  const std::string needle = to_str(args[0], budget).s;
  if (needle.empty()) throw Error("count() needs a non-empty argument");
  int64_t n = 0;
  for (size_t at = find_text(s.s, needle); at != std::string::npos; at = find_text(s.s, needle, at + needle.size())) {
    budget.step();
    n++;
  }
  return Value(n);
}

}  // namespace

size_t find_text(const std::string& haystack, const std::string& needle, size_t from) {
  if (from > haystack.size()) return std::string::npos;
  if (needle.empty()) return from;
  // glibc's memmem is linear (two-way matching); std::string::find is not, for long needles.
  const void* hit = memmem(haystack.data() + from, haystack.size() - from, needle.data(), needle.size());
  return hit ? (size_t)((const char*)hit - haystack.data()) : std::string::npos;
}

Array items_of(const Value& v, Budget& budget) {
  Array out;
  if (v.is_array()) {
    budget.allocate_items(v.arr->size(), "list");
    budget.step((int64_t)v.arr->size());
    return *v.arr;
  }
  if (v.is_object()) {
    budget.allocate_items(v.obj->size(), "list of keys");
    budget.step((int64_t)v.obj->size());
    out.reserve(v.obj->size());
    for (const auto& kv : *v.obj) out.push_back(key_value(v, kv.first));
  } else if (v.is_string()) {
    const size_t n = char_count(v.s);
    budget.allocate_items(n, "list of characters");
    budget.step((int64_t)n);
    out.reserve(n);
    for (size_t i = 0; i < v.s.size();) {
      const size_t len = char_len(v.s, i);
      out.push_back(substr(v, i, i + len));
      i += len;
    }
  } else if (!v.is_undefined() && !v.is_none()) {
    throw Error(std::string("a ") + v.type_name() + " is not iterable");
  }
  return out;
}

Value slice(const Value& obj, const Value* lo, const Value* hi, const Value* step, Budget& budget) {
  const bool is_str = obj.is_string();
  if (!is_str && !obj.is_array()) throw Error(std::string("cannot slice a ") + obj.type_name());
  // A string is sliced by code point: starts[k] is where character k begins (a pure-ASCII
  // string needs no table).
  std::vector<size_t> starts;
  int64_t n = 0;
  if (is_str) {
    const bool ascii = std::all_of(obj.s.begin(), obj.s.end(), [](char c) { return (unsigned char)c < 0x80; });
    if (!ascii) {
      budget.spend(obj.s.size() * sizeof(size_t));
      for (size_t i = 0; i < obj.s.size(); i += char_len(obj.s, i)) starts.push_back(i);
    }
    n = ascii ? (int64_t)obj.s.size() : (int64_t)starts.size();
  } else {
    n = (int64_t)obj.arr->size();
  }
  auto byte_at = [&](int64_t k) { return k >= n ? obj.s.size() : starts.empty() ? (size_t)k : starts[(size_t)k]; };
  const int64_t st = step && !step->is_none() ? step->i : 1;
  if (st == 0) throw Error("slice step cannot be zero");
  auto norm = [&](const Value* v, int64_t def) -> int64_t {
    if (!v || v->is_none()) return def;
    int64_t x = v->i;
    if (x < 0) x += n;  // cannot overflow: n >= 0
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t a = norm(lo, st > 0 ? 0 : n - 1), b = norm(hi, st > 0 ? n : -1);
  if (is_str && st == 1) return a < b ? substr(obj, byte_at(a), byte_at(b)) : Value(std::string());
  // The number of items, computed before any is made.
  const __int128 span = st > 0 ? (__int128)b - a : (__int128)a - b;
  const __int128 mag = st > 0 ? (__int128)st : -(__int128)st;
  const size_t count = span <= 0 ? 0 : (size_t)((span + mag - 1) / mag);
  budget.step((int64_t)count);
  if (is_str) {
    StringBuilder out(budget, "string slice");
    for (size_t j = 0; j < count; j++) {
      const int64_t k = (int64_t)((__int128)a + (__int128)j * st);
      out.append_part(obj, byte_at(k), byte_at(k + 1));
    }
    return out.take();
  }
  budget.allocate_items(count, "list slice");
  Array out;
  out.reserve(count);
  for (size_t j = 0; j < count; j++) out.push_back((*obj.arr)[(size_t)((__int128)a + (__int128)j * st)]);
  return Value(std::move(out));
}

namespace {

// first / last of a list, of a dict's keys or of a string's characters.
Value first_or_last(bool first, const Value& v, Budget& budget) {
  if (v.is_array()) return v.arr->empty() ? Value() : (first ? v.arr->front() : v.arr->back());
  if (v.is_object()) return v.obj->empty() ? Value() : key_value(v, first ? v.obj->front().first : v.obj->back().first);
  if (v.is_string()) {
    if (v.s.empty()) return Value();
    if (first) return substr(v, 0, char_len(v.s, 0));
    size_t last = 0;
    for (size_t i = 0; i < v.s.size(); i += char_len(v.s, i)) last = i;
    return substr(v, last, v.s.size());
  }
  items_of(v, budget);  // the error for what is not iterable
  return Value();
}

// map(attribute=...) or map('filter', args...).
Value map_items(const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  const Value* attr = kwarg(kw, "attribute");
  const std::string attr_name = attr ? to_str(*attr, budget).s : "";
  const std::string filter = !attr && !args.empty() ? to_str(args[0], budget).s : "";
  if (!attr && args.empty()) throw Error("map needs a filter name or attribute=");
  Args rest(args.begin() + (attr ? 0 : 1), args.end());
  Array out;
  for (const Value& x : items_of(v, budget)) {
    budget.step();
    if (attr) {
      out.push_back(attribute(x, attr_name));
    } else {
      const Budget::Nest nest(budget);  // map('map', 'map', ...) nests
      Args filter_args = rest;
      Kwargs none;
      out.push_back(apply_filter(filter, x, filter_args, none, budget));
    }
  }
  return Value(std::move(out));
}

Value sort_items(const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  Array a = items_of(v, budget);
  const Value* rev = arg(args, kw, 0, "reverse");
  const Value* attr = kwarg(kw, "attribute");
  const std::string attr_name = attr ? to_str(*attr, budget).s : "";
  std::stable_sort(a.begin(), a.end(), [&](const Value& x, const Value& y) {
    return attr ? less_than(attribute(x, attr_name), attribute(y, attr_name), budget) : less_than(x, y, budget);
  });
  if (rev && rev->truthy()) std::reverse(a.begin(), a.end());
  return Value(std::move(a));
}

// apply_filter's filters in groups by what they work on. A group answers nothing for a name
// it does not know, and apply_filter asks the next one.
using FilterGroup = std::optional<Value> (*)(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget& budget);

std::optional<Value> string_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  if (name == "trim") return strip(to_str(v, budget), chars_arg(args, budget), true, true);
  if (name == "upper") return upper(to_str(v, budget));
  if (name == "lower") return lower(to_str(v, budget));
  if (name == "capitalize") return capitalize(to_str(v, budget));
  if (name == "title") return title(to_str(v, budget));
  if (name == "string") return to_str(v, budget);
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") return v;  // no autoescape
  if (name == "replace") {
    if (args.size() < 2) throw Error("replace needs two arguments");
    return replace_all(to_str(v, budget), to_str(args[0], budget), to_str(args[1], budget), args.size() > 2 ? args[2].i : -1,
                       budget);
  }
  if (name == "indent") return indent(to_str(v, budget), arg(args, kw, 0, "width"), arg(args, kw, 1, "first"), budget);
  if (name == "wordcount") return Value((int64_t)split(to_str(v, budget), {}, budget).arr->size());
  if (name == "tojson") {
    const Value* ind = arg(args, kw, 0, "indent");
    const Value* sort = kwarg(kw, "sort_keys");
    return to_json(v, ind && !ind->is_none() ? ind->i : -1, sort && sort->truthy(), budget);
  }
  return std::nullopt;
}

std::optional<Value> number_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget&) {
  if (name == "int") return Value(to_int(v));
  if (name == "float") return Value(v.is_number() ? v.as_double() : v.is_string() ? std::atof(v.s.c_str()) : 0.0);
  if (name == "abs") return v.kind == Value::Kind::Int && v.i != INT64_MIN ? Value((int64_t)std::llabs(v.i)) : Value(std::fabs(v.as_double()));
  if (name == "round") {
    const Value* p = arg(args, kw, 0, "precision");
    const double scale = std::pow(10.0, p ? (double)p->i : 0.0);
    return Value(std::round(v.as_double() * scale) / scale);
  }
  return std::nullopt;
}

// Filters on any value, or on a whole collection: its size, ends, default, items.
std::optional<Value> value_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value((int64_t)char_count(v.s));
    if (v.is_array()) return Value((int64_t)v.arr->size());
    if (v.is_object()) return Value((int64_t)v.obj->size());
    if (v.is_undefined()) return Value((int64_t)0);
    throw Error(std::string("a ") + v.type_name() + " has no length");
  }
  if (name == "first" || name == "last") return first_or_last(name == "first", v, budget);
  if (name == "default" || name == "d") {
    const Value* def = arg(args, kw, 0, "default_value");
    const Value* boolean = arg(args, kw, 1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_default ? (def ? *def : Value(std::string())) : v;
  }
  if (name == "items") return items_pairs(v, budget);
  if (name == "dictsort") {
    Value pairs = items_pairs(v, budget);
    budget.step((int64_t)pairs.arr->size());
    std::stable_sort(pairs.arr->begin(), pairs.arr->end(),
                     [](const Value& x, const Value& y) { return (*x.arr)[0].s < (*y.arr)[0].s; });
    return pairs;
  }
  return std::nullopt;
}

// Filters over a sequence's items.
std::optional<Value> items_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  if (name == "list") return Value(items_of(v, budget));
  if (name == "reverse") {
    if (v.is_string()) {
      const Value backwards((int64_t)-1);
      return slice(v, nullptr, nullptr, &backwards, budget);
    }
    Array a = items_of(v, budget);
    std::reverse(a.begin(), a.end());
    return Value(std::move(a));
  }
  if (name == "join") return join(v, arg(args, kw, 0, "d"), arg(args, kw, 1, "attribute"), budget);
  if (name == "map") return map_items(v, args, kw, budget);
  if (name == "select") return select(v, args, false, true, budget);
  if (name == "reject") return select(v, args, false, false, budget);
  if (name == "selectattr") return select(v, args, true, true, budget);
  if (name == "rejectattr") return select(v, args, true, false, budget);
  if (name == "unique") {
    Array out;
    for (const Value& x : items_of(v, budget)) {
      bool seen = false;
      for (const Value& y : out)
        if ((seen = equals(x, y, budget))) break;
      if (!seen) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "sort") return sort_items(v, args, kw, budget);
  if (name == "sum") return sum(v, budget);
  if (name == "min" || name == "max") {
    const Array a = items_of(v, budget);
    if (a.empty()) return Value();
    return *std::min_element(a.begin(), a.end(), [&](const Value& x, const Value& y) {
      return name == "min" ? less_than(x, y, budget) : less_than(y, x, budget);
    });
  }
  return std::nullopt;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kw, Budget& budget) {
  for (FilterGroup group : {string_filter, number_filter, value_filter, items_filter})
    if (std::optional<Value> r = group(name, v, args, kw, budget)) return std::move(*r);
  throw Error("unknown filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, Args& args, Budget& budget) {
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
  if (name == "lower") return v.is_string() && lower(v).s == v.s;
  if (name == "upper") return v.is_string() && upper(v).s == v.s;
  if (name == "divisibleby") return need(1), args[0].i != 0 && (args[0].i == -1 || v.i % args[0].i == 0);
  if (name == "equalto" || name == "eq" || name == "sameas" || name == "==") return need(1), equals(v, args[0], budget);
  if (name == "ne" || name == "!=") return need(1), !equals(v, args[0], budget);
  if (name == "lt" || name == "<") return need(1), less_than(v, args[0], budget);
  if (name == "gt" || name == ">") return need(1), less_than(args[0], v, budget);
  if (name == "le" || name == "<=") return need(1), !less_than(args[0], v, budget);
  if (name == "ge" || name == ">=") return need(1), !less_than(v, args[0], budget);
  if (name == "in") {
    need(1);
    if (args[0].is_string()) return v.is_string() && find_text(args[0].s, v.s) != std::string::npos;
    for (const Value& x : items_of(args[0], budget))
      if (equals(x, v, budget)) return true;
    return false;
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

namespace {

Value call_string_method(const Value& obj, const std::string& name, Args& args, Budget& budget) {
  const std::string& s = obj.s;
  if (name == "strip") return strip(obj, chars_arg(args, budget), true, true);
  if (name == "lstrip") return strip(obj, chars_arg(args, budget), true, false);
  if (name == "rstrip") return strip(obj, chars_arg(args, budget), false, true);
  if (name == "split") return split(obj, args, budget);
  if (name == "rsplit" && args.size() <= 1) return split(obj, args, budget);
  if (name == "splitlines") {
    Array out;
    size_t pos = 0;
    while (pos < s.size()) {
      budget.step();
      budget.grow_list(out.size() + 1, "splitlines() result");
      size_t e = s.find('\n', pos);
      if (e == std::string::npos) e = s.size();
      out.push_back(strip(substr(obj, pos, e), "\r", false, true));
      pos = e + 1;
    }
    return Value(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    if (args.empty()) throw Error(name + "() needs an argument");
    const Array options = args[0].is_array() ? *args[0].arr : Array{args[0]};
    for (const Value& o : options) {
      budget.step();
      const std::string& p = o.s;
      if (p.size() <= s.size() && (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                                         : s.compare(s.size() - p.size(), p.size(), p) == 0))
        return Value(true);
    }
    return Value(false);
  }
  if (name == "upper") return upper(obj);
  if (name == "lower") return lower(obj);
  if (name == "title") return title(obj);
  if (name == "capitalize") return capitalize(obj);
  if (name == "replace") {
    if (args.size() < 2) throw Error("replace() needs two arguments");
    return replace_all(obj, to_str(args[0], budget), to_str(args[1], budget), args.size() > 2 ? args[2].i : -1, budget);
  }
  if (name == "find") {
    if (args.empty()) throw Error("find() needs an argument");
    const size_t at = find_text(s, to_str(args[0], budget).s);
    return Value(at == std::string::npos ? (int64_t)-1 : (int64_t)at);
  }
  if (name == "count") return python_string_count(obj, args, budget);
  if (name == "join") return args.empty() ? Value(std::string()) : join(args[0], &obj, nullptr, budget);
  if (name == "isdigit") return Value(!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit));
  if (name == "isspace") return Value(!s.empty() && s.find_first_not_of(kWhitespace) == std::string::npos);
  if (name == "format") return format(obj, args, budget);
  throw Error("a string has no method '" + name + "'");
}

Value call_list_method(const Value& obj, const std::string& name, Args& args, Budget& budget) {
  Array& a = *obj.arr;
  if (name == "append") {
    if (args.empty()) throw Error("append() needs an argument");
    budget.grow_list(a.size() + 1, "list");
    budget.note_insert(obj, args[0]);
    a.push_back(args[0]);
    return Value::none();
  }
  if (name == "extend") {
    if (args.empty()) return Value::none();
    const Array more = items_of(args[0], budget);  // a copy: l.extend(l) is fine
    budget.grow_list(a.size() + more.size(), "list");
    for (const Value& x : more) {
      budget.note_insert(obj, x);
      a.push_back(x);
    }
    return Value::none();
  }
  if (name == "insert") {
    if (args.size() < 2) throw Error("insert() needs two arguments");
    budget.step((int64_t)a.size());
    budget.grow_list(a.size() + 1, "list");
    budget.note_insert(obj, args[1]);
    const int64_t at = std::clamp<int64_t>(args[0].i < 0 ? args[0].i + (int64_t)a.size() : args[0].i, 0, (int64_t)a.size());
    a.insert(a.begin() + at, args[1]);
    return Value::none();
  }
  if (name == "pop") {
    if (a.empty()) throw Error("pop from an empty list");
    int64_t at = args.empty() ? (int64_t)a.size() - 1 : args[0].i;
    if (at < 0) at += (int64_t)a.size();
    if (at < 0 || at >= (int64_t)a.size()) throw Error("pop index out of range");
    budget.step((int64_t)a.size() - at);
    Value v = a[(size_t)at];
    a.erase(a.begin() + at);
    return v;
  }
  if (name == "index") {
    for (size_t k = 0; k < a.size(); k++)
      if (!args.empty() && equals(a[k], args[0], budget)) return Value((int64_t)k);
    throw Error("value is not in the list");
  }
  if (name == "count") {
    int64_t n = 0;
    const Value x = args.empty() ? Value() : args[0];
    for (const Value& y : a) n += equals(y, x, budget);
    return Value(n);
  }
  throw Error("a list has no method '" + name + "'");
}

Value call_dict_method(const Value& obj, const std::string& name, Args& args, Kwargs& kw, Budget& budget) {
  if (name == "get") {
    if (args.empty()) throw Error("get() needs a key");
    budget.step((int64_t)obj.obj->size());
    const Value v = obj.get(to_str(args[0], budget).s);
    return v.is_undefined() ? (args.size() > 1 ? args[1] : Value::none()) : v;
  }
  if (name == "items") return items_pairs(obj, budget);
  if (name == "keys") return Value(items_of(obj, budget));
  if (name == "values") {
    budget.step((int64_t)obj.obj->size());
    budget.allocate_items(obj.obj->size(), "values() result");
    Array out;
    for (const auto& [k, x] : *obj.obj) out.push_back(x);
    return Value(std::move(out));
  }
  if (name == "update") {
    Value target = obj;  // shares the dict: update() changes it in place
    auto put = [&](const std::string& k, const Value& x) {
      budget.step((int64_t)target.obj->size());
      budget.grow_list(target.obj->size() + 1, "dict");
      budget.note_insert(target, x);
      target.set(k, x);
    };
    if (!args.empty() && args[0].is_object()) {
      if (args[0].data) target.data = true;  // its keys are request data now
      const Object copy = *args[0].obj;  // d.update(d) is fine
      for (const auto& [k, x] : copy) put(k, x);
    }
    for (const auto& [k, x] : kw) put(k, x);
    return Value::none();
  }
  if (name == "pop") {
    if (args.empty()) throw Error("pop() needs a key");
    auto& o = *obj.obj;
    const std::string key = to_str(args[0], budget).s;
    budget.step((int64_t)o.size());
    for (auto it = o.begin(); it != o.end(); ++it)
      if (it->first == key) {
        Value v = it->second;
        o.erase(it);
        return v;
      }
    if (args.size() > 1) return args[1];
    throw Error("key '" + key + "' not found");
  }
  throw Error("a dict has no method '" + name + "'");
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, Args& args, Kwargs& kw, Budget& budget) {
  if (obj.is_string()) return call_string_method(obj, name, args, budget);
  if (obj.is_array()) return call_list_method(obj, name, args, budget);
  if (obj.is_object()) return call_dict_method(obj, name, args, kw, budget);
  throw Error(std::string("a ") + obj.type_name() + " has no method '" + name + "'");
}

}  // namespace tandem::jinja
