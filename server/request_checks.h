// Checks the Responses and Messages request translators share with each other (the chat
// parser, openai_request.cpp, has its own): a failure names the JSON path that was wrong, an
// object's keys are checked against the ones read there, and the chat parser's error paths are
// rewritten into the translated API's.
#pragma once

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "server/openai_json.h"

namespace tandem::server {

struct FieldCheck {
  std::string* bad;  // set to the failing path
  Status fail(const std::string& path, const std::string& what) const {
    *bad = path;
    return make_error("'{}' {}", path, what);
  }
  // An unknown key is refused (naming its path), never ignored.
  Status known(const ojson& obj, const std::string& path, std::initializer_list<std::string_view> keys) const {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end())
        return fail(path.empty() ? it.key() : fmt::format("{}.{}", path, it.key()), "is not supported");
    return Status::Ok();
  }
};

inline bool present(const ojson& o, const char* key) { return o.is_object() && o.contains(key) && !o[key].is_null(); }

// `path` with its first matching prefix (a chat request's field) replaced by the API's own.
inline std::string rewrite_path(const std::string& path, std::initializer_list<std::pair<std::string_view, std::string_view>> prefixes) {
  for (const auto& [from, to] : prefixes)
    if (path.compare(0, from.size(), from) == 0) return std::string(to) + path.substr(from.size());
  return path;
}

// The chat parser's path as the translated request's: messages[k]... -> the path message k came
// from (`sources[k]`); tools[i].function.x -> tools[i].x (both APIs' tools are flat); the rest
// through the API's `param` map.
inline std::string translated_path(const std::string& chat_path, const std::vector<std::string>& sources,
                                   std::string (*param)(const std::string&)) {
  size_t k = 0;
  if (std::sscanf(chat_path.c_str(), "messages[%zu]", &k) == 1 && k < sources.size())
    return sources[k] + chat_path.substr(chat_path.find(']') + 1);
  if (const size_t f = chat_path.find(".function"); chat_path.rfind("tools[", 0) == 0 && f != std::string::npos)
    return param(chat_path.substr(0, f) + chat_path.substr(f + 9));
  return param(chat_path);
}

// The chat parser's error as the translated request's: its path (and the path quoted in its message) translated.
inline Status translated_error(std::string message, const std::string& chat_path, const std::vector<std::string>& sources,
                               std::string (*param)(const std::string&), std::string* bad) {
  *bad = translated_path(chat_path, sources, param);
  if (const size_t at = message.find("'" + chat_path + "'"); at != std::string::npos && !chat_path.empty())
    message.replace(at + 1, chat_path.size(), *bad);
  return make_error("{}", message);
}

}  // namespace tandem::server
