// Values of the Jinja subset that chat templates use: Python-like dynamic types with
// reference semantics for lists and dicts (so namespace() objects can be assigned through).
// A string carries its taint (which bytes came from request data); any other value carries a
// `data` flag when it came from the request's JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "chat/jinja/taint.h"

namespace tandem::jinja {

// Raised while rendering; render() turns it into a Status. Carries raise_exception() messages.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
class Budget;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python dicts
// A callable value: positional args and keyword args.
using Function = std::function<Value(std::vector<Value>& args, std::vector<std::pair<std::string, Value>>& kwargs)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Kind kind = Kind::Undefined;
  bool b = false;
  bool data = false;  // came from request JSON (a dict's keys are then data too)
  int64_t i = 0;
  double f = 0;
  std::string s;
  ByteSpans taint;  // String: the bytes of s that came from request data
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
  Value(std::string v, ByteSpans t) : kind(Kind::String), s(std::move(v)), taint(std::move(t)) {}
  Value(const char* v) : kind(Kind::String), s(v) {}
  Value(Array v) : kind(Kind::Array), arr(std::make_shared<Array>(std::move(v))) {}
  Value(Object v) : kind(Kind::Object), obj(std::make_shared<Object>(std::move(v))) {}
  static Value function(Function f) {
    Value v = with_kind(Kind::Function);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  // A string from request data: every byte tainted.
  static Value data_string(std::string v) {
    Value out(std::move(v));
    out.taint = taint_whole(out.s.size());
    return out;
  }
  // Request JSON as values: strings fully tainted, everything else flagged `data`. JSON nested
  // deeper than max_depth is an Error ("message JSON nested deeper than N"), not a stack overflow.
  static Value from_json(const nlohmann::ordered_json& j, int max_depth);

  // Lists and dicts may nest as deep as a template makes them (a[0] = [a[0]] in a loop): they
  // are torn down iteratively, never by recursion.
  ~Value() { release(); }
  Value(const Value&) = default;
  Value(Value&& o) noexcept = default;
  Value& operator=(const Value& o) {
    if (this != &o) *this = Value(o);
    return *this;
  }
  Value& operator=(Value&& o) noexcept;

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_string() const { return kind == Kind::String; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_container() const { return kind == Kind::Array || kind == Kind::Object; }
  double as_double() const { return kind == Kind::Float ? f : (double)i; }

  bool truthy() const;
  // Object member, or undefined.
  Value get(const std::string& key) const;
  void set(const std::string& key, Value v);  // object only
  // The text of a scalar (a string's own text, a number's digits); lists and dicts need
  // to_str() with a Budget.
  std::string scalar_str() const;
  const char* type_name() const;

 private:
  static Value with_kind(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  void release() noexcept;
};

// str(): what {{ }} prints, as a string Value with taint. A string keeps its taint; anything
// else prints Python's repr, all of it tainted when the value holds any request data.
Value to_str(const Value& v, Budget& budget);
// json.dumps(value, ensure_ascii=False, indent=indent): transformers' tojson filter; tainted
// as a whole when the value holds request data.
Value to_json(const Value& v, int64_t indent, bool sort_keys, Budget& budget);
// True when the value is, or holds, request data (a tainted string or a `data` value).
bool holds_data(const Value& v, Budget& budget);

// Python equality and ordering (numbers and strings; lists element-wise); other pairs are an
// Error. Each element compared is a step; nesting is bounded.
bool equals(const Value& a, const Value& b, Budget& budget);
bool less_than(const Value& a, const Value& b, Budget& budget);

}  // namespace tandem::jinja
