// The grammar budget (engine/grammar/budget.h): a grammar whose parses multiply or deepen with
// every byte (issue 34's probe: 1024 rules `r_i ::= [a-z ,.] r_i "i" | "!"`) ends its request with
// an error naming the bound, fast, and its cache entries go; the caches stay within their bytes;
// a real JSON Schema never comes near a bound.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/scheduler.h"
#include "gguf/gguf_file.h"
#include "grammar_builder.h"
#include "model/model.h"
#include "test_paths.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::grammar {
namespace {

// Issue 34's probe: `rules` rules, each reading one byte of `step` then itself then a closer,
// or ending with `leaf`; the root picks any. Every byte of `step` keeps 2 x rules parses alive,
// each one frame deeper.
std::string probe_gbnf(int rules, const std::string& step = "[a-z ,.]", const std::string& closer = "\"i\"",
                       const std::string& leaf = "\"!\"") {
  std::string root = "root ::= r0", body;
  for (int i = 0; i < rules; i++) {
    if (i) root += fmt::format(" | r{}", i);
    body += fmt::format("r{} ::= {} r{} {} | {}\n", i, step, i, closer, leaf);
  }
  return root + "\n" + body;
}

std::shared_ptr<const Grammar> gbnf(const std::string& text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? g.value() : nullptr;
}

std::unique_ptr<Tokenizer> smollm_tokenizer() {
  if (!tandem::test::exists(tandem::test::default_model_path())) return nullptr;
  auto f = GgufFile::open(tandem::test::default_model_path());
  if (!f.ok()) return nullptr;
  auto tok = Tokenizer::from_gguf(*f.value());
  return tok.ok() ? std::move(tok.value()) : nullptr;
}

TEST(GrammarBudget, TheProbesStartIsRefusedAtOnce) {
  Timer t;
  auto m = Matcher::create(gbnf(probe_gbnf(1024)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("max_stacks"), std::string::npos) << m.error().message;
  EXPECT_LT(t.seconds(), 1.0);
}

TEST(GrammarBudget, AProbeUnderTheStackBoundMeetsTheStateBoundWithinAFewBytes) {
  auto m = Matcher::create(gbnf(probe_gbnf(300)));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->n_stacks(), 600u);
  int accepted = 0;
  while (accepted < 1000 && m->accept("a")) accepted++;
  EXPECT_LT(accepted, 100) << "600 parses, one frame deeper per byte: 32768 ints after ~54 bytes";
  EXPECT_NE(m->budget_error().find("max_state_ints"), std::string::npos) << m->budget_error();
  EXPECT_TRUE(m->can_accept("!")) << "the refused byte left the state as it was";
}

TEST(GrammarBudget, ADeepParseMeetsTheDepthBound) {
  auto m = Matcher::create(gbnf("root ::= \"(\" root \")\" | \"x\""));
  ASSERT_TRUE(m.ok());
  int accepted = 0;
  while (accepted < 5000 && m->accept("(")) accepted++;
  EXPECT_EQ(accepted, (int)StateLimits{}.max_depth - 1);
  EXPECT_NE(m->budget_error().find("max_depth"), std::string::npos) << m->budget_error();
}

TEST(GrammarBudget, TheProbesMaskStopsAtTheWorkBudgetOnARealVocabulary) {
  auto tok = smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "model not found";
  auto masker = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation);
  auto g = gbnf(probe_gbnf(300));
  Matcher m = Matcher::create(g).value();
  Timer t;
  const auto mask = masker->mask(m);
  const double s = t.seconds();
  // Its long tokens (runs of spaces) would pass the state bound: that stops it first.
  EXPECT_NE(mask->budget_error.find("max_state_ints"), std::string::npos) << mask->budget_error;
  EXPECT_LT(s, 0.25) << "the budget stops the walk in milliseconds, not seconds";
  EXPECT_EQ(masker->cache_stats().entries, 0u) << "an incomplete mask is not cached";
  const Status start = masker->check_start(g);
  ASSERT_FALSE(start.ok());
  EXPECT_NE(start.error().message.find("grammar budget"), std::string::npos) << start.error().message;
  fmt::print(stderr, "probe (300 rules) mask stopped after {:.1f} ms\n", s * 1e3);
  // With room for any state, the work bound stops it.
  GrammarBudget roomy;
  roomy.state.max_state_ints = size_t{1} << 24;
  roomy.state.max_depth = size_t{1} << 20;
  auto work_bound = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation, roomy);
  Matcher wide = Matcher::create(g, roomy.state).value();
  t.reset();
  const auto stopped = work_bound->mask(wide);
  EXPECT_NE(stopped->budget_error.find("max_mask_work"), std::string::npos) << stopped->budget_error;
  EXPECT_LT(t.seconds(), 0.25);
  fmt::print(stderr, "probe (300 rules) mask stopped by the work bound after {:.1f} ms\n", t.seconds() * 1e3);
}

TEST(GrammarBudget, TheMaskDeadlineIsCheckedInsideTheWalk) {
  auto tok = smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "model not found";
  GrammarBudget b;  // only the clock bounds this mask
  b.max_mask_work = SIZE_MAX;
  b.state.max_state_ints = size_t{1} << 24;
  b.state.max_depth = size_t{1} << 20;
  b.max_mask_time = std::chrono::microseconds(1000);
  auto masker = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation, b);
  Matcher m = Matcher::create(gbnf(probe_gbnf(300)), b.state).value();
  Timer t;
  const auto mask = masker->mask(m);
  EXPECT_NE(mask->budget_error.find("max_mask_time"), std::string::npos) << mask->budget_error;
  EXPECT_LT(t.seconds(), 0.1);
}

TEST(GrammarBudget, RealSchemasStayFarFromEveryBound) {
  auto tok = smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "model not found";
  // A tenth of every default bound: a real schema still runs.
  GrammarBudget tight = TokenMasker::for_tokenizer(*tok, {})->budget();
  tight.state.max_stacks /= 10;
  tight.state.max_depth /= 10;
  tight.state.max_state_ints /= 10;
  tight.max_mask_work /= 10;
  auto masker = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation, tight);
  const auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]}},
                   "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}},
                   "kind": {"enum": ["a", "b", "c"]}},
    "required": ["name", "age"]})");
  auto g = grammar_from_json_schema(schema);
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_TRUE(masker->check_start(g.value()).ok());
  const std::string text =
      R"({"name": "Ada Lovelace", "age": 36, "tags": ["x", 1.5, null, "long words here"], "address": {"city": "London", "zip": "W1"}, "kind": "b"})";
  Matcher m = Matcher::create(g.value(), tight.state).value();
  for (size_t i = 0; i < text.size(); i++) {
    const auto mask = masker->mask(m);
    ASSERT_TRUE(mask->budget_error.empty()) << "after '" << text.substr(0, i) << "': " << mask->budget_error;
    ASSERT_TRUE(m.accept(text.substr(i, 1))) << text.substr(0, i + 1) << ": " << m.budget_error();
  }
  EXPECT_TRUE(m.can_end());
  // "any JSON" nested a hundred deep is within the default bounds too.
  Matcher deep = Matcher::create(test::json_object_grammar()).value();
  ASSERT_TRUE(deep.accept("{\"a\": " + std::string(100, '[')));
  auto any = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation);
  EXPECT_TRUE(any->mask(deep)->budget_error.empty());
  // A string of bounded length, the costliest real pattern (each trie node a new DFA state):
  // within the default budget at every position.
  auto bounded = grammar_from_json_schema(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 900, "maxLength": 1000}}, "required": ["s"]})"));
  ASSERT_TRUE(bounded.ok()) << bounded.error().message;
  Matcher in_string = Matcher::create(bounded.value()).value();
  ASSERT_TRUE(in_string.accept("{\"s\": \""));
  for (int i = 0; i < 5; i++) {
    const auto mask = any->mask(in_string);
    ASSERT_TRUE(mask->budget_error.empty()) << mask->budget_error;
    EXPECT_GT(mask->count(), 40000u);
    ASSERT_TRUE(in_string.accept("ab"));
  }
}

TEST(GrammarBudget, TheCachesStayWithinTheirBytesAndForgetAGrammar) {
  auto tok = smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "model not found";
  GrammarBudget b;
  b.cache_bytes = 256 << 10;
  b.cache_bytes_per_grammar = 64 << 10;
  auto masker = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation, b);
  // Strings at ever deeper nesting: each a new state (and a larger one) of one grammar.
  auto g = test::json_object_grammar();
  Matcher m = Matcher::create(g).value();
  ASSERT_TRUE(m.accept("{\"a\": "));
  for (int depth = 0; depth < 200; depth++) {
    ASSERT_TRUE(m.accept("[\"x"));
    masker->mask(m);
    const auto st = masker->cache_stats();
    ASSERT_LE(st.bytes, b.cache_bytes_per_grammar);
    ASSERT_LE(st.walk_bytes, b.cache_bytes_per_grammar);
    ASSERT_TRUE(m.accept("\", "));
  }
  // Other grammars fill the rest, within the whole budget.
  std::vector<std::shared_ptr<const Grammar>> others;
  for (int k = 0; k < 8; k++) {
    others.push_back(test::json_object_grammar());
    Matcher o = Matcher::create(others.back()).value();
    for (int i = 0; i < 20; i++) {
      ASSERT_TRUE(o.accept(i ? "1, [" : "{\"k\": ["));
      masker->mask(o);
    }
  }
  auto st = masker->cache_stats();
  EXPECT_LE(st.bytes, b.cache_bytes);
  EXPECT_LE(st.walk_bytes, b.cache_bytes);
  EXPECT_GT(st.bytes, b.cache_bytes_per_grammar) << "several grammars share the cache";
  for (const auto& o : others) masker->forget(o.get());
  masker->forget(g.get());
  st = masker->cache_stats();
  EXPECT_EQ(st.bytes + st.walk_bytes, 0u);
  EXPECT_EQ(st.entries + st.walk_entries, 0u);
}

// Issue 34's second probe: an anyOf of 600 self-referencing arrays, 600 parses per "[".
nlohmann::ordered_json defs_probe_schema(int n) {
  nlohmann::ordered_json defs = nlohmann::ordered_json::object(), any = nlohmann::ordered_json::array();
  for (int i = 0; i < n; i++) {
    const std::string name = fmt::format("a{}", i);
    defs[name] = {{"type", "array"}, {"items", {{"$ref", "#/$defs/" + name}}}};
    any.push_back({{"$ref", "#/$defs/" + name}});
  }
  return {{"$defs", defs}, {"anyOf", any}};
}

TEST(GrammarBudget, TheDefsAnyOfProbeStopsAtTheBudget) {
  auto tok = smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "model not found";
  auto masker = TokenMasker::for_tokenizer(*tok, tok->vocab().end_of_generation);
  auto full = grammar_from_json_schema(defs_probe_schema(600));
  ASSERT_TRUE(full.ok()) << full.error().message;
  const Status start = masker->check_start(full.value());
  ASSERT_FALSE(start.ok()) << "a token of several '[' would leave too many parses";
  EXPECT_NE(start.error().message.find("max_stacks"), std::string::npos) << start.error().message;
  // A smaller one starts, and deepens with every '[' until the state bound; no mask on the way
  // passes a few milliseconds.
  auto small = grammar_from_json_schema(defs_probe_schema(100));
  ASSERT_TRUE(small.ok()) << small.error().message;
  ASSERT_TRUE(masker->check_start(small.value()).ok());
  Matcher m = Matcher::create(small.value()).value();
  double slowest = 0;
  int accepted = 0;
  for (; accepted < 1000; accepted++) {
    Timer t;
    const auto mask = masker->mask(m);
    slowest = std::max(slowest, t.seconds());
    if (!mask->budget_error.empty()) break;
    if (!m.accept("[")) break;
  }
  EXPECT_LT(accepted, 100);
  EXPECT_LT(slowest, 0.02);
  fmt::print(stderr, "defs probe (100): stopped after {} bytes ({}), slowest mask {:.2f} ms\n", accepted,
             m.budget_error().empty() ? "mask" : m.budget_error(), slowest * 1e3);
}

TEST(GrammarBudget, AGrammarNoTokenCanStartIsRefusedBeforeItRuns) {
  const TokenMasker masker(std::vector<std::string>{"a", "b", "ab", ""}, {3});
  Status s = masker.check_start(gbnf("root ::= \"~\" [a-z]*"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("no token"), std::string::npos) << s.error().message;
  EXPECT_TRUE(masker.check_start(gbnf("root ::= \"ab\"")).ok());
  EXPECT_TRUE(masker.check_start(gbnf("root ::= \"\" | \"~\"")).ok()) << "the end token may come first";
}

}  // namespace
}  // namespace tandem::grammar

namespace tandem {
namespace {

// Through the scheduler: the probe's request ends with an error naming the budget, the other
// request in the same batch is untouched, and the probe's cache entries are gone.
TEST(GrammarBudget, TheSchedulerEndsAProbeWithAnErrorAndKeepsServingOthers) {
  test::TinyShape shape;
  shape.n_ctx = 512;
  auto model = Model::from_gguf(test::tiny_model_file(shape, 42));
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<std::string> text(96);
  for (int i = 1; i < 96; i++) text[(size_t)i] = std::string(1, (char)('a' + i % 26));
  text[2] = "i";  // no "!": the probe's parses never close, every token deepens them
  auto pool = model.value()->new_kv_pool(128, DType::F16, 4);
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  SchedulerOptions so;
  so.masker = std::make_shared<grammar::TokenMasker>(text, std::vector<int32_t>{0});
  auto g = grammar::parse_gbnf(grammar::probe_gbnf(300, "[a-h]"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  Scheduler sched(*model.value(), *pool.value(), so);
  RequestParams probe;
  probe.prompt = {3, 4, 5};
  probe.max_tokens = 300;
  probe.sampling.temperature = 0;
  probe.grammar = g.value();
  RequestParams plain = probe;
  plain.grammar = nullptr;
  plain.max_tokens = 40;
  std::map<int64_t, SeqEvent> last;
  std::map<int64_t, int> tokens;
  auto cb = [&](const SeqEvent& e) {
    if (e.finish == FinishReason::None) tokens[e.id]++;
    else last[e.id] = e;
    return true;
  };
  const int64_t pid = sched.add(probe, cb).value();
  const int64_t nid = sched.add(plain, cb).value();
  for (int i = 0; i < 400 && sched.has_work(); i++) ASSERT_TRUE(sched.step().ok());
  ASSERT_TRUE(last.count(pid) && last.count(nid));
  EXPECT_EQ(last[pid].finish, FinishReason::Error);
  EXPECT_NE(last[pid].error.find("grammar budget"), std::string::npos) << last[pid].error;
  EXPECT_LT(tokens[pid], 100);
  EXPECT_EQ(last[nid].finish, FinishReason::Length);
  EXPECT_EQ(tokens[nid], 40);
  EXPECT_EQ(so.masker->cache_stats().bytes, 0u) << "the probe's masks were dropped";
}

}  // namespace
}  // namespace tandem
