#include "chat/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "chat/jinja/budget.h"

namespace tandem::jinja {

namespace {

using Json = nlohmann::ordered_json;

Value from_json_at(const Json& j, int depth, int max_depth) {
  if (depth > max_depth)
    throw Error("message JSON nested deeper than " + std::to_string(max_depth) + " (max_nesting)");
  Value v;
  switch (j.type()) {
    case Json::value_t::null: v = Value::none(); break;
    case Json::value_t::boolean: v = Value(j.get<bool>()); break;
    case Json::value_t::number_integer: v = Value(j.get<int64_t>()); break;
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();  // past int64 it stays a number, as a float
      v = u <= (uint64_t)INT64_MAX ? Value((int64_t)u) : Value((double)u);
      break;
    }
    case Json::value_t::number_float: v = Value(j.get<double>()); break;
    case Json::value_t::string: return Value::data_string(j.get<std::string>());
    case Json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json_at(e, depth + 1, max_depth));
      v = Value(std::move(a));
      break;
    }
    case Json::value_t::object: {
      Object o;
      o.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json_at(it.value(), depth + 1, max_depth));
      v = Value(std::move(o));
      break;
    }
    default: break;
  }
  v.data = true;
  return v;
}

[[noreturn]] void too_deep(const Budget& budget) {
  throw Error("value nested deeper than " + std::to_string(budget.limits().max_nesting) + " (max_nesting)");
}

}  // namespace

Value Value::from_json(const Json& j, int max_depth) { return from_json_at(j, 0, max_depth); }

Value& Value::operator=(Value&& o) noexcept {
  if (this == &o) return *this;
  Value moved(std::move(o));  // o may live inside this value's own list
  release();
  kind = moved.kind;
  b = moved.b;
  data = moved.data;
  i = moved.i;
  f = moved.f;
  s = std::move(moved.s);
  taint = std::move(moved.taint);
  arr = std::move(moved.arr);
  obj = std::move(moved.obj);
  fn = std::move(moved.fn);
  return *this;
}

void Value::release() noexcept {
  fn.reset();
  if (!arr && !obj) return;
  if ((!arr || arr.use_count() > 1) && (!obj || obj.use_count() > 1)) {  // not the last owner
    arr.reset();
    obj.reset();
    return;
  }
  // The last owner: take every solely-owned list and dict below out of its parent before the
  // parent is destroyed, so destruction never recurses past one level.
  try {
    std::vector<std::shared_ptr<Array>> arrays;
    std::vector<std::shared_ptr<Object>> objects;
    auto take = [&](Value& v) {
      if (v.arr) {
        if (v.arr.use_count() == 1) arrays.push_back(std::move(v.arr));
        else v.arr.reset();
      }
      if (v.obj) {
        if (v.obj.use_count() == 1) objects.push_back(std::move(v.obj));
        else v.obj.reset();
      }
    };
    take(*this);
    while (!arrays.empty() || !objects.empty()) {
      if (!arrays.empty()) {
        const std::shared_ptr<Array> a = std::move(arrays.back());
        arrays.pop_back();
        for (Value& c : *a) take(c);
      } else {
        const std::shared_ptr<Object> o = std::move(objects.back());
        objects.pop_back();
        for (auto& kv : *o) take(kv.second);
      }
    }
  } catch (...) {  // no memory for the work list: plain destruction
    arr.reset();
    obj.reset();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s.empty();
    case Kind::Array: return !arr->empty();
    case Kind::Object: return !obj->empty();
    case Kind::Function: return true;
  }
  return false;
}

Value Value::get(const std::string& key) const {
  if (kind != Kind::Object) return Value();
  for (const auto& [k, v] : *obj)
    if (k == key) return v;
  return Value();
}

void Value::set(const std::string& key, Value v) {
  if (kind != Kind::Object) throw Error("cannot assign attribute '" + key + "' of a " + type_name());
  for (auto& [k, old] : *obj)
    if (k == key) {
      old = std::move(v);
      return;
    }
  obj->emplace_back(key, std::move(v));
}

namespace {

// Python's repr of a float: shortest text that reads back the same, with ".0" for integers.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; prec++) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Appends s with the bytes for which escape() gives a replacement replaced, in runs, so a long
// string is never copied whole before the size check.
template <typename EscapeFn>
void append_escaped(StringBuilder& out, const std::string& s, EscapeFn escape) {
  size_t run = 0;
  for (size_t k = 0; k < s.size(); k++) {
    const char* rep = escape((unsigned char)s[k]);
    if (!rep) continue;
    out.append(std::string_view(s).substr(run, k - run));
    out.append(rep);
    run = k + 1;
  }
  out.append(std::string_view(s).substr(run));
}

void quote_python(StringBuilder& out, const std::string& s) {
  // Python prefers single quotes unless the text holds one and no double quote.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  out.push_back(dq ? '"' : '\'');
  append_escaped(out, s, [dq](unsigned char c) -> const char* {
    switch (c) {
      case '\'': return dq ? nullptr : "\\'";
      case '"': return dq ? "\\\"" : nullptr;
      case '\\': return "\\\\";
      case '\n': return "\\n";
      case '\t': return "\\t";
      case '\r': return "\\r";
      default: return nullptr;
    }
  });
  out.push_back(dq ? '"' : '\'');
}

void json_string(StringBuilder& out, const std::string& s) {
  static const auto controls = [] {  // "\u00XX" for each control byte
    std::vector<std::string> t(32);
    for (int c = 0; c < 32; c++) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      t[c] = buf;
    }
    return t;
  }();
  out.push_back('"');
  append_escaped(out, s, [](unsigned char c) -> const char* {
    switch (c) {
      case '"': return "\\\"";
      case '\\': return "\\\\";
      case '\n': return "\\n";
      case '\r': return "\\r";
      case '\t': return "\\t";
      case '\b': return "\\b";
      case '\f': return "\\f";
      default: return c < 0x20 ? controls[c].c_str() : nullptr;  // ensure_ascii=False: UTF-8 passes through
    }
  });
  out.push_back('"');
}

void repr(StringBuilder& out, const Value& v, Budget& budget, int depth) {
  if (depth > budget.limits().max_nesting) too_deep(budget);
  budget.step();
  switch (v.kind) {
    case Value::Kind::String: quote_python(out, v.s); return;
    case Value::Kind::Array:
      out.push_back('[');
      for (size_t k = 0; k < v.arr->size(); k++) {
        if (k) out.append(", ");
        repr(out, (*v.arr)[k], budget, depth + 1);
      }
      out.push_back(']');
      return;
    case Value::Kind::Object:
      out.push_back('{');
      for (size_t k = 0; k < v.obj->size(); k++) {
        if (k) out.append(", ");
        quote_python(out, (*v.obj)[k].first);
        out.append(": ");
        repr(out, (*v.obj)[k].second, budget, depth + 1);
      }
      out.push_back('}');
      return;
    default: out.append(v.scalar_str()); return;
  }
}

void json_dump(StringBuilder& out, const Value& v, int64_t indent, bool sort_keys, Budget& budget, int depth) {
  if (depth > budget.limits().max_nesting) too_deep(budget);
  budget.step();
  auto newline = [&](int d) {
    if (indent < 0) return;
    size_t n = 0;
    if (__builtin_mul_overflow((size_t)indent, (size_t)d, &n) || n > budget.limits().max_value_bytes)
      throw Error("tojson indent " + std::to_string(indent) + " at depth " + std::to_string(d) +
                  " is over the limit of " + std::to_string(budget.limits().max_value_bytes) + " bytes (max_value_bytes)");
    out.push_back('\n');
    out.append_repeat(' ', n);
  };
  // json.dumps separators: ", " and ": " without indent, "," and ": " with it.
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out.append("null"); break;
    case Value::Kind::Bool: out.append(v.b ? "true" : "false"); break;
    case Value::Kind::Int: out.append(std::to_string(v.i)); break;
    case Value::Kind::Float: {
      const std::string r = float_repr(v.f);
      out.append(r == "nan" ? "NaN" : r == "inf" ? "Infinity" : r == "-inf" ? "-Infinity" : r);
      break;
    }
    case Value::Kind::String: json_string(out, v.s); break;
    case Value::Kind::Array:
      if (v.arr->empty()) {
        out.append("[]");
        break;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.arr->size(); k++) {
        if (k) out.append(item_sep);
        newline(depth + 1);
        json_dump(out, (*v.arr)[k], indent, sort_keys, budget, depth + 1);
      }
      newline(depth);
      out.push_back(']');
      break;
    case Value::Kind::Object: {
      if (v.obj->empty()) {
        out.append("{}");
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.obj) items.push_back(&kv);
      if (sort_keys) {
        budget.step((int64_t)items.size());
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      for (size_t k = 0; k < items.size(); k++) {
        if (k) out.append(item_sep);
        newline(depth + 1);
        json_string(out, items[k]->first);
        out.append(": ");
        json_dump(out, items[k]->second, indent, sort_keys, budget, depth + 1);
      }
      newline(depth);
      out.push_back('}');
      break;
    }
    case Value::Kind::Function: throw Error("a function is not JSON serializable");
  }
}

bool holds_data_at(const Value& v, Budget& budget, int depth) {
  if (depth > budget.limits().max_nesting) too_deep(budget);
  budget.step();
  if (v.data || !v.taint.empty()) return true;
  if (v.is_array())
    for (const Value& x : *v.arr)
      if (holds_data_at(x, budget, depth + 1)) return true;
  if (v.is_object())
    for (const auto& kv : *v.obj)
      if (holds_data_at(kv.second, budget, depth + 1)) return true;
  return false;
}

// Marks a printed form as data when the value holds any.
Value printed(StringBuilder& out, const Value& v, Budget& budget) {
  Value s = out.take();
  if (holds_data(v, budget)) s.taint = taint_whole(s.s.size());
  return s;
}

bool equals_at(const Value& a, const Value& b, Budget& budget, int depth) {
  using K = Value::Kind;
  if (depth > budget.limits().max_nesting) too_deep(budget);
  budget.step();
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if ((a.kind == K::Bool && b.is_number()) || (a.is_number() && b.kind == K::Bool))
    return (a.kind == K::Bool ? (double)a.b : a.as_double()) == (b.kind == K::Bool ? (double)b.b : b.as_double());
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::Bool: return a.b == b.b;
    case K::String: return a.s == b.s;
    case K::Array: {
      if (a.arr == b.arr) return true;  // as Python: a list is equal to itself
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); k++)
        if (!equals_at((*a.arr)[k], (*b.arr)[k], budget, depth + 1)) return false;
      return true;
    }
    case K::Object: {
      if (a.obj == b.obj) return true;
      if (a.obj->size() != b.obj->size()) return false;
      for (const auto& [k, v] : *a.obj) {
        budget.step((int64_t)b.obj->size());  // get() scans b's keys
        const Value other = b.get(k);
        if (other.is_undefined() || !equals_at(v, other, budget, depth + 1)) return false;
      }
      return true;
    }
    case K::Function: return a.fn == b.fn;
    default: return false;
  }
}

bool less_than_at(const Value& a, const Value& b, Budget& budget, int depth) {
  if (depth > budget.limits().max_nesting) too_deep(budget);
  budget.step();
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_array() && b.is_array()) {
    const Array &x = *a.arr, &y = *b.arr;
    for (size_t k = 0; k < x.size() && k < y.size(); k++) {
      if (less_than_at(x[k], y[k], budget, depth + 1)) return true;
      if (less_than_at(y[k], x[k], budget, depth + 1)) return false;
    }
    return x.size() < y.size();
  }
  throw Error(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
}

}  // namespace

std::string Value::scalar_str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return float_repr(f);
    case Kind::String: return s;
    case Kind::Array: return "[...]";
    case Kind::Object: return "{...}";
    case Kind::Function: return "<function>";
  }
  return "";
}

Value to_str(const Value& v, Budget& budget) {
  switch (v.kind) {
    case Value::Kind::String: return v;
    case Value::Kind::Array:
    case Value::Kind::Object: {
      StringBuilder out(budget, "printed value");
      repr(out, v, budget, 0);
      return printed(out, v, budget);
    }
    default: {
      std::string text = v.scalar_str();
      return v.data ? Value::data_string(std::move(text)) : Value(std::move(text));
    }
  }
}

Value to_json(const Value& v, int64_t indent, bool sort_keys, Budget& budget) {
  StringBuilder out(budget, "tojson output");
  json_dump(out, v, indent, sort_keys, budget, 0);
  return printed(out, v, budget);
}

bool holds_data(const Value& v, Budget& budget) { return holds_data_at(v, budget, 0); }
bool equals(const Value& a, const Value& b, Budget& budget) { return equals_at(a, b, budget, 0); }
bool less_than(const Value& a, const Value& b, Budget& budget) { return less_than_at(a, b, budget, 0); }

const char* Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::Array: return "list";
    case Kind::Object: return "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

}  // namespace tandem::jinja
