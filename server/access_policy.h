// Who may talk to the server, decided from the request header alone (before any body is read):
// the API key (compared in constant time), the Host header (a DNS-rebinding page sends its own
// name), the Origin header (a cross-origin page), and POST bodies declared as JSON (a page's
// no-preflight form post is text/plain). Each refusal is an HTTP status and an OpenAI error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"

namespace tandem::server {

struct AccessOptions {
  std::vector<std::string> api_keys;      // none: no key needed; several: one per tenant
  // Keys that also see the server-wide /metrics (a tenant's key sees its own requests only).
  // They are valid wherever an API key is, each a tenant of its own.
  std::vector<std::string> operator_keys;
  std::string bind_host = "127.0.0.1";    // the address the server listens on
  int port = 0;
  std::vector<std::string> allowed_origins;  // cross-origin pages allowed ("*" for any)
  std::vector<std::string> allowed_hosts;    // more Host names (e.g. a DNS name the server is reached by)
};

// Which configured key a request presented: a tenant's name ("key<i>" or "operator<i>", never
// the key itself), or none.
struct KeyMatch {
  bool known = false;
  bool operator_key = false;
  std::string tenant;  // "" when the server has no keys or the request presented none it knows
};

struct Refusal {
  int status;
  std::string message, type;
};

// The key of "Authorization: Bearer KEY", else of "x-api-key: KEY" (Anthropic's header); "" when absent.
std::string_view presented_key(const HttpRequest& r);

// Compares without an early exit: the time depends on the expected key's length only.
bool constant_time_equal(std::string_view expected, std::string_view given);

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions o) : o_(std::move(o)) {}
  void set_port(int port) { o_.port = port; }
  // nullopt: go on. `needs_key`: the endpoint is behind the API key (/v1/*, /metrics).
  std::optional<Refusal> check(const HttpRequest& header_only, bool needs_key) const;
  // Every key compared whichever matches (the time says nothing of which); constant time.
  KeyMatch match_key(const HttpRequest& r) const;
  bool keyed() const { return !o_.api_keys.empty() || !o_.operator_keys.empty(); }
  bool host_allowed(std::string_view host) const;
  bool origin_allowed(std::string_view origin) const;
  // CORS response fields for an allowed cross-origin request (none for same-origin ones).
  HttpHeaders cors_headers(const HttpRequest& r) const;
  const AccessOptions& options() const { return o_; }

 private:
  AccessOptions o_;
};

}  // namespace tandem::server
