// The spending of one render against its Limits: steps, bytes, wall time, cancellation. Every
// loop in the interpreter and the builtins charges it, so a hostile template ends with an Error
// that names the limit it hit, within max_time.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "chat/jinja/limits.h"
#include "chat/jinja/value.h"

namespace tandem::jinja {

class Budget {
 public:
  explicit Budget(const Limits& limits)
      : limits_(limits), deadline_(std::chrono::steady_clock::now() + limits.max_time) {}
  // Lists and dicts that received a list or dict may be part of a reference cycle
  // (a.append(a)); emptying them breaks every cycle, so nothing a render made outlives it.
  ~Budget() {
    for (Value& v : mutated_) {
      if (v.arr) v.arr->clear();
      if (v.obj) v.obj->clear();
    }
  }
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  const Limits& limits() const { return limits_; }

  // n units of work (a statement, an expression, a loop iteration, an element a builtin
  // visits). The clock and the cancel flag are read every kClockEvery steps.
  void step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps)
      throw Error("template ran more than " + std::to_string(limits_.max_steps) + " steps (max_steps)");
    if (steps_ >= next_clock_check_) {
      next_clock_check_ = steps_ + kClockEvery;
      check_clock();
    }
  }
  void check_clock() const {
    if (limits_.cancel && limits_.cancel->load(std::memory_order_relaxed)) throw Error("template render cancelled");
    if (std::chrono::steady_clock::now() > deadline_)
      throw Error("template ran longer than " + std::to_string(limits_.max_time.count()) + " ms (max_time)");
  }

  // A string or list about to be `bytes` long; checked before it is allocated.
  void check_size(size_t bytes, const char* what) const {
    if (bytes > limits_.max_value_bytes)
      throw Error(std::string(what) + " would be " + std::to_string(bytes) + " bytes, over the limit of " +
                  std::to_string(limits_.max_value_bytes) + " (max_value_bytes)");
  }
  // Bytes created, toward max_total_bytes.
  void spend(size_t bytes) {
    spent_ += bytes;
    if (spent_ > limits_.max_total_bytes)
      throw Error("template created more than " + std::to_string(limits_.max_total_bytes) +
                  " bytes of values (max_total_bytes)");
  }
  void allocate(size_t bytes, const char* what) {
    check_size(bytes, what);
    spend(bytes);
  }
  // A list of n items: sizeof(Value) bytes each.
  void allocate_items(size_t n, const char* what) {
    if (n > limits_.max_value_bytes / sizeof(Value))
      throw Error(std::string(what) + " would hold " + std::to_string(n) + " items, over the limit of " +
                  std::to_string(limits_.max_value_bytes / sizeof(Value)) + " (max_value_bytes / " +
                  std::to_string(sizeof(Value)) + " bytes per item)");
    spend(n * sizeof(Value));
  }

  // The number of items a list is about to hold (a list that grows one item at a time).
  void grow_list(size_t new_size, const char* what) {
    if (new_size > limits_.max_value_bytes / sizeof(Value)) allocate_items(new_size, what);
    spend(sizeof(Value));
  }

  // One level of run-time nesting (an expression inside an expression, a statement inside a
  // statement, a macro call, a filter applied by map()): the C++ stack is bounded too.
  class Nest {
   public:
    explicit Nest(Budget& b) : b_(b) {
      if (++b_.depth_ > b_.max_run_depth()) {
        --b_.depth_;
        throw Error("template nesting deeper than " + std::to_string(b_.max_run_depth()) +
                    " levels at run time (4 x max_nesting)");
      }
    }
    ~Nest() { --b_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Budget& b_;
  };
  int max_run_depth() const { return limits_.max_nesting * 4; }

  // `container` received `item`: its string is a copy that lives on, so its bytes count; a list
  // or dict item is shared, and the container is remembered (see ~Budget).
  void note_insert(const Value& container, const Value& item) {
    spend(item.s.size() + item.taint.size() * sizeof(item.taint[0]));
    if (!item.is_container()) return;
    const void* key = container.arr ? (const void*)container.arr.get() : (const void*)container.obj.get();
    if (key && seen_.insert(key).second) mutated_.push_back(container);
  }

 private:
  static constexpr int64_t kClockEvery = 256;
  const Limits& limits_;
  std::chrono::steady_clock::time_point deadline_;
  int64_t steps_ = 0;
  int64_t next_clock_check_ = kClockEvery;
  size_t spent_ = 0;
  int depth_ = 0;
  std::vector<Value> mutated_;
  std::unordered_set<const void*> seen_;
};

// A string under construction whose size is checked before each append (against `limit`) and
// whose taint follows its pieces.
class StringBuilder {
 public:
  // what: names the string in errors; output: the rendered prompt (max_output_bytes), else a
  // value (max_value_bytes).
  StringBuilder(Budget& budget, const char* what, bool output = false)
      : budget_(budget),
        what_(what),
        limit_(output ? budget.limits().max_output_bytes : budget.limits().max_value_bytes),
        limit_name_(output ? "max_output_bytes" : "max_value_bytes") {}

  void append(std::string_view text, const ByteSpans& taint = {}) {
    grow(text.size());
    const size_t at = s_.size();
    s_.append(text);
    taint_append(taint_, taint, at);
  }
  void append_str(const Value& str) { append(str.s, str.taint); }
  void append_repeat(char c, size_t n) {
    grow(n);
    s_.append(n, c);
  }
  // bytes [b, e) of a string value, with their taint.
  void append_part(const Value& str, size_t b, size_t e) {
    grow(e - b);
    const size_t at = s_.size();
    s_.append(str.s, b, e - b);
    if (!str.taint.empty()) taint_append(taint_, taint_slice(str.taint, b, e), at);
  }
  void append_data(std::string_view text) {  // text wholly derived from request data
    grow(text.size());
    taint_add(taint_, s_.size(), s_.size() + text.size());
    s_.append(text);
  }
  void push_back(char c, bool tainted = false) {
    grow(1);
    if (tainted) taint_add(taint_, s_.size(), s_.size() + 1);
    s_.push_back(c);
  }
  size_t size() const { return s_.size(); }
  const std::string& str() const { return s_; }
  const ByteSpans& taint() const { return taint_; }
  Value take() { return Value(std::move(s_), std::move(taint_)); }

 private:
  void grow(size_t n) {
    if (n > limit_ - s_.size())  // s_ never exceeds limit_
      throw Error(std::string(what_) + " would be " + std::to_string(s_.size() + n) + " bytes, over the limit of " +
                  std::to_string(limit_) + " (" + limit_name_ + ")");
    budget_.spend(n);
  }

  Budget& budget_;
  const char* what_;
  size_t limit_;
  const char* limit_name_;
  std::string s_;
  ByteSpans taint_;
};

}  // namespace tandem::jinja
