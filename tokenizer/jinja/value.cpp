#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace tandem::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(o));
    }
    default: return Value();
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

std::string quote_python(const std::string& s) {
  // Python prefers single quotes unless the text holds one and no double quote.
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += (char)c;  // ensure_ascii=False: UTF-8 passes through
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append((size_t)(indent * d), ' ');
  };
  // json.dumps separators: ", " and ": " without indent, "," and ": " with it.
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; break;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.i); break;
    case Value::Kind::Float: {
      const std::string r = float_repr(v.f);
      out += r == "nan" ? "NaN" : r == "inf" ? "Infinity" : r == "-inf" ? "-Infinity" : r;
      break;
    }
    case Value::Kind::String: json_string(out, v.s); break;
    case Value::Kind::Array:
      if (v.arr->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      for (size_t k = 0; k < v.arr->size(); k++) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_dump(out, (*v.arr)[k], indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += ']';
      break;
    case Value::Kind::Object: {
      if (v.obj->empty()) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.obj) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); k++) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_string(out, items[k]->first);
        out += ": ";
        json_dump(out, items[k]->second, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += '}';
      break;
    }
    case Value::Kind::Function: throw Error("a function is not JSON serializable");
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::String: return s;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return float_repr(f);
    case Kind::String: return quote_python(s);
    case Kind::Array: {
      std::string out = "[";
      for (size_t k = 0; k < arr->size(); k++) out += (k ? ", " : "") + (*arr)[k].repr();
      return out + "]";
    }
    case Kind::Object: {
      std::string out = "{";
      for (size_t k = 0; k < obj->size(); k++)
        out += (k ? ", " : "") + quote_python((*obj)[k].first) + ": " + (*obj)[k].second.repr();
      return out + "}";
    }
    case Kind::Function: return "<function>";
  }
  return "";
}

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  json_dump(out, *this, indent, sort_keys, 0);
  return out;
}

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

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if ((a.kind == K::Bool && b.is_number()) || (a.is_number() && b.kind == K::Bool))
    return (a.kind == K::Bool ? (double)a.b : a.as_double()) == (b.kind == K::Bool ? (double)b.b : b.as_double());
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::Bool: return a.b == b.b;
    case K::String: return a.s == b.s;
    case K::Array: return *a.arr == *b.arr;
    case K::Object: {
      if (a.obj->size() != b.obj->size()) return false;
      for (const auto& [k, v] : *a.obj)
        if (b.get(k) != v || b.get(k).is_undefined()) return false;
      return true;
    }
    case K::Function: return a.fn == b.fn;
    default: return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_array() && b.is_array())
    return std::lexicographical_compare(a.arr->begin(), a.arr->end(), b.arr->begin(), b.arr->end(), less_than);
  throw Error(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
}

}  // namespace tandem::jinja
