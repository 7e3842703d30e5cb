// Reasoning apart from content (chat/reasoning.h): gpt-oss's Harmony channels and
// <think>...</think>, whole and streamed in random pieces.
#include <gtest/gtest.h>

#include <random>

#include "chat/reasoning.h"

namespace tandem {
namespace {

// The text pushed in random pieces must give what the whole text gives.
ReasoningOutput streamed(ReasoningFormat f, const std::string& text, std::mt19937& rng, std::string_view tail = {}) {
  ReasoningStream s(f, tail);
  ReasoningOutput all;
  auto add = [&](ReasoningOutput o) {
    all.content += o.content;
    all.reasoning += o.reasoning;
    for (ToolCall& c : o.calls) all.calls.push_back(std::move(c));
  };
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = std::uniform_int_distribution<size_t>(0, 7)(rng);
    add(s.push(std::string_view(text).substr(at, n)));
    at += n;
  }
  add(s.finish());
  return all;
}

void expect_same_streamed(ReasoningFormat f, const std::string& text, const ReasoningOutput& whole, std::string_view tail = {}) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; trial++) {
    const ReasoningOutput s = streamed(f, text, rng, tail);
    ASSERT_EQ(s.content, whole.content) << text;
    ASSERT_EQ(s.reasoning, whole.reasoning) << text;
    ASSERT_EQ(s.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < s.calls.size(); k++) {
      EXPECT_EQ(s.calls[k].name, whole.calls[k].name);
      EXPECT_EQ(s.calls[k].arguments, whole.calls[k].arguments);
    }
  }
}

TEST(Reasoning, DetectsTheFormatFromTheTemplate) {
  EXPECT_EQ(detect_reasoning_format("{{- '<|start|>assistant<|channel|>final<|message|>' }}"), ReasoningFormat::Harmony);
  EXPECT_EQ(detect_reasoning_format("{{ '<|im_start|>assistant\\n<think>\\n' }}"), ReasoningFormat::Think);
  EXPECT_EQ(detect_reasoning_format("{% set c = c.split('</think>')[-1] %}"), ReasoningFormat::Think);
  EXPECT_EQ(detect_reasoning_format("{{ '<|im_start|>assistant\\n' }}"), ReasoningFormat::None);
}

TEST(Reasoning, HarmonyAnalysisThenFinal) {
  const std::string text =
      "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::Harmony, text);
  EXPECT_EQ(o.reasoning, "User asks 2+2. Answer 4.");
  EXPECT_EQ(o.content, "2 + 2 = 4.");
  EXPECT_TRUE(o.calls.empty());
  expect_same_streamed(ReasoningFormat::Harmony, text, o);
  // With the end marker rendered too, and an unfinished analysis.
  EXPECT_EQ(parse_reasoning(ReasoningFormat::Harmony, text + "<|return|>").content, "2 + 2 = 4.");
  const ReasoningOutput cut = parse_reasoning(ReasoningFormat::Harmony, "<|channel|>analysis<|message|>Thinking ab");
  EXPECT_EQ(cut.reasoning, "Thinking ab");
  EXPECT_EQ(cut.content, "");
}

TEST(Reasoning, HarmonyWithoutChannelsIsContent) {
  for (const std::string text : {"Just text, with < and <| inside.", " to be or not", "<", "Hello"}) {
    const ReasoningOutput o = parse_reasoning(ReasoningFormat::Harmony, text);
    if (text.rfind("<|", 0) == 0 || text.rfind(" to=", 0) == 0) continue;
    EXPECT_EQ(o.content, text);
    EXPECT_EQ(o.reasoning, "");
    expect_same_streamed(ReasoningFormat::Harmony, text, o);
  }
}

TEST(Reasoning, HarmonyToolCallsBothHeaderForms) {
  const std::string a =
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::Harmony, a);
  EXPECT_EQ(o.reasoning, "Need weather.");
  EXPECT_EQ(o.content, "");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, "{\"city\":\"Paris\"}");
  expect_same_streamed(ReasoningFormat::Harmony, a, o);
  // The recipient before the channel (as the template renders past calls); no <|call|> (it
  // is an end-of-generation token the engine stops at).
  const std::string b = " to=functions.plan_trip<|channel|>commentary json<|message|>{\"destination\":\"Rome\",\"days\":2}";
  const ReasoningOutput p = parse_reasoning(ReasoningFormat::Harmony, b);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "plan_trip");
  EXPECT_EQ(p.calls[0].arguments, "{\"destination\":\"Rome\",\"days\":2}");
  expect_same_streamed(ReasoningFormat::Harmony, b, p);
}

TEST(Reasoning, HarmonyCommentaryToTheUserIsContent) {
  const std::string text =
      "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|> Done.<|return|>";
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::Harmony, text);
  EXPECT_EQ(o.content, "Let me check. Done.");
  expect_same_streamed(ReasoningFormat::Harmony, text, o);
}

TEST(Reasoning, ThinkTags) {
  const std::string text = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?";
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::Think, text);
  EXPECT_EQ(o.reasoning, "The user greets me.");
  EXPECT_EQ(o.content, "Hello! How can I help?");
  expect_same_streamed(ReasoningFormat::Think, text, o);
  // Empty thinking (Qwen3 with thinking off), no thinking at all, and an unclosed one.
  const std::string empty = "<think>\n\n</think>\n\nHi";
  EXPECT_EQ(parse_reasoning(ReasoningFormat::Think, empty).content, "Hi");
  EXPECT_EQ(parse_reasoning(ReasoningFormat::Think, empty).reasoning, "");
  expect_same_streamed(ReasoningFormat::Think, empty, parse_reasoning(ReasoningFormat::Think, empty));
  EXPECT_EQ(parse_reasoning(ReasoningFormat::Think, "No tags <think> here").content, "No tags <think> here");
  const std::string open = "<think>Still thinking about";
  EXPECT_EQ(parse_reasoning(ReasoningFormat::Think, open).reasoning, "Still thinking about");
  expect_same_streamed(ReasoningFormat::Think, open, parse_reasoning(ReasoningFormat::Think, open));
}

TEST(Reasoning, ThinkOpenedByThePrompt) {
  const std::string text = "Let me think.\n</think>\nThe answer is 4.";
  const std::string tail = "<|Assistant|><think>\n";
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::Think, text, tail);
  EXPECT_EQ(o.reasoning, "Let me think.");
  EXPECT_EQ(o.content, "The answer is 4.");
  expect_same_streamed(ReasoningFormat::Think, text, o, tail);
}

TEST(Reasoning, NoneIsAllContent) {
  const ReasoningOutput o = parse_reasoning(ReasoningFormat::None, "<think>x</think>y");
  EXPECT_EQ(o.content, "<think>x</think>y");
  EXPECT_EQ(o.reasoning, "");
}

}  // namespace
}  // namespace tandem
