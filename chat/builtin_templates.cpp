#include "chat/builtin_templates.h"

namespace tandem {

namespace {

// chat/templates/gemma.jinja, as a string literal generated at configure time.
constexpr std::string_view kGemma =
#include "chat/gemma_template.inc"
    ;

}  // namespace

std::optional<BuiltinTemplate> builtin_template(std::string_view name) {
  if (name == "gemma") return BuiltinTemplate{"gemma", kGemma};
  return std::nullopt;
}

std::optional<BuiltinTemplate> builtin_template_for(const Vocab& vocab) {
  if (vocab.find("<start_of_turn>") >= 0 && vocab.find("<end_of_turn>") >= 0) return builtin_template("gemma");
  return std::nullopt;
}

}  // namespace tandem
