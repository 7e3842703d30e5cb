// A scan of JSON text's bracket structure without parsing it: how deep arrays and objects
// nest, and where a value closes. The server bounds a request's nesting before nlohmann
// parses it (recursively); tool-call parsing finds where a call's JSON ends in model output.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

struct JsonBrackets {
  int deepest = 0;                    // the deepest nesting seen (past `limit` only by one)
  size_t end = std::string::npos;     // one past the bracket that closed the value, if it closed
  size_t too_deep = std::string::npos;  // the bracket that passed `limit`, if one did
};

// Scans s from i, skipping string literals (with their escapes), counting '{' and '[' in and
// '}' and ']' out. It stops at the bracket that takes the depth past `limit`, and, with
// stop_at_close, where the depth returns to 0 (the value opened at s[i] ends). Unbalanced
// input is scanned as it is (closing brackets may take the depth below 0): rejecting it is
// the parser's job.
JsonBrackets scan_json_brackets(std::string_view s, size_t i, int limit, bool stop_at_close);

// What parsing a JSON text would build, counted in one pass over its bytes without building
// it: nlohmann's ordered_json looks each key up linearly in its object, so an object of n keys
// costs n^2/2 string comparisons to parse; these counts let a server refuse such a body before
// the parser sees it. Strings are skipped (with their escapes); the text need not be valid.
struct JsonShape {
  int deepest = 0;            // the deepest nesting of arrays/objects
  size_t values = 0;          // every value: scalars, arrays, objects (an object's keys are not values)
  size_t widest_object = 0;   // the most keys in one object
  size_t key_pairs = 0;       // sum over objects of n(n-1)/2 for n keys: the parser's key comparisons
};
// The scan stops where the nesting passes depth_limit (deepest is then depth_limit + 1).
JsonShape scan_json_shape(std::string_view s, int depth_limit);

}  // namespace tandem
