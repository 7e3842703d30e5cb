// Special tokens as grammar terminals: a grammar element that matches one control token (one
// that emits no text, such as gpt-oss's <|channel|>) and nothing else. GBNF writes it as the
// token's text in angle brackets, as llama.cpp's grammars do: `<|channel|>` (gbnf_parser.h).
//
// The engine is byte-level, so a token terminal is a byte string no text can spell: the token's
// text between two kTokenMark bytes. 0xFF never occurs in UTF-8 and every front end writes only
// UTF-8 (a GBNF literal "\xFF" is U+00FF, two bytes), so kTokenMark reaches a grammar only
// through a token terminal; and the token masker gives it only to control tokens
// (grammar_token_bytes), mapping a plain token's own 0xFF bytes, which no text rule accepts
// either way, to kPlainMarkStandIn. Text that spells "<|channel|>" with ordinary tokens is thus
// never the token, and the token never matches a text rule.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/grammar/grammar.h"

namespace tandem {
class Tokenizer;
}

namespace tandem::grammar {

inline constexpr char kTokenMark = '\xFF';
inline constexpr char kPlainMarkStandIn = '\xFE';  // also never UTF-8
inline constexpr size_t kMaxTokenTerminalText = 256;

// The bytes that stand for the control token whose text is `text` ("<|channel|>").
std::string token_terminal_bytes(std::string_view text);
// Whether `bytes` are a token terminal's (token_terminal_bytes of some text).
bool is_token_terminal(std::string_view bytes);

// The bytes token `id` stands for under a grammar: a control, unknown or unused token (text only
// when special tokens are rendered) its token terminal, any other its text with kTokenMark
// bytes replaced by kPlainMarkStandIn.
std::string grammar_token_bytes(const Tokenizer& tok, int32_t id);

// The texts of the tokens `g` names (each once, in order of first appearance).
std::vector<std::string> token_terminal_texts(const Grammar& g);
// An error naming the first token `g` names that is no control token of `tok`'s vocabulary (a
// grammar that could never match it), for a request's 400 before it runs.
Status check_token_terminals(const Grammar& g, const Tokenizer& tok);

}  // namespace tandem::grammar
