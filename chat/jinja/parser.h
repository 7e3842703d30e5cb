// Parses a Jinja template with the settings Hugging Face's apply_chat_template uses:
// trim_blocks and lstrip_blocks on, the template's single trailing newline dropped.
#pragma once

#include <string_view>

#include "chat/jinja/ast.h"
#include "chat/jinja/limits.h"

namespace tandem::jinja {

// Throws Error (with the line) on a syntax error, an unsupported construct, or nesting (of
// brackets, operators, filters, statements) deeper than max_nesting: the parser and the
// interpreter recurse on nesting, so it is bounded rather than left to overflow the stack.
Body parse_template(std::string_view source, int max_nesting = Limits{}.max_nesting);

}  // namespace tandem::jinja
