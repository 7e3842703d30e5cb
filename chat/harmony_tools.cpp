#include "chat/harmony_tools.h"

namespace tandem {

std::vector<std::string> harmony_call_tokens() { return {"<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"}; }

std::string missing_harmony_call_token(const Vocab& vocab) {
  for (const std::string& t : harmony_call_tokens()) {
    const int32_t id = vocab.find(t);
    if (id < 0 || vocab.types[id] != TokenType::Control) return t;
  }
  return {};
}

std::string harmony_tool_call_gbnf(const std::vector<ToolGrammarFunction>& functions) {
  std::string g = "root ::= <|channel|> " + gbnf_literal("commentary to=functions.") + " tool-call <|call|>\n";
  g += "tool-call ::= ";
  for (size_t i = 0; i < functions.size(); i++) {
    if (i) g += "\n    | ";
    g += gbnf_literal(functions[i].name + " ") + " <|constrain|> \"json\" <|message|> " + functions[i].args_rule;
  }
  return g + "\n";
}

}  // namespace tandem
