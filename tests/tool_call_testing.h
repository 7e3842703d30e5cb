// Tool-call parsing in tests: a ToolCallStream fed piece by piece, and the check that every
// split of a text parses as the text in one piece does (tests/test_tool_calls.cpp,
// tests/test_generic_tools.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/tool_calls.h"

namespace tandem {

// The stream fed one piece at a time, joined.
inline ToolCallOutput streamed(ToolCallFamily f, const std::vector<std::string>& pieces, size_t max_calls = SIZE_MAX) {
  ToolCallStream s(f, max_calls);
  ToolCallOutput all;
  auto add = [&](ToolCallOutput o) {
    all.content += o.content;
    for (auto& c : o.calls) all.calls.push_back(c);
  };
  for (const auto& p : pieces) add(s.push(p));
  add(s.finish());
  return all;
}

inline void expect_same(const ToolCallOutput& a, const ToolCallOutput& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); i++) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
  }
}

// Every split into two pieces, and every byte on its own, gives the one-shot answer.
inline void expect_split_invariant(ToolCallFamily f, const std::string& text) {
  const ToolCallOutput whole = parse_tool_calls(f, text);
  for (size_t cut = 0; cut <= text.size(); cut++)
    expect_same(streamed(f, {text.substr(0, cut), text.substr(cut)}), whole, "cut at " + std::to_string(cut) + " of " + text);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(streamed(f, bytes), whole, "byte by byte: " + text);
}

}  // namespace tandem
