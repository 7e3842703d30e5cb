// The chat page `tandem serve` answers at "/" (server/chat_page/: HTML, CSS and JS as written,
// embedded in the binary at build time). It talks to the server's own /v1/chat/completions and
// /metrics like any other client, so it adds no access path: the page itself is open (it holds
// no data), every API call it makes goes through the API key and the Host/Origin guards.
#pragma once

#include <optional>
#include <string_view>

#include "server/http_transport.h"

namespace tandem::server {

// The Content-Security-Policy of the page: its own script, style and API only (no inline code,
// no other origin, no framing), so even text that got past the page's escaping could not run.
extern const char* const kChatPageCsp;

bool is_chat_page_path(std::string_view path);
// The page's file at `path` ("/", "/chat.js", "/chat.css"), with its security headers; nullopt
// for any other path.
std::optional<HttpResponse> chat_page_file(std::string_view path);

}  // namespace tandem::server
