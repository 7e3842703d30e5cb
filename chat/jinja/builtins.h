// Jinja's filters and tests, Python's str/list/dict methods, and the globals Hugging Face
// gives chat templates (raise_exception, strftime_now, namespace, range). Every one charges the
// render's Budget for the elements it visits and checks the size of what it creates before
// creating it; string results carry the taint of the bytes they came from.
#pragma once

#include <string>
#include <vector>

#include "chat/jinja/budget.h"
#include "chat/jinja/value.h"

namespace tandem::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kwargs, Budget& budget);
bool apply_test(const std::string& name, const Value& v, Args& args, Budget& budget);
// obj.name(...) for Python methods; has_method says whether obj has one called name.
bool has_method(const Value& obj, const std::string& name);
Value call_method(const Value& obj, const std::string& name, Args& args, Kwargs& kwargs, Budget& budget);
// The functions every template can call; they charge `budget`, which must outlive them.
Object builtin_globals(Budget& budget);

// Python slicing obj[lo:hi:step] on strings (by code point) and lists; null bounds are absent.
Value slice(const Value& obj, const Value* lo, const Value* hi, const Value* step, Budget& budget);
// The items a for loop visits: a list's items, a dict's keys, a string's characters.
Array items_of(const Value& v, Budget& budget);
// `needle in haystack` for strings, in time linear in their sizes.
size_t find_text(const std::string& haystack, const std::string& needle, size_t from = 0);

}  // namespace tandem::jinja
