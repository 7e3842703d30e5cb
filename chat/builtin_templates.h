// Chat templates tandem carries itself, for GGUFs whose converter wrote no
// tokenizer.chat_template (Gemma 3 270M's does not). Each is a Jinja file in chat/templates/,
// compiled in (CMakeLists.txt), rendered like any model's own template.
#pragma once

#include <optional>
#include <string_view>

#include "tokenizer/vocab.h"

namespace tandem {

struct BuiltinTemplate {
  std::string_view name;    // "gemma"
  std::string_view source;  // Jinja
};

// The built-in template for a vocabulary, chosen by its turn markers (Gemma: <start_of_turn>
// and <end_of_turn>); nullopt when none fits.
std::optional<BuiltinTemplate> builtin_template_for(const Vocab& vocab);
// By name; nullopt for an unknown one.
std::optional<BuiltinTemplate> builtin_template(std::string_view name);

}  // namespace tandem
