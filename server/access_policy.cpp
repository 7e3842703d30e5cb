#include "server/access_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>

#include "server/http_framing.h"

namespace tandem::server {

namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  std::transform(o.begin(), o.end(), o.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  return o;
}

bool is_ip_literal(std::string_view name) {
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(std::string(name), ec);
  return !ec;
}

// "name:port", "[v6]:port" or "name" (port 80) -> name, port; false when malformed.
bool split_host(std::string_view host, std::string* name, int* port) {
  size_t colon = host.rfind(':');
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    colon = close + 1 < host.size() && host[close + 1] == ':' ? close + 1 : std::string_view::npos;
    if (colon == std::string_view::npos && close + 1 != host.size()) return false;
  }
  *name = lower(host.substr(0, colon));
  *port = 80;
  if (colon != std::string_view::npos) {
    const std::string_view p = host.substr(colon + 1);
    if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
    *port = std::stoi(std::string(p));
  }
  return !name->empty();
}

}  // namespace

std::string_view presented_key(const HttpRequest& r) {
  const auto auth = r.header("Authorization");
  constexpr std::string_view bearer = "Bearer ";
  if (auth && auth->substr(0, bearer.size()) == bearer) return auth->substr(bearer.size());
  const auto x_api_key = r.header("x-api-key");  // Anthropic's clients send their key here
  return x_api_key ? *x_api_key : std::string_view();
}

bool constant_time_equal(std::string_view expected, std::string_view given) {
  unsigned diff = expected.size() == given.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); i++) {
    // Read a byte of `given` at every position, whatever its length (0 past its end).
    const unsigned char g = i < given.size() ? (unsigned char)given[i] : 0;
    diff |= (unsigned)((unsigned char)expected[i] ^ g);
  }
  return diff == 0;
}

KeyMatch AccessPolicy::match_key(const HttpRequest& r) const {
  const std::string_view given = presented_key(r);
  KeyMatch m;
  size_t index = 0;
  for (size_t i = 0; i < o_.api_keys.size(); i++) {
    const bool eq = constant_time_equal(o_.api_keys[i], given);
    index = eq ? i : index;
    m.known |= eq;
  }
  bool op = false;
  for (size_t i = 0; i < o_.operator_keys.size(); i++) {
    const bool eq = constant_time_equal(o_.operator_keys[i], given);
    index = eq && !m.known ? i : index;
    op |= eq && !m.known;
  }
  m.operator_key = op;
  m.known |= op;
  if (m.known) m.tenant = fmt::format("{}{}", op ? "operator" : "key", index);
  return m;
}

bool AccessPolicy::host_allowed(std::string_view host) const {
  std::string name;
  int port = 0;
  if (!split_host(trim_ows(host), &name, &port)) return false;
  for (const auto& h : o_.allowed_hosts)
    if (lower(h) == name) return true;  // named by the user: any port (a proxy may rewrite it)
  if (port != o_.port) return false;
  const std::string bind = lower(o_.bind_host);
  if (name == "localhost" || name == "127.0.0.1" || name == "[::1]") return true;
  if (name == bind || name == "[" + bind + "]") return true;
  // Listening on every interface: any address of this machine, typed as an IP, is fine; a DNS
  // name (a rebinding page's) is not unless --allow-host names it.
  if ((bind == "0.0.0.0" || bind == "::") && is_ip_literal(name)) return true;
  return false;
}

bool AccessPolicy::origin_allowed(std::string_view origin) const {
  for (const auto& o : o_.allowed_origins)
    if (o == "*" || o == origin) return true;
  constexpr std::string_view scheme = "http://";
  if (origin.substr(0, scheme.size()) != scheme) return false;
  return host_allowed(origin.substr(scheme.size()));
}

std::optional<Refusal> AccessPolicy::check(const HttpRequest& r, bool needs_key) const {
  const auto host = r.header("Host");
  if (!host) return Refusal{400, "the request has no Host header", "invalid_request_error"};
  if (!host_allowed(*host))
    return Refusal{403,
                   fmt::format("Host '{}' is not an address of this server (a guard against DNS rebinding; "
                               "start the server with --allow-host NAME to serve under that name)",
                               *host),
                   "permission_error"};
  const auto origin = r.header("Origin");
  if (origin && !origin_allowed(*origin))
    return Refusal{403,
                   fmt::format("cross-origin requests from '{}' are not allowed (start the server with --allow-origin ORIGIN)",
                               *origin),
                   "permission_error"};
  if (needs_key && keyed() && !match_key(r).known)
    return Refusal{401, "invalid or missing API key (Authorization: Bearer ... or x-api-key: ...)", "authentication_error"};
  if (r.method == "POST") {
    const auto ct = r.header("Content-Type");
    const std::string media = ct ? lower(trim_ows(ct->substr(0, ct->find(';')))) : "";
    if (media != "application/json")
      return Refusal{415, fmt::format("POST bodies must be sent as Content-Type: application/json (got '{}')", ct ? *ct : ""),
                     "invalid_request_error"};
  }
  return std::nullopt;
}

HttpHeaders AccessPolicy::cors_headers(const HttpRequest& r) const {
  const auto origin = r.header("Origin");
  if (!origin) return {};
  for (const auto& o : o_.allowed_origins)
    if (o == "*" || o == *origin)
      return {{"Access-Control-Allow-Origin", std::string(*origin)}, {"Vary", "Origin"}};
  return {};
}

}  // namespace tandem::server
