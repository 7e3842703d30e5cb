// The grammar IR (validate, utf8_class_sequences) and the GBNF front end, checked with a
// test-only Earley recognizer (grammar_recognizer.h): each feature accepts exactly what it should.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include <fmt/format.h>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/token_terminal.h"
#include "grammar_recognizer.h"

namespace tandem::grammar {
namespace {

std::shared_ptr<const Grammar> gbnf(const std::string& text, const GrammarLimits& limits = {}) {
  auto g = parse_gbnf(text, limits);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message) << "\n" << text;
  return g.ok() ? g.value() : nullptr;
}

std::string gbnf_error(const std::string& text, const GrammarLimits& limits = {}) {
  auto g = parse_gbnf(text, limits);
  EXPECT_FALSE(g.ok()) << "accepted:\n" << text;
  return g.ok() ? "" : g.error().message;
}

#define EXPECT_ACCEPTS(g, s) EXPECT_TRUE(test::earley_accepts(*(g), s)) << "should accept: " << (s)
#define EXPECT_REJECTS(g, s) EXPECT_FALSE(test::earley_accepts(*(g), s)) << "should reject: " << (s)

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// --- utf8_class_sequences -------------------------------------------------------------------

bool sequences_match(const std::vector<Sequence>& seqs, const std::string& bytes) {
  for (const Sequence& s : seqs) {
    if (s.size() != bytes.size()) continue;
    bool all = true;
    for (size_t i = 0; i < s.size(); i++) all = all && s[i].matches(static_cast<uint8_t>(bytes[i]));
    if (all) return true;
  }
  return false;
}

// Every code point is matched exactly when it lies in [lo, hi], and the sequences together match
// no more byte strings than there are such code points (so nothing else: no surrogate, no overlong
// form, no sequence matched twice).
void check_range_brute_force(uint32_t lo, uint32_t hi) {
  const std::vector<Sequence> seqs = utf8_class_sequences(lo, hi);
  uint64_t in_range = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const bool want = cp >= lo && cp <= hi;
    in_range += want;
    ASSERT_EQ(sequences_match(seqs, utf8(cp)), want) << std::hex << "U+" << cp << " in [" << lo << ", " << hi << "]";
  }
  uint64_t matched = 0;
  for (const Sequence& s : seqs) {
    uint64_t product = 1;
    for (const Element& e : s) {
      ASSERT_EQ(e.kind, Element::Kind::Bytes);
      uint64_t count = 0;
      for (int b = 0; b < 256; b++) count += e.matches(static_cast<uint8_t>(b));
      product *= count;
    }
    matched += product;
  }
  EXPECT_EQ(matched, in_range) << std::hex << "[" << lo << ", " << hi << "]";
}

TEST(Utf8ClassSequences, MatchesExactlyTheRangeByBruteForce) {
  const std::pair<uint32_t, uint32_t> ranges[] = {
      {0, 0x10FFFF}, {0x41, 0x5A},     {0x7F, 0x80},     {0x80, 0x7FF},   {0x7FF, 0x800},    {0xFFFF, 0x10000},
      {0xD7FF, 0xE000}, {0xD800, 0xDFFF}, {0x123, 0x4567}, {0x10FFFF, 0x10FFFF}, {0xE9, 0xE9}, {0x1F600, 0x1F64F},
      {0x3FF, 0x10401}, {0x20, 0xD800}};
  for (const auto& [lo, hi] : ranges) check_range_brute_force(lo, hi);
  std::mt19937 rng(7);
  for (int i = 0; i < 4; i++) {
    uint32_t a = rng() % 0x110000, b = rng() % 0x110000;
    check_range_brute_force(std::min(a, b), std::max(a, b));
  }
}

TEST(Utf8ClassSequences, TwoByteRangeIsOneSequence) {
  const auto seqs = utf8_class_sequences(0x80, 0x7FF);
  ASSERT_EQ(seqs.size(), 1u);
  ASSERT_EQ(seqs[0].size(), 2u);
  EXPECT_TRUE(seqs[0][0].matches(0xC2) && seqs[0][0].matches(0xDF) && !seqs[0][0].matches(0xC1));
  EXPECT_TRUE(seqs[0][1].matches(0x80) && seqs[0][1].matches(0xBF) && !seqs[0][1].matches(0xC0));
  EXPECT_TRUE(utf8_class_sequences(0xD800, 0xDFFF).empty());
  EXPECT_TRUE(utf8_class_sequences(5, 4).empty());
}

// --- validate ---------------------------------------------------------------------------------

Grammar two_rules() {
  Grammar g;
  g.source = "test";
  g.rules.push_back(Rule{"root", {Sequence{Element::ref(1), Element::byte('x')}}});
  g.rules.push_back(Rule{"a", {Sequence{Element::byte('a')}, Sequence{}}});
  return g;
}

TEST(GrammarValidate, AcceptsAWellFormedGrammar) {
  EXPECT_TRUE(validate(two_rules()).ok());
}

TEST(GrammarValidate, RejectsBadReferencesEmptyRulesAndRoot) {
  Grammar g = two_rules();
  g.rules[0].alternatives[0].push_back(Element::ref(7));
  auto s = validate(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'root' refers to rule 7"), std::string::npos) << s.error().message;
  g = two_rules();
  g.rules[1].alternatives.clear();
  s = validate(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("'a' has no alternative"), std::string::npos) << s.error().message;
  g = two_rules();
  g.root = 2;
  EXPECT_FALSE(validate(g).ok());
  EXPECT_FALSE(validate(Grammar{}).ok());
}

TEST(GrammarValidate, RejectsLeftRecursionThroughNullablePrefixes) {
  Grammar g = two_rules();
  // a ::= "a" | (empty) ; b ::= a root ; root ::= a b "x": root -> b (after nullable a) -> root.
  g.rules.push_back(Rule{"b", {Sequence{Element::ref(1), Element::ref(0)}}});
  g.rules[0].alternatives[0].insert(g.rules[0].alternatives[0].begin() + 1, Element::ref(2));
  auto s = validate(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("left-recursive"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("root -> b -> root"), std::string::npos) << s.error().message;
  // The same shape with a byte before the recursion is fine.
  g.rules[2].alternatives[0].insert(g.rules[2].alternatives[0].begin(), Element::byte('z'));
  EXPECT_TRUE(validate(g).ok());
}

TEST(GrammarValidate, EnforcesLimits) {
  GrammarLimits limits;
  limits.max_rules = 1;
  EXPECT_FALSE(validate(two_rules(), limits).ok());
  limits = {};
  limits.max_elements = 2;
  EXPECT_FALSE(validate(two_rules(), limits).ok());
}

TEST(GrammarValidate, NullableRulesAgreeWithNaiveFixedPoint) {
  auto g = gbnf("root ::= a b c\na ::= \"x\"? b\nb ::= (c | \"\")\nc ::= \"q\"* | d\nd ::= \"d\"\n");
  ASSERT_TRUE(g);
  EXPECT_EQ(nullable_rules(*g), test::naive_nullable(*g));
}

// --- GBNF: features ----------------------------------------------------------------------------

TEST(Gbnf, LiteralsAndEscapes) {
  auto g = gbnf(R"(root ::= "a\n\t\r\\\"\[\]\x41\u00e9\U0001F600" "é")");
  ASSERT_TRUE(g);
  EXPECT_ACCEPTS(g, "a\n\t\r\\\"[]A\xC3\xA9\xF0\x9F\x98\x80\xC3\xA9");
  EXPECT_REJECTS(g, "a\n\t\r\\\"[]A\xC3\xA9\xF0\x9F\x98\x80");
  // \x is a code point (as llama.cpp reads it): \xFF is U+00FF, two bytes in UTF-8.
  auto ff = gbnf(R"(root ::= "\xFF")");
  ASSERT_TRUE(ff);
  EXPECT_ACCEPTS(ff, "\xC3\xBF");
  EXPECT_REJECTS(ff, "\xFF");
}

TEST(Gbnf, CharacterClasses) {
  auto g = gbnf("root ::= [a-c0-9_]");
  ASSERT_TRUE(g);
  for (const char* s : {"a", "b", "c", "0", "9", "_"}) EXPECT_ACCEPTS(g, s);
  for (const char* s : {"d", "A", "-", "", "ab"}) EXPECT_REJECTS(g, s);
  auto dash = gbnf("root ::= [-a] [a-] [\\]\\[]");
  ASSERT_TRUE(dash);
  EXPECT_ACCEPTS(dash, "--]");
  EXPECT_ACCEPTS(dash, "aa[");
  auto greek = gbnf("root ::= [α-ω]+");
  ASSERT_TRUE(greek);
  EXPECT_ACCEPTS(greek, "αβγω");
  EXPECT_REJECTS(greek, "αbγ");
}

TEST(Gbnf, NegatedClassCoversMultiByteCharacters) {
  auto g = gbnf(R"(root ::= [^a-zé"\\])");
  ASSERT_TRUE(g);
  for (std::string s : {"A", "\xC3\xBC" /* ü */, "\xF0\x9F\x98\x80" /* 😀 */, "\xE2\x82\xAC" /* € */, "\xF4\x8F\xBF\xBF"})
    EXPECT_ACCEPTS(g, s);
  EXPECT_ACCEPTS(g, std::string(1, '\0'));
  for (std::string s : {"a", "z", "\xC3\xA9" /* é */, "\"", "\\", "\xC3" /* half of a character */,
                        "\xED\xA0\x80" /* a surrogate */, "\xC0\x80" /* overlong NUL */, "\xFF", "AB"})
    EXPECT_REJECTS(g, s);
}

TEST(Gbnf, AnyCharacter) {
  auto g = gbnf("root ::= . \"!\"");
  ASSERT_TRUE(g);
  for (std::string s : {"a!", "\xC3\xA9!", "\xF0\x9F\x98\x80!", "\n!"}) EXPECT_ACCEPTS(g, s);
  for (std::string s : {"!", "ab!", "\xFF!", "\xC3!"}) EXPECT_REJECTS(g, s);
}

// A control token by its text: the one byte string token_terminal_bytes gives it, which no
// text (UTF-8, every text rule's alphabet) spells.
TEST(GbnfTokens, MatchTheTokenAndNoText) {
  auto g = gbnf("root ::= <|channel|> \"commentary\" <|message|>");
  ASSERT_TRUE(g);
  const std::string channel = token_terminal_bytes("<|channel|>"), message = token_terminal_bytes("<|message|>");
  EXPECT_EQ(channel, "\xFF<|channel|>\xFF");
  EXPECT_TRUE(is_token_terminal(channel));
  EXPECT_FALSE(is_token_terminal("<|channel|>"));
  EXPECT_ACCEPTS(g, channel + "commentary" + message);
  EXPECT_REJECTS(g, "<|channel|>commentary<|message|>");  // the same text in ordinary tokens
  EXPECT_REJECTS(g, channel + "commentary" + token_terminal_bytes("<|end|>"));
  EXPECT_REJECTS(g, message + "commentary" + channel);
  EXPECT_REJECTS(g, channel + "commentary");
}

TEST(GbnfTokens, MixWithTextRulesRepetitionAndGroups) {
  auto g = gbnf(R"(root ::= (<think> text </think>)? answer <|end|>*
text ::= [^<]*
answer ::= "yes" | <|no|>)");
  ASSERT_TRUE(g);
  const std::string open = token_terminal_bytes("<think>"), close = token_terminal_bytes("</think>");
  const std::string end = token_terminal_bytes("<|end|>"), no = token_terminal_bytes("<|no|>");
  EXPECT_ACCEPTS(g, "yes");
  EXPECT_ACCEPTS(g, no);
  EXPECT_ACCEPTS(g, open + "a thought" + close + "yes" + end + end);
  EXPECT_ACCEPTS(g, open + close + no + end);
  EXPECT_REJECTS(g, "<think>a thought</think>yes");
  EXPECT_REJECTS(g, open + "a thought" + "yes");
  EXPECT_REJECTS(g, "<|no|>");
  // `.` and a negated class cover every character, never a token.
  auto any = gbnf("root ::= .* <|end|>");
  ASSERT_TRUE(any);
  EXPECT_ACCEPTS(any, "free text, <|end|> included" + end);
  EXPECT_REJECTS(any, "text" + end + "more" + end);
  EXPECT_REJECTS(any, "text" + token_terminal_bytes("<|start|>") + end);
}

TEST(GbnfTokens, TheGrammarListsTheTokensItNames) {
  auto g = gbnf("root ::= <|a|> (\"x\" <|b|>)* <|a|> [^<]+ <c>?\nunused ::= \"<|d|>\"");
  ASSERT_TRUE(g);
  EXPECT_EQ(token_terminal_texts(*g), (std::vector<std::string>{"<|a|>", "<|b|>", "<c>"}));
  auto none = gbnf("root ::= \"<|a|>\" [<|>]");
  ASSERT_TRUE(none);
  EXPECT_TRUE(token_terminal_texts(*none).empty());
}

TEST(GbnfTokens, Errors) {
  EXPECT_NE(gbnf_error("root ::= <[200005]>\n").find("token ids (<[200005]>) are not supported"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= !<|end|>\n").find("negated token"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= <|channel|\n").find("unterminated token"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= <|a b|>\n").find("unterminated token"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= <>\n").find("empty token"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= <" + std::string(300, 'a') + ">\n").find("longer than 256 bytes"), std::string::npos);
  EXPECT_NE(gbnf_error("root ::= \"a\"\nx ::= <y\n").find("line 2"), std::string::npos);
}

TEST(Gbnf, RepetitionBounds) {
  auto zero = gbnf(R"(root ::= "ab"{0,0} "x")");
  ASSERT_TRUE(zero);
  EXPECT_ACCEPTS(zero, "x");
  EXPECT_REJECTS(zero, "abx");
  auto exact = gbnf(R"(root ::= "ab"{3})");
  ASSERT_TRUE(exact);
  EXPECT_ACCEPTS(exact, "ababab");
  for (const char* s : {"abab", "abababab", ""}) EXPECT_REJECTS(exact, s);
  auto at_least = gbnf(R"(root ::= "a"{2,})");
  ASSERT_TRUE(at_least);
  for (const char* s : {"aa", "aaa", "aaaaaaaaaa"}) EXPECT_ACCEPTS(at_least, s);
  for (const char* s : {"", "a"}) EXPECT_REJECTS(at_least, s);
  auto between = gbnf(R"(root ::= [0-9]{1,3} "." [0-9]{ 0 , 2 })");
  ASSERT_TRUE(between);
  for (const char* s : {"1.", "123.45", "12.3"}) EXPECT_ACCEPTS(between, s);
  for (const char* s : {".5", "1234.5", "1.234"}) EXPECT_REJECTS(between, s);
  auto ops = gbnf(R"(root ::= "a"* "b"+ "c"?)");
  ASSERT_TRUE(ops);
  for (const char* s : {"b", "aab", "abbbc", "bc"}) EXPECT_ACCEPTS(ops, s);
  for (const char* s : {"", "a", "c", "abcc"}) EXPECT_REJECTS(ops, s);
}

TEST(Gbnf, BoundedRepetitionIsLinearAndShared) {
  auto g = gbnf(R"(root ::= "a"{0,1000} "b" "a"{0,1000} "c"{5,900})");
  ASSERT_TRUE(g);
  size_t elements = 0;
  for (const Rule& r : g->rules)
    for (const Sequence& s : r.alternatives) elements += s.size();
  // One chain of 1000 optionals for "a" (shared by both uses), one of 895 for "c".
  EXPECT_LT(g->rules.size(), 2000u);
  EXPECT_LT(elements, 4200u);
  EXPECT_ACCEPTS(g, "aaabaccccc");
  EXPECT_REJECTS(g, "aaabacccc");
  // Nested bounded repetitions stay small too.
  auto nested = gbnf(R"(root ::= (("x"{1,1000}){0,1000}){2,1000})");
  ASSERT_TRUE(nested);
  EXPECT_LT(nested->rules.size(), 3100u);
}

TEST(Gbnf, GroupsAlternativesAndRecursion) {
  auto g = gbnf(R"(root ::= ( "a" ( "b" | "c" )+ )* "d")");
  ASSERT_TRUE(g);
  for (const char* s : {"d", "abd", "abcbacd"}) EXPECT_ACCEPTS(g, s);
  for (const char* s : {"ad", "abc", "bd"}) EXPECT_REJECTS(g, s);
  auto parens = gbnf("root ::= \"(\" root \")\" root | \"\"");
  ASSERT_TRUE(parens);
  for (const char* s : {"", "()", "(())()"}) EXPECT_ACCEPTS(parens, s);
  for (const char* s : {"(", "())", ")("}) EXPECT_REJECTS(parens, s);
}

TEST(Gbnf, CommentsMultiLineRulesAndNames) {
  auto g = gbnf(R"(# a comment before the rules
root ::= greeting ws_1 name   # trailing comment
greeting ::=
    "hello"
  | "hi"          # a continuation line starting with |
name ::= (
    [A-Z]         # inside a group, newlines are spaces
    [a-z]*
  )
ws_1 ::= " "
)");
  ASSERT_TRUE(g);
  EXPECT_ACCEPTS(g, "hello Bob");
  EXPECT_ACCEPTS(g, "hi X");
  EXPECT_REJECTS(g, "hey Bob");
  EXPECT_REJECTS(g, "hi bob");
  EXPECT_EQ(g->rules[g->root].name, "root");
  EXPECT_EQ(g->source, "GBNF");
}

TEST(Gbnf, WindowsLineEndings) {
  auto g = gbnf("root ::= x \"b\"\r\n# note\r\nx ::= \"a\"\r\n  | \"c\"\r\n");
  ASSERT_TRUE(g);
  EXPECT_ACCEPTS(g, "ab");
  EXPECT_ACCEPTS(g, "cb");
  EXPECT_REJECTS(g, "a\rb");
}

TEST(Gbnf, ParsesLlamaCppJsonGrammar) {
  // llama.cpp's grammars/json.gbnf, as its users write it.
  auto g = gbnf(R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)");
  ASSERT_TRUE(g);
  EXPECT_ACCEPTS(g, R"({"a": [1, "x\n", {"b": null}], "c": true})");
  EXPECT_REJECTS(g, R"({"a": [1, 2,]})");
}

// --- GBNF: errors -----------------------------------------------------------------------------

void expect_error(const std::string& text, std::initializer_list<std::string> parts, const GrammarLimits& limits = {}) {
  const std::string message = gbnf_error(text, limits);
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message << "\nwants: " << part;
}

TEST(GbnfErrors, NameTheLineAndTheRule) {
  expect_error("root ::= item\n\nitem ::= \"a\" | other\n", {"line 3", "rule 'item'", "'other' is used but never defined"});
  expect_error("start ::= \"a\"\n", {"no rule named 'root'"});
  expect_error("root ::= \"a\"\nroot ::= \"b\"\n", {"line 2", "defined twice", "line 1"});
  expect_error("root ::= \"a\nb\"\n", {"line 1", "rule 'root'", "unterminated string literal"});
  expect_error("root ::= \"a\"\nx ::= \"\\q\"\n", {"line 2", "rule 'x'", "unknown escape '\\q'"});
  expect_error("root ::= [z-a]\n", {"runs backwards"});
  expect_error("root ::= [abc\n", {"unterminated character class"});
  expect_error("root ::= []\n", {"empty character class"});
  expect_error("root ::= \"a\"{3,1}\n", {"maximum below its minimum"});
  expect_error("root ::= \"a\" )\n", {"unexpected ')'"});
  expect_error("root ::= (\"a\"\n", {"expected ')'"});
  expect_error("root ::= * \"a\"\n", {"follows nothing"});
  expect_error("root ::= \"a\" x ::= \"b\"\n", {"rule 'x' must start on a new line"});
  expect_error("root = \"a\"\n", {"expected '::='"});
  expect_error("root ::= \"\\uD800\"\n", {"not a Unicode character"});
  expect_error("root ::= \"\\x4\"\n", {"hex digits"});
  expect_error("root ::= \"\xC3\"\n", {"invalid UTF-8"});
  expect_error("root ::= \"a\"\n\"b\"\n", {"line 2", "expected a rule name"});
  expect_error("root ::= @\n", {"unexpected '@'"});
}

TEST(GbnfErrors, LeftRecursionDirectAndIndirect) {
  expect_error("root ::= root \"a\" | \"a\"\n", {"line 1", "rule 'root'", "left recursion", "root -> root"});
  expect_error("root ::= \"x\" expr\nexpr ::= term \"+\" expr | term\nterm ::= factor\nfactor ::= expr \"*\" | \"1\"\n",
               {"left recursion", "expr -> term -> factor -> expr"});
  // Through a nullable prefix: `opt` can match nothing, so `root` calls itself first.
  expect_error("root ::= opt root \"a\" | \"b\"\nopt ::= \"c\"?\n", {"left recursion", "root"});
  // A loop over an item that can match nothing would never end.
  expect_error("root ::= (\"a\"?)* \"b\"\n", {"line 1", "rule 'root'", "repeated by '*' can match the empty string"});
  expect_error("root ::= \"b\" e+\ne ::= \"x\" | \"\"\n", {"repeated by '+'"});
}

TEST(GbnfErrors, HostileInputsHitLimits) {
  expect_error("root ::= \"a\"{1001}\n", {"exceeds the limit of 1000"});
  expect_error("root ::= \"a\"{0,99999999999999999999999}\n", {"exceeds the limit of 1000"});
  std::string deep = "root ::= ";
  deep.append(200, '(').append("\"a\"").append(200, ')');
  expect_error(deep, {"nested deeper than 64"});
  std::string huge = "root ::= ";
  for (int i = 0; i < 100000; i++) huge += "\"abc\" ";
  expect_error(huge, {"more than 200000 elements"});
  GrammarLimits few;
  few.max_rules = 50;
  expect_error("root ::= \"a\"{0,100}\n", {"more than 50 rules"}, few);
  std::string many_rules;
  for (int i = 0; i < 30; i++) many_rules += fmt::format("r{} ::= \"x\"\n", i);
  expect_error(many_rules + "root ::= r0\n", {"more than 20 rules"}, GrammarLimits{20, 200000, 64, 1000});
  // Many bounded repetitions of distinct items: the rule limit, not memory, ends it.
  std::string wide = "root ::=";
  for (int i = 0; i < 25; i++) wide += " [a-" + std::string(1, static_cast<char>('b' + i)) + "]{0,1000}";
  expect_error(wide, {"more than 20000 rules"});
}

TEST(GbnfErrors, RandomMutationsNeverCrash) {
  const std::string base = R"(root ::= obj ("," obj){0,3}
obj ::= "{" [a-z]+ ":" ( [0-9]{1,3} | "\"" [^"\\]* "\"" ) "}"  # c
)";
  const char alphabet[] = "()[]{}|*+?.\"\\:=,#^-\n 0123456789azé\x80\xFF";
  std::mt19937 rng(12345);
  int ok = 0;
  for (int i = 0; i < 3000; i++) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; k++) {
      const size_t at = rng() % (s.size() + 1);
      const char c = alphabet[rng() % (sizeof(alphabet) - 1)];
      switch (rng() % 3) {
        case 0: s.insert(s.begin() + static_cast<ptrdiff_t>(at), c); break;
        case 1: if (at < s.size()) s.erase(at, 1); break;
        default: if (at < s.size()) s[at] = c;
      }
    }
    auto g = parse_gbnf(s);
    if (g.ok()) {
      ok++;
      EXPECT_TRUE(validate(*g.value()).ok());
    } else {
      EXPECT_NE(g.error().message.find("GBNF"), std::string::npos) << g.error().message;
    }
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace tandem::grammar
