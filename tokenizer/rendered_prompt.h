// A chat prompt as a template rendered it: the text, and which bytes of it were copied from the
// request (message content, names, tool calls, tools: anything from the request's JSON). The
// tokenizer parses special tokens such as "<|im_start|>" only outside those bytes, so a user
// cannot forge a role by typing a control token's text (role forgery).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

// Byte ranges [begin, end) of a string, sorted, disjoint and never touching.
using ByteSpans = std::vector<std::pair<size_t, size_t>>;

struct RenderedPrompt {
  std::string text;
  ByteSpans data_spans;  // the bytes of `text` that came from request data
};

}  // namespace tandem
