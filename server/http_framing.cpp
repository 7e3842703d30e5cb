#include "server/http_framing.h"

#include <fmt/format.h>

#include <array>
#include <boost/beast/core/string.hpp>
#include <string_view>
#include <vector>

namespace tandem::server {

namespace {

using boost::beast::iequals;

// The elements of every field line named `name`, in order, as one comma-separated list (RFC 9110
// 5.3: lines of one name combine so); empty elements are skipped, as 5.6.1 asks.
std::vector<std::string_view> list_elements(const HttpRequest& r, std::string_view name) {
  std::vector<std::string_view> out;
  for (const auto& [k, v] : r.headers) {
    if (!iequals(k, name)) continue;
    std::string_view rest = v;
    while (true) {
      const size_t comma = rest.find(',');
      if (auto e = trim_ows(rest.substr(0, comma)); !e.empty()) out.push_back(e);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return out;
}

int count_fields(const HttpRequest& r, std::string_view name) {
  int n = 0;
  for (const auto& f : r.headers) n += iequals(f.first, name) ? 1 : 0;
  return n;
}

// Printable for an error message (its JSON is written without escaping): at most 40 characters of
// letters, digits and a little punctuation.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '=';
    out += safe ? c : '?';
  }
  return out;
}

// RFC 9112 6.1 and 6.3: the body's length must be certain.
std::optional<FramingRefusal> check_body_length(const HttpRequest& r) {
  if (count_fields(r, "Transfer-Encoding") == 0) return std::nullopt;
  if (r.version < 11) return FramingRefusal{400, "Transfer-Encoding in an HTTP/1.0 request"};
  if (count_fields(r, "Content-Length") > 0) return FramingRefusal{400, "both Transfer-Encoding and Content-Length"};
  const auto codings = list_elements(r, "Transfer-Encoding");
  if (codings.empty() || !iequals(codings.back(), "chunked"))
    return FramingRefusal{400, "Transfer-Encoding must end with chunked (the body length is uncertain)"};
  for (size_t i = 0; i + 1 < codings.size(); i++)
    if (iequals(codings[i], "chunked")) return FramingRefusal{400, "chunked applied more than once"};
  if (codings.size() > 1)  // gzip, chunked: well framed, but a coding this server does not decode
    return FramingRefusal{501, fmt::format("transfer coding {} is not supported (only chunked)", printable(codings.front()))};
  return std::nullopt;
}

bool known_method(std::string_view m) {
  // RFC 9110 9.3 and PATCH (RFC 5789), case-sensitive. Known but not routed: the handler's 405.
  static constexpr std::array<std::string_view, 9> kKnown = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"};
  for (auto k : kKnown)
    if (m == k) return true;
  return false;
}

}  // namespace

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<FramingRefusal> check_framing(const HttpRequest& r) {
  if (auto refusal = check_body_length(r)) return refusal;
  const int hosts = count_fields(r, "Host");
  if (hosts > 1 || (hosts == 1 && r.header("Host")->find(',') != std::string_view::npos))
    return FramingRefusal{400, "more than one Host"};
  if (hosts == 0 && r.version >= 11) return FramingRefusal{400, "an HTTP/1.1 request without Host"};
  // Fields whose value decides who may do what: with two, one part of a chain (a proxy, the
  // key check, the body's reader) could read the first and another the second.
  for (std::string_view name : {"Authorization", "Content-Type", "Origin"})
    if (count_fields(r, name) > 1) return FramingRefusal{400, fmt::format("more than one {} header", name)};
  if (!known_method(r.method)) return FramingRefusal{501, fmt::format("method {} is not implemented", printable(r.method))};
  for (auto e : list_elements(r, "Expect"))
    if (!iequals(e, "100-continue")) return FramingRefusal{417, fmt::format("cannot meet Expect: {} (only 100-continue)", printable(e))};
  return std::nullopt;
}

}  // namespace tandem::server
