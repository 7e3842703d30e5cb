#include "chat/jinja/builtins.h"

#include <ctime>
#include <string>

// The globals Hugging Face gives chat templates: raise_exception, range, namespace/dict and
// strftime_now. Each charges the render's Budget and checks what it makes before making it.

namespace tandem::jinja {

Object builtin_globals(Budget& budget) {
  Object g;
  g.emplace_back("raise_exception", Value::function([&budget](Args& a, Kwargs&) -> Value {
                   throw Error("template error: " + (a.empty() ? std::string("raise_exception") : to_str(a[0], budget).s));
                 }));
  g.emplace_back("range", Value::function([&budget](Args& a, Kwargs&) -> Value {
                   if (a.empty() || a.size() > 3) throw Error("range() takes 1 to 3 arguments");
                   for (const Value& x : a)
                     if (x.kind != Value::Kind::Int) throw Error(std::string("range() needs integers, not a ") + x.type_name());
                   const int64_t start = a.size() > 1 ? a[0].i : 0, stop = a.size() > 1 ? a[1].i : a[0].i;
                   const int64_t step = a.size() > 2 ? a[2].i : 1;
                   if (step == 0) throw Error("range() step cannot be zero");
                   // Its length in 128-bit arithmetic, checked before one item is made.
                   const __int128 span = step > 0 ? (__int128)stop - start : (__int128)start - stop;
                   const __int128 mag = step > 0 ? (__int128)step : -(__int128)step;
                   const __int128 count = span <= 0 ? 0 : (span + mag - 1) / mag;
                   const size_t max_items = budget.limits().max_value_bytes / sizeof(Value);
                   if (count > (__int128)max_items)
                     throw Error("range() would hold " + std::to_string((unsigned long long)count) +
                                 " items, over the limit of " + std::to_string(max_items) + " (max_value_bytes / " +
                                 std::to_string(sizeof(Value)) + " bytes per item)");
                   budget.step((int64_t)count);
                   budget.allocate_items((size_t)count, "range()");
                   Array out;
                   out.reserve((size_t)count);
                   for (__int128 k = 0; k < count; k++) out.emplace_back((int64_t)(start + k * step));
                   return Value(std::move(out));
                 }));
  auto make_dict = [&budget](Args& a, Kwargs& kw) -> Value {
    Value o{Object{}};
    if (!a.empty() && a[0].is_object()) {
      budget.step((int64_t)a[0].obj->size());
      budget.allocate_items(a[0].obj->size(), "dict");
      for (const auto& [k, x] : *a[0].obj) o.set(k, x);
      o.data = a[0].data;
    }
    budget.allocate_items(kw.size(), "dict");
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
                   const size_t n = std::strftime(buf, sizeof(buf), a.empty() ? "%Y-%m-%d" : a[0].scalar_str().c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  return g;
}

}  // namespace tandem::jinja
