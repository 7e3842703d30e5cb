// Runs a parsed template against a context of variables, within Limits.
#pragma once

#include "chat/jinja/ast.h"
#include "chat/jinja/limits.h"
#include "tokenizer/rendered_prompt.h"

namespace tandem::jinja {

// The output text with the spans of it that came from request data (tainted strings in the
// context, see Value::from_json). Throws Error on a runtime failure: raise_exception from the
// template, or any limit reached (the message names the limit).
RenderedPrompt render(const Body& body, const Object& context, const Limits& limits = {});

}  // namespace tandem::jinja
