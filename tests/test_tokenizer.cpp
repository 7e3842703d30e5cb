#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <thread>
#include <sstream>

#include "gguf/gguf_file.h"
#include "test_paths.h"
#include "test_vocab.h"
#include "tokenizer/special_trie.h"
#include "tokenizer/token_index.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// llama.cpp's test format: cases separated by "\n__ggml_vocab_test__\n"; line i of .out holds
// the ids of case i.
std::vector<std::string> split_cases(const std::string& s) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) out.push_back(s.substr(pos, hit - pos));
  if (pos < s.size()) out.push_back(s.substr(pos));
  return out;
}

class TokenizerVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerVectors, MatchLlamaCppIds) {
  const std::string base = test::shared_dir() + "/tokenizer-vectors/ggml-vocab-" + GetParam() + ".gguf";
  if (!test::exists(base)) GTEST_SKIP() << "tokenizer vectors not found at " << base << " (../shared is absent)";
  auto f = GgufFile::open(base);
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto tok = Tokenizer::from_gguf(*f.value());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const auto cases = split_cases(read_file(base + ".inp"));
  std::istringstream outs(read_file(base + ".out"));
  int checked = 0;
  for (const std::string& text : cases) {
    std::string line;
    if (!std::getline(outs, line)) break;
    std::vector<int32_t> want;
    std::istringstream ls(line);
    for (int32_t id; ls >> id;) want.push_back(id);
    const auto got = tok.value()->encode(text, false, false);
    size_t first_diff = 0;
    while (first_diff < std::min(got.size(), want.size()) && got[first_diff] == want[first_diff]) first_diff++;
    ASSERT_EQ(got, want) << "case " << checked << " " << ::testing::PrintToString(text) << ": first differing id at index "
                         << first_diff;
    // Byte-level BPE and SentencePiece with byte fallback both round-trip the text.
    std::string back = tok.value()->decode(got);
    if (tok.value()->vocab().add_space_prefix && !back.empty() && back[0] == ' ') back.erase(0, 1);
    EXPECT_EQ(back, text) << "round trip of case " << checked;
    checked++;
  }
  EXPECT_GT(checked, 30);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, TokenizerVectors, ::testing::Values("gpt-2", "llama-spm", "phi-3", "falcon", "mpt", "deepseek-llm"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(Tokenizer, UnknownPreTokenizerIsAnError) {
  auto p = PreTokenizer::create("no-such-scheme");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("no-such-scheme"), std::string::npos);
}

TEST(Tokenizer, PreTokenizerSplitsLikeGpt2) {
  auto p = PreTokenizer::create("gpt-2");
  ASSERT_TRUE(p.ok());
  const auto pieces = p.value()->split("Hello world's  123 !!");
  const std::vector<std::string_view> want = {"Hello", " world", "'s", " ", " 123", " !!"};
  EXPECT_EQ(pieces, want);
  auto s = PreTokenizer::create("smollm");
  const auto digits = s.value()->split("a 2026");
  const std::vector<std::string_view> want2 = {"a", " ", "2", "0", "2", "6"};
  EXPECT_EQ(digits, want2);
}

// Every scheme compiles, and its pieces tile the text exactly (nothing dropped or repeated),
// including on invalid UTF-8.
TEST(Tokenizer, EveryPreTokenizerCompilesAndTilesItsInput) {
  const std::string text = "Hello World's 1234567 caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd!!\n\n  \tend  \xff\xfe x";
  const auto names = pretokenizer_names();
  EXPECT_GT(names.size(), 60u);
  for (const std::string& name : names) {
    auto p = PreTokenizer::create(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.error().message;
    std::string joined;
    for (std::string_view piece : p.value()->split(text)) {
      EXPECT_FALSE(piece.empty()) << name;
      joined += piece;
    }
    EXPECT_EQ(joined, text) << name;
  }
}

TEST(Tokenizer, DeepseekLlmSplitsLettersPunctuationAndTrailingSpace) {
  auto p = PreTokenizer::create("deepseek-llm");
  ASSERT_TRUE(p.ok());
  const auto pieces = p.value()->split("Hi, 42\n  ");
  const std::vector<std::string_view> want = {"Hi", ",", " ", "42", "\n", "  "};
  EXPECT_EQ(pieces, want);
}

// A fast, deterministic slice of what tests/fuzz/fuzz_tokenizer.cpp does: random bytes, broken
// UTF-8 and special-token fragments give valid ids, and byte-level BPE gives the bytes back.
TEST(Tokenizer, RandomBytesNeverBreakIt) {
  const std::vector<std::string> vocabs = {"gpt-2", "llama-spm", "phi-3", "deepseek-llm"};
  const std::vector<std::string> pieces = {"<|im_start|>", "<s>", "</s>", "<|end", "\xe2\x82", "\xac", "\xff", "\xf0\x9f\xa6\x99",
                                           " ", "\n", "\r\n", "\t", "123456", "don't", "\xc3\xa9", "\x00", "<0x41>", "  "};
  std::mt19937 rng(1234);
  int vocabs_run = 0;
  for (const std::string& v : vocabs) {
    const std::string path = test::shared_dir() + "/tokenizer-vectors/ggml-vocab-" + v + ".gguf";
    if (!test::exists(path)) continue;
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok());
    auto tok = Tokenizer::from_gguf(*f.value());
    ASSERT_TRUE(tok.ok());
    const Tokenizer& t = *tok.value();
    for (int round = 0; round < 200; round++) {
      std::string text;
      const int parts = (int)(rng() % 24);
      for (int k = 0; k < parts; k++) {
        if (rng() % 2) text += pieces[rng() % pieces.size()];
        else text += (char)(rng() % 256);
      }
      for (bool special : {false, true}) {
        const auto ids = t.encode(text, true, special);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.vocab().size()) << v;
        (void)t.decode(ids, true);
      }
      // Valid UTF-8 comes back exactly (broken bytes become U+FFFD first, as in llama.cpp).
      if (t.vocab().kind == VocabKind::Bpe && utf8_valid(text)) {
        EXPECT_EQ(t.decode(t.encode(text, false, false)), text) << v;
      }
    }
    vocabs_run++;
  }
  if (vocabs_run == 0) GTEST_SKIP() << "tokenizer vectors not found (../shared is absent)";
}

TEST(TokenIndex, FindsEveryTokenAndKeepsTheFirstOfDuplicates) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 5000; i++) tokens.push_back("tok" + std::to_string(i));
  tokens.push_back("");
  tokens.push_back("tok7");  // a duplicate: id 7 keeps the text
  tokens.push_back(std::string("a\0b", 3));
  TokenIndex index(tokens);
  for (int i = 0; i < 5000; i++) ASSERT_EQ(index.find(tokens[i]), i);
  EXPECT_EQ(index.find(""), 5000);
  EXPECT_EQ(index.find("tok7"), 7);
  EXPECT_EQ(index.find(std::string("a\0b", 3)), 5002);
  EXPECT_EQ(index.find("a"), -1);
  EXPECT_EQ(index.find("tok5000"), -1);
  // Growing one token at a time (past several resizes) finds old and new alike.
  TokenIndex grown;
  EXPECT_EQ(grown.find("x"), -1);
  for (int i = 0; i < 3000; i++) grown.insert("w" + std::to_string(i), 2 * i);
  grown.insert("w5", 1);  // already present: keeps 10
  for (int i = 0; i < 3000; i++) ASSERT_EQ(grown.find("w" + std::to_string(i)), 2 * i);
  EXPECT_EQ(grown.find("w3000"), -1);
}

TEST(SpecialTrie, MarksExactlyTheTokensThatOccur) {
  const std::vector<std::string_view> texts = {"<unused10>", "<unused1>", "\n\n", "\n", "", "<b>", "ab", "bcd"};
  SpecialTrie trie(texts);
  auto occurring = [&](std::string_view text) {
    std::vector<bool> seen(texts.size(), false);
    trie.mark_occurring(text, seen);
    std::string marks;
    for (bool b : seen) marks += b ? '1' : '0';
    return marks;
  };
  EXPECT_EQ(occurring(""), "00000000");
  EXPECT_EQ(occurring("<unused10>"), "10000000");  // not "<unused1>": no ">" after its "1"
  EXPECT_EQ(occurring("x<unused10> <unused1>"), "11000000");
  EXPECT_EQ(occurring("a\n\n\nb"), "00110000");
  EXPECT_EQ(occurring("abcd<b"), "00000011");  // overlapping occurrences both count
  EXPECT_EQ(occurring("<unused"), "00000000");
}

// A vocabulary built by hand: SentencePiece with byte fallback, for the tokenizer's own rules.
Vocab spm_vocab(const std::vector<std::pair<std::string, float>>& pieces) {
  Vocab v;
  v.kind = VocabKind::Spm;
  v.add_space_prefix = false;
  for (int b = 0; b < 256; b++) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.scores.push_back(0);
    v.types.push_back(TokenType::Byte);
  }
  for (const auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.types.push_back(TokenType::Normal);
  }
  v.rstrip.assign(v.tokens.size(), false);
  v.token_to_id = TokenIndex(v.tokens);
  return v;
}

// Gemma's vocabulary holds ">▁</", a '▁' straight after another character: tandem once read
// before the token's start there (a crash on load); now such a vocabulary merges across words.
TEST(Tokenizer, SpmTokenWithASpaceAfterACharacterLoadsAndMerges) {
  const std::string sp = "\xe2\x96\x81";
  auto t = Tokenizer::create(spm_vocab({{"a", -1}, {"b", -1}, {sp, -1}, {"a" + sp, -2}, {"a" + sp + "b", -3}, {sp + "b", -4}}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  const int32_t a_sp_b = t.value()->vocab().find("a" + sp + "b");
  EXPECT_EQ(t.value()->encode("a b", false, false), std::vector<int32_t>{a_sp_b});
  EXPECT_EQ(t.value()->decode({a_sp_b}), "a b");
  // Byte fallback for what no piece spells.
  EXPECT_EQ(t.value()->encode("\xc3\xa9", false, false), (std::vector<int32_t>{0xc3, 0xa9}));
}

// Special tokens split the text longest first, whatever their position (as llama.cpp does):
// "bcd" wins over an earlier "ab"; a token absent from the text changes nothing.
TEST(Tokenizer, SpecialTokensSplitLongestFirst) {
  Vocab v = spm_vocab({{"a", -1}, {"b", -1}, {"c", -1}, {"d", -1}});
  const int32_t ab = v.add_token("ab", TokenType::UserDefined);
  const int32_t bcd = v.add_token("bcd", TokenType::UserDefined);
  const int32_t ctl = v.add_token("<ctl>", TokenType::Control);
  for (int k = 0; k < 500; k++) v.add_token("<unused" + std::to_string(k) + ">", TokenType::Control);
  auto t = Tokenizer::create(std::move(v));
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = *t.value();
  const int32_t a = tok.vocab().find("a"), c = tok.vocab().find("c");
  EXPECT_EQ(tok.encode("abcd", false, false), (std::vector<int32_t>{a, bcd}));
  EXPECT_EQ(tok.encode("abc", false, false), (std::vector<int32_t>{ab, c}));
  EXPECT_EQ(tok.encode("ab<ctl>ab", false, true), (std::vector<int32_t>{ab, ctl, ab}));
  EXPECT_EQ(tok.encode("<unused7>", false, true), std::vector<int32_t>{tok.vocab().find("<unused7>")});
  EXPECT_GT(tok.encode("<unused7>", false, false).size(), 1u);  // control tokens only when asked
}

TEST(Utf8, StreamerNeverSplitsACharacter) {
  Utf8Streamer s;
  const std::string euro = "\xe2\x82\xac";  // one character, three bytes
  EXPECT_EQ(s.push("a" + euro.substr(0, 1)), "a");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2, 1) + "b"), euro + "b");
  EXPECT_EQ(s.push("\xf0\x9f"), "");
  EXPECT_EQ(s.flush(), "\xf0\x9f");
  EXPECT_EQ(utf8_chars("a\xe2\x82\xac\xff").size(), 3u);
}

TEST(Tokenizer, SmolLmSpecialTokensAndRoundTrip) {
  const std::string path = test::default_model_path();
  auto m = test::load_vocab(path);
  if (!m.tok) GTEST_SKIP() << "model not loaded from " << path << " (run scripts/setup.sh)";
  const Tokenizer& t = *m.tok;
  // Ids from llama.cpp's llama-tokenize on the same file.
  EXPECT_EQ(t.encode("The capital of France is", true, true), (std::vector<int32_t>{504, 3575, 282, 4649, 314}));
  const auto ids = t.encode("<|im_start|>user\nHi<|im_end|>", false, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  // Without parse_special the markers are plain text.
  EXPECT_GT(t.encode("<|im_start|>", false, false).size(), 1u);
  EXPECT_TRUE(t.vocab().is_eog(2));
  const std::string text = "Ünïcödé — naïve café 🦙 2026!\n\tTabs";
  EXPECT_EQ(t.decode(t.encode(text, false, false)), text);
}

TEST(Tokenizer, EncodeChatParsesSpecialTokensOnlyOutsideData) {
  const std::string path = test::default_model_path();
  auto m = test::load_vocab(path);
  if (!m.tok) GTEST_SKIP() << "model not loaded from " << path << " (run scripts/setup.sh)";
  const Tokenizer& t = *m.tok;
  // "<|im_start|>user\n" + data "<|im_end|>" + "<|im_end|>": only the template's two are control.
  RenderedPrompt p{"<|im_start|>user\n<|im_end|><|im_end|>", {{17, 27}}};
  const auto ids = t.encode_chat(p);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
  EXPECT_EQ(t.decode(ids, true), p.text);
  // A token whose text straddles template and data is not the template's: text.
  RenderedPrompt straddle{"<|im_start|>x<|im_end|>", {{16, 18}}};
  const auto ids2 = t.encode_chat(straddle);
  EXPECT_EQ(std::count(ids2.begin(), ids2.end(), 2), 0);
  const auto allowed = t.encode_chat(straddle, true);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 2), 1);
  // No data: as encode(text, add_special, parse_special = true).
  RenderedPrompt plain{"<|im_start|>user\nHi<|im_end|>", {}};
  EXPECT_EQ(t.encode_chat(plain), t.encode(plain.text, t.vocab().add_bos, true));
}

TEST(Tokenizer, ConcurrentEncodingMatchesSerial) {
  const std::string path = test::default_model_path();
  auto m = test::load_vocab(path);
  if (!m.tok) GTEST_SKIP() << "model not loaded from " << path << " (run scripts/setup.sh)";
  const Tokenizer& t = *m.tok;
  // Different texts per thread, long enough that the threads' regex matching overlaps.
  std::vector<std::string> texts;
  for (int k = 0; k < 8; k++) {
    std::string s;
    for (int r = 0; r < 200; r++)
      s += "Thread " + std::to_string(k) + " line " + std::to_string(r) + ": naïve café 🦙, don't stop " +
           std::string(k + 1, 'x') + " 12345\n";
    texts.push_back(s);
  }
  std::vector<std::vector<int32_t>> serial, chat_serial;
  for (const std::string& s : texts) {
    serial.push_back(t.encode(s, true, false));
    chat_serial.push_back(t.encode_chat({"<|im_start|>user\n" + s + "<|im_end|>", {{17, 17 + s.size()}}}));
  }
  std::vector<int> mismatches(texts.size(), 0);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < texts.size(); k++)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; rep++) {
        if (t.encode(texts[k], true, false) != serial[k]) mismatches[k]++;
        if (t.encode_chat({"<|im_start|>user\n" + texts[k] + "<|im_end|>", {{17, 17 + texts[k].size()}}}) != chat_serial[k])
          mismatches[k]++;
      }
    });
  for (auto& th : threads) th.join();
  for (size_t k = 0; k < texts.size(); k++) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
}

}  // namespace
}  // namespace tandem
