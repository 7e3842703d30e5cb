// Jinja's filters and tests, Python's str/list/dict methods, and the globals Hugging Face
// gives chat templates (raise_exception, strftime_now, namespace, range).
#pragma once

#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace tandem::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

Value apply_filter(const std::string& name, const Value& v, Args& args, Kwargs& kwargs);
bool apply_test(const std::string& name, const Value& v, Args& args);
// obj.name(...) for Python methods; has_method says whether obj has one called name.
bool has_method(const Value& obj, const std::string& name);
Value call_method(const Value& obj, const std::string& name, Args& args, Kwargs& kwargs);
// The functions every template can call.
Object builtin_globals();

// Python slicing obj[lo:hi:step] on strings (by code point) and lists; null bounds are absent.
Value slice(const Value& obj, const Value* lo, const Value* hi, const Value* step);

}  // namespace tandem::jinja
