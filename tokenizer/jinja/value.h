// Values of the Jinja subset that chat templates use: Python-like dynamic types with
// reference semantics for lists and dicts (so namespace() objects can be assigned through).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::jinja {

// Raised while rendering; render() turns it into a Status. Carries raise_exception() messages.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
struct Macro;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python dicts
// A callable value: positional args and keyword args.
using Function = std::function<Value(std::vector<Value>& args, std::vector<std::pair<std::string, Value>>& kwargs)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;
  std::shared_ptr<Function> fn;

  Value() = default;
  static Value none() { return with_kind(Kind::None); }
  Value(bool v) : kind(Kind::Bool), b(v) {}
  Value(int v) : kind(Kind::Int), i(v) {}
  Value(int64_t v) : kind(Kind::Int), i(v) {}
  Value(double v) : kind(Kind::Float), f(v) {}
  Value(std::string v) : kind(Kind::String), s(std::move(v)) {}
  Value(const char* v) : kind(Kind::String), s(v) {}
  Value(Array v) : kind(Kind::Array), arr(std::make_shared<Array>(std::move(v))) {}
  Value(Object v) : kind(Kind::Object), obj(std::make_shared<Object>(std::move(v))) {}
  static Value function(Function f) {
    Value v = with_kind(Kind::Function);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_string() const { return kind == Kind::String; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  double as_double() const { return kind == Kind::Float ? f : (double)i; }

  bool truthy() const;
  // Object member, or undefined.
  Value get(const std::string& key) const;
  void set(const std::string& key, Value v);  // object only
  // str(): what {{ }} prints; repr(): Python's repr, used inside lists and dicts.
  std::string str() const;
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent): transformers' tojson filter.
  std::string to_json(int indent = -1, bool sort_keys = false) const;
  const char* type_name() const;

 private:
  static Value with_kind(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

bool operator==(const Value& a, const Value& b);
inline bool operator!=(const Value& a, const Value& b) { return !(a == b); }
// Python ordering for numbers and strings; other pairs are an Error.
bool less_than(const Value& a, const Value& b);

}  // namespace tandem::jinja
