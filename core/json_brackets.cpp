#include "core/json_brackets.h"

namespace tandem {

JsonBrackets scan_json_brackets(std::string_view s, size_t i, int limit, bool stop_at_close) {
  JsonBrackets r;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t k = i; k < s.size(); k++) {
    const char c = s[k];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > r.deepest && (r.deepest = depth) > limit) {
        r.too_deep = k;
        return r;
      }
    } else if (c == '}' || c == ']') {
      if (--depth == 0 && stop_at_close) {
        r.end = k + 1;
        return r;
      }
    }
  }
  return r;
}

}  // namespace tandem
