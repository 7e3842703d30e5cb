// Runs a parsed template against a context of variables.
#pragma once

#include <string>

#include "tokenizer/jinja/ast.h"

namespace tandem::jinja {

struct Limits {
  size_t max_output_bytes = 16u << 20;  // a hostile template cannot fill memory
  int64_t max_steps = 1'000'000;        // nor loop for ever (real templates take thousands)
  int max_call_depth = 64;
};

// Throws Error on a runtime failure (including raise_exception from the template).
std::string render(const Body& body, const Object& context, const Limits& limits = {});

}  // namespace tandem::jinja
