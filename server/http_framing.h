// The checks RFC 9112 asks of a request's header before its body is read, where Beast is lenient:
// how long the body is must be certain (one Transfer-Encoding ending in chunked, never beside a
// Content-Length), one Host (and one at all on HTTP/1.1), a method the server knows, an Expect it
// can meet. A request that fails one is answered and its connection closed: a body whose length
// is uncertain must never be read as the next request (request smuggling).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "server/http_transport.h"

namespace tandem::server {

struct FramingRefusal {
  int status;           // 400, 417, 501
  std::string message;  // plain ASCII, no quotes or backslashes (it goes into JSON as is)
};

// The first problem of a request's header, or nullopt when it may be read and answered.
std::optional<FramingRefusal> check_framing(const HttpRequest& header_only);

// A field value without the optional whitespace (spaces and tabs) around it (RFC 9110 5.6.3).
std::string_view trim_ows(std::string_view s);

}  // namespace tandem::server
