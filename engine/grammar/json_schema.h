// JSON Schema -> grammar: the subset OpenAI's structured outputs accept (type object with
// properties, required, additionalProperties false; string, number, integer, boolean, null;
// enum and const; arrays with items, minItems, maxItems; anyOf; $ref into $defs/definitions,
// recursive ones included; type lists like ["string", "null"]), plus string minLength/
// maxLength. A keyword outside the subset is an error naming it and its path (e.g. "schema at
// /properties/when: 'format' = \"date-time\" is not supported"), never silently ignored.
// docs/grammars.md lists the subset.
//
// Output JSON is compact with bounded whitespace (a newline and a few spaces at most between
// tokens), so a small model cannot loop on whitespace forever.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

// The schema as GBNF text whose rules are all named `prefix` + name; its entry rule is
// `prefix` + "root". Front ends that wrap a JSON value in other text (tool calls) splice it
// into their own GBNF.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const std::string& prefix = "",
                                        const GrammarLimits& limits = {});
// json_schema_to_gbnf + parse_gbnf.
Result<std::shared_ptr<const Grammar>> grammar_from_json_schema(const nlohmann::ordered_json& schema,
                                                                const GrammarLimits& limits = {});
// Any JSON object (response_format {"type": "json_object"}).
std::shared_ptr<const Grammar> any_json_object_grammar();

}  // namespace tandem::grammar
