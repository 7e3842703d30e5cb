#include "core/json_brackets.h"

#include <algorithm>
#include <vector>

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

JsonShape scan_json_shape(std::string_view s, int depth_limit) {
  JsonShape r;
  // One entry per open array/object: its key count, whether its next token is a key (an
  // object before ':'), and whether a value has begun since the last ',' or ':' (a value's
  // later bytes, "123" or "true", count once).
  struct Open {
    bool object;
    size_t keys = 0;
    bool at_key;
    bool pending = false;
  };
  std::vector<Open> open;
  bool in_string = false, escaped = false, root_pending = false;
  auto token = [&] {  // a string, scalar or bracket begins here
    if (!open.empty() && open.back().at_key) return;  // a key: counted at its ':'
    bool& pending = open.empty() ? root_pending : open.back().pending;
    if (!pending) r.values++;
    pending = true;
  };
  for (const char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case ' ': case '\t': case '\n': case '\r':
        break;
      case '"':
        token();
        in_string = true;
        break;
      case ':':
        if (!open.empty() && open.back().object && open.back().at_key) {
          Open& o = open.back();
          r.key_pairs += o.keys++;
          r.widest_object = std::max(r.widest_object, o.keys);
          o.at_key = false;
        }
        break;
      case ',':
        if (!open.empty()) {
          open.back().pending = false;
          open.back().at_key = open.back().object;
        }
        break;
      case '{': case '[':
        token();
        open.push_back(Open{c == '{', 0, c == '{'});
        r.deepest = std::max(r.deepest, (int)open.size());
        if (r.deepest > depth_limit) return r;  // the caller refuses it; counting on would cost memory
        break;
      case '}': case ']':
        if (!open.empty()) open.pop_back();
        break;
      default:  // a number, true, false or null (or junk the parser will refuse)
        token();
        break;
    }
  }
  return r;
}

}  // namespace tandem
