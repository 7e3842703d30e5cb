// GBNF, the grammar text llama.cpp users already write (llama.cpp's grammars/README.md
// describes the format; tandem reads it, and docs/grammars.md says what it accepts):
//   root ::= "yes" | "no" ws [0-9]+      # comments run to the end of the line
// rules `name ::= alternatives`; literals "..." with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH
// escapes; character classes [a-z], [^"\\] over code points; rule references; groups ( ... );
// repetition *, +, ?, {m}, {m,}, {m,n}; `.` for any character; a control token by its text in
// angle brackets, `<|channel|>`, as llama.cpp writes it (token_terminal.h; token ids `<[N]>` and
// negation `!<...>` are errors). The root rule is "root".
#pragma once

#include <memory>
#include <string_view>

#include "core/error.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

// A syntax error, an undefined rule, left recursion or a limit reached is an error naming the
// line (and the rule).
Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace tandem::grammar
