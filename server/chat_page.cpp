#include "server/chat_page.h"

namespace tandem::server {

namespace chat_page_files {
// Defined in the source server/embed_files.cmake generates.
extern const std::string_view index_html, chat_js, chat_css;
}  // namespace chat_page_files

const char* const kChatPageCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

bool is_chat_page_path(std::string_view p) { return p == "/" || p == "/index.html" || p == "/chat.js" || p == "/chat.css"; }

std::optional<HttpResponse> chat_page_file(std::string_view path) {
  namespace f = chat_page_files;
  std::string_view body, type;
  if (path == "/" || path == "/index.html") body = f::index_html, type = "text/html; charset=utf-8";
  else if (path == "/chat.js") body = f::chat_js, type = "text/javascript; charset=utf-8";
  else if (path == "/chat.css") body = f::chat_css, type = "text/css; charset=utf-8";
  else return std::nullopt;
  HttpHeaders h = {{"Content-Security-Policy", kChatPageCsp},
                   {"X-Content-Type-Options", "nosniff"},
                   {"X-Frame-Options", "DENY"},
                   {"Referrer-Policy", "no-referrer"},
                   {"Cache-Control", "no-cache"}};
  return HttpResponse{200, std::string(type), std::string(body), std::move(h), false};
}

}  // namespace tandem::server
