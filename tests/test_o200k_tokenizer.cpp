// gpt-oss's vocabulary (o200k_harmony: o200k_base's ranks, the "gpt-4o" pre-tokenizer, the
// harmony special tokens) against tiktoken's ids, recorded in tests/data/o200k_tokens.json by
// tests/reference/make_o200k_tokens.py, which also writes the vocabulary as llama.cpp's
// converter writes gpt-oss's (models/o200k-harmony-vocab.gguf); skips without that file.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "test_paths.h"
#include "test_vocab.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

#define LOAD_O200K_OR_SKIP(var)                                                                    \
  auto var = test::load_vocab(test::o200k_vocab_path());                                          \
  if (!var.tok) GTEST_SKIP() << "o200k_harmony vocabulary not found at " << test::o200k_vocab_path() \
                             << " (tests/reference/make_o200k_tokens.py writes it)";

TEST(O200kTokenizer, VocabularyAsTheFileDescribesIt) {
  LOAD_O200K_OR_SKIP(m);
  const Vocab& v = m.tok->vocab();
  EXPECT_EQ(v.kind, VocabKind::Bpe);
  EXPECT_EQ(v.size(), 201088);
  EXPECT_FALSE(v.add_bos);
  // The answer ends at <|return|> or <|call|>; <|end|> only ends a message (the reasoning).
  EXPECT_TRUE(v.is_eog(v.find("<|return|>")));
  EXPECT_TRUE(v.is_eog(v.find("<|call|>")));
  EXPECT_FALSE(v.is_eog(v.find("<|end|>")));
  EXPECT_EQ(v.find("<|channel|>"), 200005);
}

TEST(O200kTokenizer, MatchesTiktokenIdsAndDecodesBack) {
  LOAD_O200K_OR_SKIP(m);
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/data/o200k_tokens.json");
  ASSERT_TRUE(f) << "tests/data/o200k_tokens.json missing";
  const auto j = nlohmann::json::parse(f);
  int checked = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text");
    const bool special = c.at("parse_special");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = m.tok->encode(text, false, special);
    size_t first_diff = 0;
    while (first_diff < std::min(got.size(), want.size()) && got[first_diff] == want[first_diff]) first_diff++;
    EXPECT_EQ(got, want) << ::testing::PrintToString(text) << (special ? " (special)" : "")
                         << ": first differing id at index " << first_diff;
    EXPECT_EQ(m.tok->decode(got, true), text);
    checked++;
  }
  EXPECT_GE(checked, 60);
}

// gpt-oss's template renders a prompt whose markup becomes the harmony control tokens and whose
// message is text: the ids tiktoken gives the same text with its special tokens allowed (the
// template's date pinned to the recorded one).
TEST(O200kTokenizer, HarmonyChatPromptFromTheTemplate) {
  LOAD_O200K_OR_SKIP(m);
  std::ifstream tf(std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat_templates/gpt-oss.jinja");
  const std::string source((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  auto tmpl = ChatTemplate::from_source(source, "<|startoftext|>", "<|return|>");
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  auto prompt = tmpl->render({{"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(prompt.ok()) << prompt.error().message;
  const std::string key = "Current date: ";
  const size_t at = prompt->text.find(key);
  ASSERT_NE(at, std::string::npos);
  prompt->text.replace(at + key.size(), 10, "2026-12-07");  // same length: the data spans stay
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/data/o200k_tokens.json");
  const auto j = nlohmann::json::parse(f);
  bool found = false;
  for (const auto& c : j.at("cases")) {
    if (c.at("text") != prompt->text || !c.at("parse_special").get<bool>()) continue;
    found = true;
    EXPECT_EQ(m.tok->encode_chat(prompt.value()), c.at("ids").get<std::vector<int32_t>>());
  }
  EXPECT_TRUE(found) << "the rendered prompt is not among the recorded cases: " << prompt->text;
}

}  // namespace
}  // namespace tandem
