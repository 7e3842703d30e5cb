// gpt-oss's harmony format, for a forced tool call (tool_choice "required" or a named
// function): the GBNF that makes the model write the call as gpt-oss writes one,
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>
// after the prompt's "<|start|>assistant", the markup being control tokens (grammar token
// terminals, engine/grammar/token_terminal.h). chat/reasoning.h parses the answer back into
// tool_calls. A forced call goes straight to the commentary channel: no analysis first.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"
#include "tokenizer/vocab.h"

namespace tandem {

// The control tokens a forced harmony call is written with.
std::vector<std::string> harmony_call_tokens();

// The first of harmony_call_tokens() that `vocab` lacks as a control token, or empty when it
// has them all.
std::string missing_harmony_call_token(const Vocab& vocab);

// GBNF for one call to one of `functions` (rules "root" and "tool-call"); each function's
// arguments are the rule `args_rule` the caller defines elsewhere in the same grammar. Harmony
// ends the turn at <|call|>, so a forced call is always one call. Function names must already be
// valid (letters, digits, '_', '-').
std::string harmony_tool_call_gbnf(const std::vector<ToolGrammarFunction>& functions);

}  // namespace tandem
