// Gemma 3's SentencePiece vocabulary (262,144 tokens, byte fallback, user-defined runs of
// spaces, tabs and newlines, HTML tags) against the llama.cpp peer's ids, recorded in
// tests/data/gemma3_tokens.json by tests/reference/make_gemma_tokens.py. Needs the model
// (scripts/setup.sh --models all); skips without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "gguf/gguf_file.h"
#include "test_paths.h"
#include "test_vocab.h"
#include "tokenizer/tokenizer.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_HAS_ASAN 1
#endif
#endif
#ifndef TANDEM_HAS_ASAN
#define TANDEM_HAS_ASAN 0
#endif

namespace tandem {
namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += (char)std::stoi(hex.substr(i, 2), nullptr, 16);
  return out;
}

struct PeerCase {
  std::string text;
  std::string decoded;  // what the ids decode to: the text, but where SentencePiece cannot give it back
  bool parse_special = false;
  std::vector<int32_t> ids;
};

std::vector<PeerCase> peer_cases() {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/data/gemma3_tokens.json");
  EXPECT_TRUE(f) << "tests/data/gemma3_tokens.json missing";
  if (!f) return {};
  const auto j = nlohmann::json::parse(f);
  std::vector<PeerCase> out;
  for (const auto& c : j.at("cases")) {
    PeerCase p;
    p.text = c.contains("text_hex") ? from_hex(c.at("text_hex").get<std::string>()) : c.at("text").get<std::string>();
    p.decoded = c.contains("decoded")       ? c.at("decoded").get<std::string>()
                : c.contains("decoded_hex") ? from_hex(c.at("decoded_hex").get<std::string>())
                                            : p.text;
    p.parse_special = c.at("parse_special").get<bool>();
    p.ids = c.at("ids").get<std::vector<int32_t>>();
    out.push_back(std::move(p));
  }
  return out;
}

#define LOAD_GEMMA_OR_SKIP(var)                                                                          \
  auto var = test::load_vocab(test::gemma_model_path());                                                \
  if (!var.tok) GTEST_SKIP() << "Gemma 3 not found at " << test::gemma_model_path()                     \
                             << " (scripts/setup.sh --models all fetches it)";

TEST(GemmaTokenizer, VocabularyAsTheFileDescribesIt) {
  LOAD_GEMMA_OR_SKIP(m);
  const Vocab& v = m.tok->vocab();
  EXPECT_EQ(v.kind, VocabKind::Spm);
  EXPECT_EQ(v.size(), 262144);
  EXPECT_EQ(v.bos, 2);
  EXPECT_EQ(v.eos, 1);
  EXPECT_EQ(v.unk, 3);
  EXPECT_EQ(v.pad, 0);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_space_prefix);
  EXPECT_EQ(v.find("<start_of_turn>"), 105);
  EXPECT_EQ(v.find("<end_of_turn>"), 106);
  // A chat turn ends at <end_of_turn>; the end of a document at <eos>.
  EXPECT_TRUE(v.is_eog(1));
  EXPECT_TRUE(v.is_eog(106));
  EXPECT_FALSE(v.is_eog(105));
  EXPECT_FALSE(v.is_eog(2));
}

TEST(GemmaTokenizer, MatchesLlamaCppIdsAndDecodesBack) {
  LOAD_GEMMA_OR_SKIP(m);
  const Tokenizer& t = *m.tok;
  const auto cases = peer_cases();
  ASSERT_GT(cases.size(), 60u);
  for (size_t k = 0; k < cases.size(); k++) {
    const PeerCase& c = cases[k];
    const auto got = t.encode(c.text, true, c.parse_special);
    size_t first_diff = 0;
    while (first_diff < std::min(got.size(), c.ids.size()) && got[first_diff] == c.ids[first_diff]) first_diff++;
    EXPECT_EQ(got, c.ids) << "case " << k << " " << ::testing::PrintToString(c.text)
                          << (c.parse_special ? " (special)" : "") << ": first differing id at index " << first_diff;
    // Byte fallback spells every byte, so the text comes back (BOS is control: text only when
    // special tokens are shown).
    EXPECT_EQ(t.decode(got, c.parse_special), (c.parse_special ? "<bos>" : "") + c.decoded) << "case " << k;
  }
}

// The GGUF has no tokenizer.chat_template: tandem's built-in Gemma template renders the
// prompt, and its ids are what the peer gives for the same text (tandem writes one BOS).
TEST(GemmaTokenizer, ChatPromptFromTheBuiltinTemplate) {
  LOAD_GEMMA_OR_SKIP(m);
  auto tmpl = ChatTemplate::from_gguf(*m.file, m.tok->vocab());
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  EXPECT_EQ(tmpl->origin().rfind("built-in gemma", 0), 0u) << tmpl->origin();
  auto prompt = tmpl->render({{"system", "You are terse."}, {"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(prompt.ok()) << prompt.error().message;
  const std::string body = "<start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n";
  EXPECT_EQ(prompt->text, "<bos>" + body);
  const auto cases = peer_cases();
  auto it = std::find_if(cases.begin(), cases.end(), [&](const PeerCase& c) { return c.text == body && c.parse_special; });
  ASSERT_NE(it, cases.end()) << "the rendered prompt is missing from tests/data/gemma3_tokens.json";
  EXPECT_EQ(m.tok->encode_chat(prompt.value()), it->ids);
  // Generation stops at the end of the model's turn.
  EXPECT_TRUE(m.tok->vocab().is_eog(m.tok->vocab().find("<end_of_turn>")));
}

// The vocabulary is 262,144 tokens with 6,400 special ones: loading it must not take seconds,
// nor may matching the special tokens make encoding slow. Bounds are ~10x what a Release
// build takes on one slow core, so only a real regression (or a Debug build) trips them.
TEST(GemmaTokenizer, LoadsAndEncodesQuickly) {
  if (!test::exists(test::gemma_model_path())) GTEST_SKIP() << "Gemma 3 not found at " << test::gemma_model_path();
  auto f = GgufFile::open(test::gemma_model_path());
  ASSERT_TRUE(f.ok()) << f.error().message;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto tok = Tokenizer::from_gguf(*f.value());
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::string text;
  while (text.size() < (1u << 20))
    text += "The quick brown fox, naïve café 🦙 2026!\n\n<b>bold</b>  and\tcode(x) { return y; }\n你好，世界。 ";
  const auto t1 = clock::now();
  const auto ids = tok.value()->encode(text, true, true);
  const double encode_s = std::chrono::duration<double>(clock::now() - t1).count();
  EXPECT_EQ(tok.value()->decode(ids), text);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !TANDEM_HAS_ASAN
  EXPECT_LT(load_s, 1.0) << "loading the 262k vocabulary";
  EXPECT_LT(encode_s, 3.0) << "encoding 1 MiB";
#endif
  RecordProperty("load_ms", (int)(load_s * 1000));
  RecordProperty("encode_mib_per_s", (int)(1.0 / encode_s));
  std::printf("gemma vocab: load %.0f ms, encode %.2f MiB/s (%zu tokens)\n", load_s * 1000, 1.0 / encode_s, ids.size());
}

}  // namespace
}  // namespace tandem
