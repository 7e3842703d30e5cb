// The byte-level grammar matcher and the token masker (engine/grammar/), on grammars built by
// hand (tests/grammar_builder.h) and on the bundled models' vocabularies.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/grammar/token_terminal.h"
#include "gguf/gguf_file.h"
#include "grammar_builder.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace tandem::grammar {
namespace {

using namespace tandem::grammar::test;

Matcher make(std::shared_ptr<const Grammar> g) {
  auto m = Matcher::create(std::move(g));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return std::move(m).value();
}

// One grammar object for the tests that compare states: masks are cached per grammar.
const std::shared_ptr<const Grammar>& shared_json_grammar() {
  static const auto g = json_object_grammar();
  return g;
}

Matcher json_after(std::string_view text) {
  Matcher m = make(shared_json_grammar());
  EXPECT_TRUE(m.accept(text)) << "'" << text << "'";
  return m;
}

// root ::= "yes" | "no" [0-9]+
std::shared_ptr<const Grammar> yes_no_grammar() {
  GrammarBuilder b;
  const int32_t root = b.rule("root"), digits = b.rule("digits");
  b.alt(root, lit("yes"));
  b.alt(root, cat(lit("no"), range('0', '9'), ref(digits)));
  b.alt(digits, cat(range('0', '9'), ref(digits)));
  b.alt(digits, {});
  return b.build(root);
}

TEST(GrammarMatcher, AcceptsAndRejectsByteStrings) {
  Matcher m = make(yes_no_grammar());
  EXPECT_TRUE(m.can_accept("yes"));
  EXPECT_TRUE(m.can_accept("no42"));
  EXPECT_FALSE(m.can_accept("yess"));
  EXPECT_FALSE(m.can_accept("nope"));
  EXPECT_FALSE(m.can_accept("x"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept("n"));
  EXPECT_FALSE(m.accept("ox"));  // rejected as a whole: the state stays after "n"
  EXPECT_TRUE(m.accept("o"));
  EXPECT_FALSE(m.can_end()) << "\"no\" needs a digit";
  EXPECT_TRUE(m.accept("7"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end()) << "more digits may follow";
  EXPECT_TRUE(m.accept("99"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept("a"));

  Matcher y = make(yes_no_grammar());
  EXPECT_TRUE(y.accept("yes"));
  EXPECT_TRUE(y.can_end());
  EXPECT_TRUE(y.must_end());
  EXPECT_FALSE(y.can_accept("s"));
  EXPECT_TRUE(y.accept(""));  // nothing to read: always fine
}

TEST(GrammarMatcher, JsonTexts) {
  for (std::string_view ok : {"{}", "{ }", "{\"a\":1}", "{\"a\": [1, -2.5e+3, true, null, \"x\"], \"b\": {\"c\": {}}}",
                              "{\"esc\": \"\\\"\\\\\\n\\u00e9\"}", "{\"u\": \"caf\xC3\xA9 \xF0\x9F\xA6\x99\"}"}) {
    Matcher m = make(json_object_grammar());
    EXPECT_TRUE(m.accept(ok)) << ok;
    EXPECT_TRUE(m.can_end()) << ok;
    EXPECT_TRUE(m.must_end()) << ok;
  }
  for (std::string_view bad : {"[]", "{,}", "{\"a\"}", "{\"a\":01}", "{\"a\":\"\\x\"}", "{\"a\":\"\x01\"}",
                               "{\"a\":\"\xC3\"}", "{\"a\":\"\xC0\x80\"}", "{\"a\":1,}", "{} "}) {
    Matcher m = make(json_object_grammar());
    EXPECT_FALSE(m.accept(bad)) << bad;
  }
  Matcher open = json_after("{\"a\": [1, 2");
  EXPECT_FALSE(open.can_end());
}

TEST(GrammarMatcher, CopyIsAnIndependentCheckpoint) {
  Matcher m = json_after("{\"k\": ");
  const Matcher checkpoint = m;
  EXPECT_TRUE(m.accept("\"draft\""));
  EXPECT_TRUE(m.accept("}"));
  EXPECT_TRUE(m.must_end());
  // The checkpoint still stands before the value: a rollback goes on from there.
  EXPECT_FALSE(checkpoint.can_end());
  Matcher rolled_back = checkpoint;
  EXPECT_TRUE(rolled_back.accept("[1]}"));
  EXPECT_TRUE(rolled_back.must_end());
  EXPECT_FALSE(checkpoint.can_accept("}"));
  // Equal states are equal in canonical form, whatever path led there.
  Matcher a = json_after("{\"k\": \"x\", \"j\": 1");
  Matcher b = json_after("{\"k\":[true, {}], \"j\": 4");
  EXPECT_EQ(a.state_hash(), b.state_hash());
  EXPECT_TRUE(std::equal(a.state().begin(), a.state().end(), b.state().begin(), b.state().end()));
}

TEST(GrammarMatcher, RightRecursionKeepsTheStateFlat) {
  // Inside a string every ordinary character returns to the same state (tail calls push no
  // return position), which is what makes masks inside strings cache hits.
  Matcher m = json_after("{\"k\": \"ab");
  const std::vector<int32_t> before(m.state().begin(), m.state().end());
  EXPECT_TRUE(m.accept("cdefgh\xC3\xA9 long text"));
  EXPECT_EQ(std::vector<int32_t>(m.state().begin(), m.state().end()), before);
}

TEST(GrammarMatcher, MultiByteCharacterSplitAcrossAccepts) {
  Matcher m = json_after("{\"k\": \"");
  EXPECT_TRUE(m.accept("\xF0"));
  EXPECT_FALSE(m.can_accept("\""));  // not inside a character
  EXPECT_FALSE(m.can_accept("\x80")) << "F0 needs 90-BF next (no overlong form)";
  EXPECT_TRUE(m.accept("\x9F"));
  EXPECT_TRUE(m.accept("\xA6"));
  EXPECT_FALSE(m.can_accept("A"));
  EXPECT_TRUE(m.accept("\x99"));
  EXPECT_TRUE(m.accept("\"}"));
  EXPECT_TRUE(m.must_end());
}

TEST(GrammarMatcher, AmbiguityPastTheStackBoundFailsCleanly) {
  // r ::= "a" r "b" | "a" r "c" | "": after n a's, 2^n stacks (one per choice of closers).
  GrammarBuilder b;
  const int32_t r = b.rule("r");
  b.alt(r, cat(lit("a"), ref(r), lit("b")));
  b.alt(r, cat(lit("a"), ref(r), lit("c")));
  b.alt(r, {});
  Matcher m = make(b.build(r));
  int accepted = 0;
  while (accepted < 64 && m.accept("a")) accepted++;
  EXPECT_LT(accepted, 64);
  EXPECT_LE(m.n_stacks(), StateLimits{}.max_stacks);
  EXPECT_GT(m.n_stacks(), StateLimits{}.max_stacks / 4);
  EXPECT_NE(m.budget_error().find("max_stacks"), std::string::npos) << m.budget_error();
  // The refused byte left the state as it was: the closers still read.
  EXPECT_TRUE(m.can_accept("b"));
  EXPECT_TRUE(m.can_accept("c"));
}

TEST(GrammarMatcher, LeftRecursionAndExplodingEmptyRulesAreErrors) {
  {
    GrammarBuilder b;  // root ::= root "a" | "b"  (validate() rejects it; the matcher must not hang)
    const int32_t root = b.rule("root");
    b.alt(root, cat(ref(root), lit("a")));
    b.alt(root, lit("b"));
    auto m = Matcher::create(b.build(root));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("left-recursive"), std::string::npos) << m.error().message;
  }
  {
    GrammarBuilder b;  // e ::= "" | "" | ""; root ::= e e ... e "x": 3^24 ways to read nothing
    const int32_t root = b.rule("root"), e = b.rule("e");
    for (int i = 0; i < 3; i++) b.alt(e, {});
    Seq seq;
    for (int i = 0; i < 24; i++) seq = cat(seq, ref(e));
    b.alt(root, cat(seq, lit("x")));
    auto m = Matcher::create(b.build(root));
    ASSERT_FALSE(m.ok());
  }
  {
    GrammarBuilder b;
    const int32_t root = b.rule("root");
    b.alt(root, ref(7));
    auto m = Matcher::create(b.build(root));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("out of range"), std::string::npos) << m.error().message;
  }
}

// --- Token masks --------------------------------------------------------------------------

// A mask equals asking the matcher about every token's bytes.
TokenMask brute_force(const TokenMasker& masker, const Matcher& m, const std::vector<int32_t>& end_tokens) {
  TokenMask mask;
  mask.bits.assign((masker.n_vocab() + 63) / 64, 0);
  std::vector<bool> is_end(masker.n_vocab());
  for (int32_t t : end_tokens) is_end[t] = true;
  for (int32_t t = 0; t < (int32_t)masker.n_vocab(); t++) {
    const bool ok = is_end[t] ? m.can_end() : !masker.token_bytes(t).empty() && m.can_accept(masker.token_bytes(t));
    if (ok) mask.bits[t / 64] |= 1ull << (t % 64);
  }
  return mask;
}

void expect_same_mask(const TokenMask& got, const TokenMask& want, const TokenMasker& masker, const std::string& where) {
  ASSERT_EQ(got.bits.size(), want.bits.size());
  int shown = 0;
  for (int32_t t = 0; t < (int32_t)masker.n_vocab() && shown < 5; t++)
    if (got.test(t) != want.test(t)) {
      ADD_FAILURE() << where << ": token " << t << " '" << masker.token_bytes(t) << "' mask says " << got.test(t);
      shown++;
    }
}

const std::vector<std::string> kSyntheticVocab = {
    "",  // 0: a control token (emits nothing)
    "{", "}", "[", "]", ",", ":", "\"", " ", "\n", "{\"", "\"}", "\"},", "\":\"", "\": ", "\",\"", "}}", "]}",
    "\\", "\\u", "u00", "e9", "\\u00e9", "\\n", "\\\"", "n", "a", "ab", "abc", "true", "tr", "ue", "null", "1",
    "12", "-", ".", "5e", "+3", "0", "01", "\xC3", "\xA9", "\xC3\xA9", "caf\xC3", "\xF0\x9F", "\xA6\x99",
    "\xF0\x9F\xA6\x99\"", "\xC0", "\xFF", "x\x01", " {", "[{", "}]", "\"a\"", "abc",  // a duplicate of "abc"
    "<eos>",  // the end token (its bytes never count)
};
const int32_t kSyntheticEnd = (int32_t)kSyntheticVocab.size() - 1;

TokenMasker synthetic_masker() { return TokenMasker(kSyntheticVocab, {kSyntheticEnd}); }

int32_t id_of(std::string_view bytes) {
  for (int32_t t = 0; t < (int32_t)kSyntheticVocab.size(); t++)
    if (kSyntheticVocab[t] == bytes) return t;
  ADD_FAILURE() << "no token '" << bytes << "'";
  return -1;
}

TEST(TokenMasker, EqualsBruteForceAtEveryPrefixOfAJsonText) {
  const TokenMasker masker = synthetic_masker();
  const std::string text =
      "{\"a\": [1, -2.5e+3, true, null, \"x\\u00e9\\n\"], \"caf\xC3\xA9\": {\"\xF0\x9F\xA6\x99\": {\"q\": [[\"\\\"\"]]}}, \"z\":0}";
  Matcher m = make(json_object_grammar());
  for (size_t i = 0; i <= text.size(); i++) {
    const TokenMask want = brute_force(masker, m, {kSyntheticEnd});
    const std::string where = "after '" + text.substr(0, i) + "'";
    expect_same_mask(masker.compute(m), want, masker, where + " (whole walk)");
    // Shared walks of the state's top (many prefixes share one: strings at several nestings).
    expect_same_mask(masker.compute_shared(m), want, masker, where + " (shared walk)");
    expect_same_mask(*masker.mask(m), want, masker, where + " (mask)");
    if (i < text.size()) {
      ASSERT_TRUE(m.accept(text.substr(i, 1)));
    }
  }
}

TEST(TokenMasker, TokensSpanningStructuralCharacters) {
  const TokenMasker masker = synthetic_masker();
  const auto nested = masker.mask(json_after("{\"a\":{\"b\":\"c"));
  EXPECT_TRUE(nested->test(id_of("\"},"))) << "closes the string and the inner object, then a comma";
  EXPECT_TRUE(nested->test(id_of("\"}")));
  EXPECT_TRUE(nested->test(id_of("abc")));
  const auto top = masker.mask(json_after("{\"a\":\"c"));
  EXPECT_TRUE(top->test(id_of("\"}")));
  EXPECT_FALSE(top->test(id_of("\"},"))) << "nothing follows the top-level object";
  const auto key = masker.mask(json_after("{\"a"));
  EXPECT_TRUE(key->test(id_of("\":\"")));
  EXPECT_TRUE(key->test(id_of("\": ")));
  EXPECT_FALSE(key->test(id_of("\"}"))) << "a key needs a value";
  const auto start = masker.mask(json_after(""));
  EXPECT_TRUE(start->test(id_of("{")));
  EXPECT_TRUE(start->test(id_of("{\"")));
  EXPECT_FALSE(start->test(id_of("[")));
  EXPECT_FALSE(start->test(id_of(" {"))) << "the grammar has no leading whitespace";
  const auto value = masker.mask(json_after("{\"a\": "));
  EXPECT_TRUE(value->test(id_of("tr")));
  EXPECT_TRUE(value->test(id_of("[{")));
  EXPECT_FALSE(value->test(id_of("ue")));
  EXPECT_FALSE(value->test(id_of("01")));
  EXPECT_TRUE(value->test(id_of("0")));
}

TEST(TokenMasker, PartialEscapes) {
  const TokenMasker masker = synthetic_masker();
  Matcher m = json_after("{\"a\":\"");
  EXPECT_TRUE(masker.mask(m)->test(id_of("\\")));
  EXPECT_TRUE(masker.mask(m)->test(id_of("\\u00e9")));
  ASSERT_TRUE(m.accept("\\"));
  auto after_backslash = masker.mask(m);
  EXPECT_TRUE(after_backslash->test(id_of("u00")));
  EXPECT_TRUE(after_backslash->test(id_of("n")));
  EXPECT_TRUE(after_backslash->test(id_of("\"}"))) << "\\\" is an escape, then } is an ordinary character";
  EXPECT_FALSE(after_backslash->test(id_of("e9")));
  EXPECT_FALSE(after_backslash->test(id_of("a")));
  EXPECT_TRUE(after_backslash->test(id_of("\\u"))) << "an escaped backslash, then an ordinary u";
  ASSERT_TRUE(m.accept("u00"));
  auto after_u00 = masker.mask(m);
  EXPECT_TRUE(after_u00->test(id_of("e9")));
  EXPECT_FALSE(after_u00->test(id_of("u00")));
  EXPECT_FALSE(after_u00->test(id_of("\"")));
  EXPECT_TRUE(after_u00->test(id_of("abc"))) << "\\u00ab, then an ordinary c";
  EXPECT_FALSE(after_u00->test(id_of("n")));
  ASSERT_TRUE(m.accept("e9"));
  EXPECT_TRUE(masker.mask(m)->test(id_of("\"}")));
  EXPECT_EQ(masker.mask(m)->count(), masker.mask(json_after("{\"a\":\"x"))->count()) << "back to an ordinary string state";
}

TEST(TokenMasker, MultiByteCharacterSplitAcrossTokens) {
  const TokenMasker masker = synthetic_masker();
  Matcher m = json_after("{\"a\":\"");
  auto in_string = masker.mask(m);
  EXPECT_TRUE(in_string->test(id_of("\xC3")));
  EXPECT_TRUE(in_string->test(id_of("caf\xC3")));
  EXPECT_TRUE(in_string->test(id_of("\xF0\x9F")));
  EXPECT_FALSE(in_string->test(id_of("\xA9"))) << "a continuation byte cannot start a character";
  EXPECT_FALSE(in_string->test(id_of("\xC0")));
  EXPECT_FALSE(in_string->test(id_of("\xFF")));
  EXPECT_FALSE(in_string->test(id_of("x\x01")));
  ASSERT_TRUE(m.accept("caf\xC3"));
  auto mid = masker.mask(m);
  EXPECT_TRUE(mid->test(id_of("\xA9")));
  EXPECT_EQ(mid->count(), 1u) << "only the continuation byte";
  Matcher four = json_after("{\"a\":\"");
  ASSERT_TRUE(four.accept("\xF0\x9F"));
  auto mid4 = masker.mask(four);
  EXPECT_TRUE(mid4->test(id_of("\xA6\x99")));
  EXPECT_TRUE(mid4->test(id_of("\xA9")));
  EXPECT_FALSE(mid4->test(id_of("\"")));
  EXPECT_FALSE(mid4->test(id_of("a")));
  ASSERT_TRUE(four.accept("\xA6\x99"));
  EXPECT_TRUE(masker.mask(four)->test(id_of("\"}")));
}

TEST(TokenMasker, EndTokensOnlyWhenTheTextCanEndAndControlTokensNever) {
  const TokenMasker masker = synthetic_masker();
  for (std::string_view text : {"", "{", "{\"a\":1", "{\"a\":\"\\u00"}) {
    auto mask = masker.mask(json_after(text));
    EXPECT_FALSE(mask->test(kSyntheticEnd)) << text;
    EXPECT_FALSE(mask->test(0)) << text;
  }
  Matcher done = json_after("{\"a\":1}");
  auto mask = masker.mask(done);
  EXPECT_TRUE(mask->test(kSyntheticEnd));
  EXPECT_EQ(mask->count(), 1u) << "must_end: only the end token";
  EXPECT_TRUE(masker.allows(done, kSyntheticEnd));
  EXPECT_FALSE(masker.allows(done, id_of("}")));
  EXPECT_FALSE(masker.allows(done, 0));
  EXPECT_FALSE(masker.allows(done, -1));
  EXPECT_FALSE(masker.allows(done, (int32_t)kSyntheticVocab.size()));
  // A grammar that may end or go on: the end token and more text both allowed.
  Matcher no7 = make(yes_no_grammar());
  ASSERT_TRUE(no7.accept("no7"));
  const TokenMasker digits({"", "1", "12", "x", "</s>"}, {4});
  auto both = digits.mask(no7);
  EXPECT_TRUE(both->test(4));
  EXPECT_TRUE(both->test(1));
  EXPECT_TRUE(both->test(2));
  EXPECT_FALSE(both->test(3));
  EXPECT_FALSE(both->test(0));
}

// Token terminals (token_terminal.h): a control token is allowed exactly where the grammar
// names it, and ordinary tokens spelling its text never are.
std::shared_ptr<const Grammar> parsed(const std::string& gbnf_text) {
  auto g = parse_gbnf(gbnf_text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? g.value() : nullptr;
}

TEST(TokenMasker, ControlTokensWhereTheGrammarNamesThem) {
  const std::vector<std::string> vocab = {token_terminal_bytes("<|channel|>"), "<|", "channel", "|>", "<|channel|>",
                                          "comment", "ary", token_terminal_bytes("<|message|>"), "\xFE<|channel|>\xFE",
                                          token_terminal_bytes("<|call|>"), token_terminal_bytes("<|return|>")};
  enum { kChannel, kOpen, kWord, kClose, kWhole, kComment, kAry, kMessage, kStandIns, kCall, kReturn };
  const TokenMasker masker(vocab, {kCall, kReturn});
  EXPECT_EQ(masker.token_bytes(kCall), "") << "an end token is never read by the matcher";

  Matcher m = make(parsed("root ::= <|channel|> \"commentary\" <|message|> \"x\"? <|call|>"));
  auto start = masker.mask(m);
  EXPECT_TRUE(start->test(kChannel));
  EXPECT_EQ(start->count(), 1u) << "neither '<|' nor the text '<|channel|>' is the token";
  EXPECT_TRUE(masker.allows(m, kChannel));
  EXPECT_FALSE(masker.allows(m, kWhole));
  ASSERT_TRUE(m.accept(masker.token_bytes(kChannel)));
  EXPECT_TRUE(masker.mask(m)->test(kComment));
  ASSERT_TRUE(m.accept("commentary"));
  auto before_message = masker.mask(m);
  EXPECT_TRUE(before_message->test(kMessage));
  EXPECT_EQ(before_message->count(), 1u);
  ASSERT_TRUE(m.accept(masker.token_bytes(kMessage)));
  // The grammar ends with <|call|>, an end token: allowed although the text cannot end here,
  // where <|return|>, another end token, is not.
  auto at_call = masker.mask(m);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(at_call->test(kCall));
  EXPECT_FALSE(at_call->test(kReturn));
  EXPECT_TRUE(masker.allows(m, kCall));
  EXPECT_FALSE(masker.allows(m, kReturn));
  for (int32_t t = 0; t < (int32_t)vocab.size(); t++) EXPECT_EQ(masker.allows(m, t), masker.compute(m).test(t)) << t;

  // A text rule never takes a control token, the same text in ordinary tokens it does.
  Matcher text = make(parsed("root ::= \"<|channel|>\" [^x]*"));
  auto text_start = masker.mask(text);
  EXPECT_TRUE(text_start->test(kOpen));
  EXPECT_TRUE(text_start->test(kWhole));
  EXPECT_FALSE(text_start->test(kChannel));
  ASSERT_TRUE(text.accept("<|channel|>"));
  auto free_text = masker.mask(text);
  EXPECT_TRUE(free_text->test(kComment));
  EXPECT_FALSE(free_text->test(kChannel));
  EXPECT_FALSE(free_text->test(kMessage));
  EXPECT_FALSE(free_text->test(kStandIns)) << "0xFE is no character";
  EXPECT_TRUE(free_text->test(kCall)) << "the text can end: every end token";
  EXPECT_TRUE(free_text->test(kReturn));
}

TEST(TokenMasker, ControlTokensOfTheO200kVocabulary) {
  if (!tandem::test::exists(tandem::test::o200k_vocab_path())) GTEST_SKIP() << "no o200k vocabulary (scripts/setup.sh --models all)";
  auto f = GgufFile::open(tandem::test::o200k_vocab_path());
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto tok = Tokenizer::from_gguf(*f.value());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const Vocab& v = tok.value()->vocab();
  const int32_t channel = v.find("<|channel|>"), call = v.find("<|call|>");
  ASSERT_GE(channel, 0);
  EXPECT_EQ(grammar_token_bytes(*tok.value(), channel), token_terminal_bytes("<|channel|>"));
  // A byte-level vocabulary has a token for the byte 0xFF itself: it never stands for a mark.
  int32_t ff = -1;
  for (int32_t t = 0; t < v.size() && ff < 0; t++)
    if (tok.value()->token_to_piece(t) == "\xFF") ff = t;
  ASSERT_GE(ff, 0);
  EXPECT_EQ(grammar_token_bytes(*tok.value(), ff), "\xFE");
  auto masker = TokenMasker::for_tokenizer(*tok.value(), v.end_of_generation);
  Matcher m = make(parsed("root ::= <|channel|> \"commentary to=functions.f \" <|constrain|> \"json\" <|message|> \"{}\" <|call|>"));
  auto start = masker->mask(m);
  EXPECT_TRUE(start->test(channel));
  EXPECT_EQ(start->count(), 1u);
  for (std::string_view piece : {std::string_view(masker->token_bytes(channel)), std::string_view("commentary to=functions.f "),
                                 std::string_view(masker->token_bytes(v.find("<|constrain|>"))), std::string_view("json"),
                                 std::string_view(masker->token_bytes(v.find("<|message|>"))), std::string_view("{}")})
    ASSERT_TRUE(m.accept(piece)) << piece;
  auto end = masker->mask(m);
  EXPECT_TRUE(end->test(call));
  EXPECT_EQ(end->count(), 1u) << "<|call|> only, not <|return|> nor <|endoftext|>";
  // A grammar naming a token the vocabulary lacks, or has as text, is refused before it runs.
  EXPECT_TRUE(check_token_terminals(m.grammar(), *tok.value()).ok());
  for (const char* bad : {"root ::= <|channel|> <|nonsense|>", "root ::= <think>"}) {
    auto g = parsed(bad);
    ASSERT_TRUE(g);
    const Status s = check_token_terminals(*g, *tok.value());
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.error().message.find("not a control token of this model's vocabulary"), std::string::npos) << s.error().message;
  }
}

TEST(TokenMasker, AllowsAgreesWithTheMask) {
  const TokenMasker masker = synthetic_masker();
  for (std::string_view text : {"", "{\"a\":", "{\"a\":\"\\", "{\"a\":[1", "{\"a\":\"caf\xC3"}) {
    Matcher m = json_after(text);
    const TokenMask full = masker.compute(m);
    for (int32_t t = 0; t < (int32_t)masker.n_vocab(); t++) EXPECT_EQ(masker.allows(m, t), full.test(t)) << text << " token " << t;
    masker.mask(m);  // now cached: allows() reads the cached mask
    for (int32_t t = 0; t < (int32_t)masker.n_vocab(); t++) EXPECT_EQ(masker.allows(m, t), full.test(t)) << text << " token " << t;
  }
}

TEST(TokenMasker, CacheReturnsTheSameMaskForTheSameState) {
  const TokenMasker masker = synthetic_masker();
  const auto first = masker.mask(json_after("{\"a\": \"xy"));
  const auto stats = masker.cache_stats();
  // Another request, another path to the same state (inside a string at the same nesting).
  const auto second = masker.mask(json_after("{\"b\": \"long words"));
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(masker.cache_stats().hits, stats.hits + 1);
  // Another grammar object with equal rules is another cache key (states are per grammar).
  Matcher other = make(json_object_grammar());
  ASSERT_TRUE(other.accept("{\"a\": \"xy"));
  EXPECT_NE(masker.mask(other).get(), first.get());
  EXPECT_EQ(masker.mask(other)->bits, first->bits);
}

TEST(TokenMasker, StatesWithOneTopShareAWalk) {
  const TokenMasker masker = synthetic_masker();
  const std::vector<std::string> strings = {"{\"a\": \"x", "{\"a\": [\"x", "{\"a\": {\"b\": [[\"x", "{\"", "{\"a\": {\""};
  for (const auto& text : strings) {
    Matcher m = json_after(text);
    expect_same_mask(*masker.mask(m), brute_force(masker, m, {kSyntheticEnd}), masker, text);
  }
  const auto stats = masker.cache_stats();
  EXPECT_EQ(stats.misses, strings.size()) << "five states";
  EXPECT_EQ(stats.walk_misses, 1u) << "one top: inside a string";
  EXPECT_EQ(stats.walk_hits, strings.size() - 1);
  // What the cut-off frames decide differs: a closing quote then '}' only where an object closes.
  EXPECT_TRUE(masker.mask(json_after("{\"a\": \"x"))->test(id_of("\"}")));
  EXPECT_FALSE(masker.mask(json_after("{\"a\": [\"x"))->test(id_of("\"}")));
  EXPECT_TRUE(masker.mask(json_after("{\"a\": [\"x"))->test(id_of("\",\"")));
  EXPECT_FALSE(masker.mask(json_after("{\"a\": {\"b\": [[\"x"))->test(id_of("\"},")));
  EXPECT_TRUE(masker.mask(json_after("{\""))->test(id_of("\":\"")));
  EXPECT_FALSE(masker.mask(json_after("{\"a\": {\""))->test(id_of("\"}")));
}

TEST(TokenMasker, CacheIsBoundedAndThreadSafe) {
  const TokenMasker masker(kSyntheticVocab, {kSyntheticEnd}, /*cache_entries=*/4);
  auto g = json_object_grammar();
  std::vector<std::string> prefixes;
  for (int depth = 0; depth < 12; depth++) prefixes.push_back(std::string("{\"a\":[") + std::string(depth, '[') + "1");
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int k = 0; k < 4; k++)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 20; round++)
        for (const auto& p : prefixes) {
          Matcher m = Matcher::create(g).value();
          if (!m.accept(p)) failures[k]++;
          if (masker.mask(m)->bits != masker.compute(m).bits) failures[k]++;
        }
    });
  for (auto& t : threads) t.join();
  for (int f : failures) EXPECT_EQ(f, 0);
  EXPECT_LE(masker.cache_stats().entries, 4u);
}

// --- Real vocabularies --------------------------------------------------------------------

std::shared_ptr<const TokenMasker> masker_for(const std::string& path, std::unique_ptr<Tokenizer>& tok_out) {
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return nullptr;
  auto tok = Tokenizer::from_gguf(*f.value());
  EXPECT_TRUE(tok.ok()) << tok.error().message;
  if (!tok.ok()) return nullptr;
  tok_out = std::move(tok.value());
  return TokenMasker::for_tokenizer(*tok_out, tok_out->vocab().end_of_generation);
}

TEST(TokenMasker, EqualsBruteForceOnTheSmolLM2Vocabulary) {
  if (!tandem::test::exists(tandem::test::default_model_path())) GTEST_SKIP() << "model not found";
  std::unique_ptr<Tokenizer> tok;
  auto masker = masker_for(tandem::test::default_model_path(), tok);
  ASSERT_TRUE(masker);
  const auto& eog = tok->vocab().end_of_generation;
  ASSERT_FALSE(eog.empty());
  for (std::string_view text : {"", "{", "{\"na", "{\"name\": ", "{\"name\": \"Al\\", "{\"name\": \"Al\\u0", "{\"n\": [1.5",
                                "{\"n\": \"caf\xC3", "{\"a\": {\"b\": []}}", "{\"a\": [{\"b\": \"x y", "{\"a\": [[\"\\n"}) {
    Matcher m = json_after(text);
    const auto mask = masker->mask(m);
    expect_same_mask(*mask, brute_force(*masker, m, eog), *masker, "after '" + std::string(text) + "'");
    EXPECT_GT(mask->count(), 0u) << text;
  }
  EXPECT_GT(masker->cache_stats().walk_hits, 0u) << "strings at several nestings share the walk of their top";
  // Control tokens (<|im_start|>, ...) emit nothing: never allowed, even inside a string.
  const auto in_string = masker->mask(json_after("{\"a\": \""));
  for (int32_t t = 0; t < tok->vocab().size(); t++)
    if (tok->vocab().is_control(t) && !tok->vocab().is_eog(t)) {
      EXPECT_FALSE(in_string->test(t)) << t;
    }
  EXPECT_GT(in_string->count(), 40000u) << "almost every token may go inside a string";
}

// Sampling under the masks always yields JSON, as a parser independent of tandem reads it.
TEST(TokenMasker, SampledOutputsAreJsonOnTheSmolLM2Vocabulary) {
  if (!tandem::test::exists(tandem::test::default_model_path())) GTEST_SKIP() << "model not found";
  std::unique_ptr<Tokenizer> tok;
  auto masker = masker_for(tandem::test::default_model_path(), tok);
  ASSERT_TRUE(masker);
  const auto& eog = tok->vocab().end_of_generation;
  std::vector<bool> closes(masker->n_vocab());
  for (int32_t t = 0; t < (int32_t)masker->n_vocab(); t++)
    closes[t] = masker->token_bytes(t).find_first_of("}]\"") != std::string::npos;
  int finished = 0;
  for (uint32_t seed = 1; seed <= 16; seed++) {
    std::mt19937 rng(seed);
    Matcher m = make(shared_json_grammar());
    std::string text;
    bool ended = false;
    for (int step = 0; step < 150 && !ended; step++) {
      const auto mask = masker->mask(m);
      std::vector<int32_t> allowed, closing;
      for (size_t w = 0; w < mask->bits.size(); w++)
        for (uint64_t bits = mask->bits[w]; bits; bits &= bits - 1) {
          const auto t = (int32_t)(w * 64 + std::countr_zero(bits));
          allowed.push_back(t);
          if (closes[t]) closing.push_back(t);
        }
      ASSERT_FALSE(allowed.empty()) << "no token may follow '" << text << "'";
      // Wander for a while, then steer towards an end so most runs finish.
      const auto& pool = step > 40 && !closing.empty() ? closing : allowed;
      const int32_t t = pool[rng() % pool.size()];
      if (std::find(eog.begin(), eog.end(), t) != eog.end()) {
        ASSERT_TRUE(m.can_end()) << text;
        ended = true;
        break;
      }
      ASSERT_TRUE(m.accept(masker->token_bytes(t))) << "a masked-in token was refused after '" << text << "'";
      text += masker->token_bytes(t);
      if (m.must_end()) ended = true;
    }
    if (!ended) continue;
    finished++;
    const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(parsed.is_discarded()) << "seed " << seed << ": not JSON: " << text;
    EXPECT_TRUE(parsed.is_object()) << "seed " << seed << ": " << text;
  }
  EXPECT_GE(finished, 10) << "most sampled runs reach the end of an object";
}

TEST(TokenMasker, EqualsBruteForceOnTheGemmaVocabulary) {
  if (!tandem::test::exists(tandem::test::gemma_model_path())) GTEST_SKIP() << "Gemma 3 not found";
  std::unique_ptr<Tokenizer> tok;
  auto masker = masker_for(tandem::test::gemma_model_path(), tok);
  ASSERT_TRUE(masker);
  EXPECT_EQ(masker->n_vocab(), (size_t)tok->vocab().size());
  Matcher m = json_after("{\"key\": \"val");
  expect_same_mask(*masker->mask(m), brute_force(*masker, m, tok->vocab().end_of_generation), *masker, "in a string");
}

}  // namespace
}  // namespace tandem::grammar
