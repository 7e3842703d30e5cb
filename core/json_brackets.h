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

}  // namespace tandem
