// Parses a Jinja template with the settings Hugging Face's apply_chat_template uses:
// trim_blocks and lstrip_blocks on, the template's single trailing newline dropped.
#pragma once

#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace tandem::jinja {

// Throws Error (with the line) on a syntax error or an unsupported construct.
Body parse_template(std::string_view source);

}  // namespace tandem::jinja
