// Constrained decoding through the scheduler: every output is a sentence (or, cut by the token
// limit, a prefix) of the request's grammar; a constrained sequence batched with others, drafting
// (by prompt lookup or by a draft model that knows nothing of the grammar) or preempted,
// produces exactly what it produces alone; and the real model's JSON Schema output parses and
// has its required members.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/draft_model.h"
#include "engine/generator.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "test_paths.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using Tokens = std::vector<int32_t>;

// The tiny model's 96 tokens as text: 0 is the end token, 1..16 the hex digits, 17 ',', 18 '[',
// 19 ']', 20.. two- and three-character pieces that span structure (",1" "]" "a]," ...), the
// rest letters, which the grammar below never allows.
std::vector<std::string> tiny_token_text() {
  std::vector<std::string> t(96);
  const std::string hex = "0123456789abcdef";
  for (int i = 0; i < 16; i++) t[1 + i] = std::string(1, hex[i]);
  t[17] = ",", t[18] = "[", t[19] = "]";
  const char* spans[] = {",1", "2,", "[a", "b]", "],", "a]", "ff", "[0,", "9]", ",c,", "00", "[]"};
  for (int i = 0; i < 12; i++) t[20 + i] = spans[i];
  for (int i = 32; i < 96; i++) t[i] = std::string(1, (char)('g' + (i - 32) % 20));
  return t;
}

// A list of at most six hex numbers of at most three digits: "[a,12,fff]".
constexpr const char* kListGrammar = R"(
root ::= "[" ( num ( "," num ){0,5} )? "]"
num  ::= [0-9a-f]{1,3}
)";

struct Tiny {
  std::unique_ptr<Model> model;
  std::shared_ptr<const grammar::TokenMasker> masker;
  std::shared_ptr<const grammar::Grammar> grammar;
  std::vector<std::string> text = tiny_token_text();
};

std::unique_ptr<Model> tiny_model() {
  test::TinyShape s;
  s.n_ctx = 256;
  auto m = Model::from_gguf(test::tiny_model_file(s, 42));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

Tiny tiny() {
  Tiny t;
  t.model = tiny_model();
  t.masker = std::make_shared<grammar::TokenMasker>(t.text, std::vector<int32_t>{0});
  auto g = grammar::parse_gbnf(kListGrammar);
  EXPECT_TRUE(g.ok()) << g.error().message;
  if (g.ok()) t.grammar = g.value();
  return t;
}

std::string text_of(const Tiny& t, const Tokens& toks) {
  std::string s;
  for (int32_t id : toks) s += t.text[(size_t)id];
  return s;
}

// A prompt that repeats a phrase, so prompt lookup proposes drafts.
Tokens repetitive_prompt(int variant) {
  Tokens phrase;
  for (int i = 0; i < 5; i++) phrase.push_back((variant * 7 + i * 5) % 31 + 1);
  Tokens p;
  for (int r = 0; r < 3; r++) p.insert(p.end(), phrase.begin(), phrase.end());
  return p;
}

struct Collected {
  std::map<int64_t, Tokens> tokens;
  std::map<int64_t, SeqEvent> finished;
  SeqCallback callback() {
    return [this](const SeqEvent& e) {
      if (e.finish != FinishReason::None)
        finished[e.id] = e;
      else
        tokens[e.id].push_back(e.token);
      return true;
    };
  }
};

void run_all(Scheduler& s) {
  for (int k = 0; k < 20000 && s.has_work(); k++) ASSERT_TRUE(s.step().ok());
  ASSERT_FALSE(s.has_work());
}

std::unique_ptr<BlockPool> pool_for(Model& m, int64_t blocks, int block_tokens = 4) {
  auto p = m.new_kv_pool(blocks, DType::F16, block_tokens);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p.value()) : nullptr;
}

RequestParams request(const Tiny& t, int variant, bool constrained, float temp = 0, uint64_t seed = 0) {
  RequestParams rp;
  rp.prompt = repetitive_prompt(variant);
  rp.max_tokens = 30;
  rp.sampling.temperature = temp;
  rp.sampling.top_k = 0, rp.sampling.top_p = 1, rp.sampling.min_p = 0;
  rp.sampling.seed = seed;
  rp.stop_tokens = {0};
  if (constrained) rp.grammar = t.grammar;
  return rp;
}

// The output is a complete sentence when the request stopped, a prefix when cut by length.
void expect_in_language(const Tiny& t, const Tokens& out, const SeqEvent& fin) {
  auto m = grammar::Matcher::create(t.grammar);
  ASSERT_TRUE(m.ok());
  const std::string s = text_of(t, out);
  EXPECT_TRUE(m->accept(s)) << s;
  if (fin.finish == FinishReason::Stop) { EXPECT_TRUE(m->can_end()) << s; }
  EXPECT_NE(fin.finish, FinishReason::Error) << fin.error;
}

TEST(Constrained, TinyModelOutputsFollowTheGrammarAloneBatchedDraftingAndPreempted) {
  Tiny t = tiny();
  ASSERT_NE(t.model, nullptr);
  ASSERT_NE(t.grammar, nullptr);
  // Alone: one sequence per scheduler.
  std::map<int, Tokens> alone;
  for (int v = 0; v < 6; v++) {
    auto pool = pool_for(*t.model, 64);
    SchedulerOptions o;
    o.masker = t.masker;
    Scheduler s(*t.model, *pool, o);
    Collected c;
    auto id = s.add(request(t, v, v % 2 == 0), c.callback());
    ASSERT_TRUE(id.ok()) << id.error().message;
    run_all(s);
    alone[v] = c.tokens[*id];
    if (v % 2 == 0) {
      expect_in_language(t, alone[v], c.finished[*id]);
      EXPECT_GE(text_of(t, alone[v]).size(), 2u);  // at least "[]" (one token holds both)
    }
  }
  // Together, drafting by prompt lookup or by a draft model (the same weights: its unmasked
  // proposals are often outside the grammar, and must be rejected), and (24 blocks of 4) with
  // preemption.
  auto twin = tiny_model();
  ASSERT_NE(twin, nullptr);
  for (int64_t blocks : {128, 24}) {
    for (SpeculativeMode drafting : {SpeculativeMode::Off, SpeculativeMode::Lookup, SpeculativeMode::Draft}) {
      auto pool = pool_for(*t.model, blocks);
      SchedulerOptions o;
      o.masker = t.masker;
      o.max_batch_tokens = 24;
      o.speculative.mode = drafting;
      std::unique_ptr<BlockPool> draft_pool;
      if (drafting == SpeculativeMode::Draft) {
        auto dp = new_draft_pool(*twin, *pool);
        ASSERT_TRUE(dp.ok()) << dp.error().message;
        draft_pool = std::move(dp.value());
        o.draft_model = {twin.get(), draft_pool.get()};
        o.speculative.draft_p_min = 0;  // the random twin is never confident: draft anyway
      }
      Scheduler s(*t.model, *pool, o);
      Collected c;
      std::map<int64_t, int> which;
      for (int v = 0; v < 6; v++) {
        auto id = s.add(request(t, v, v % 2 == 0), c.callback());
        ASSERT_TRUE(id.ok());
        which[*id] = v;
      }
      run_all(s);
      for (const auto& [id, v] : which)
        EXPECT_EQ(c.tokens[id], alone[v]) << "request " << v << " blocks " << blocks << " drafting "
                                           << speculative_mode_name(drafting);
      EXPECT_EQ(pool->used_blocks(), 0) << "every block returns to the pool";
      if (draft_pool) { EXPECT_EQ(draft_pool->used_blocks(), 0) << "every draft block returns to its pool"; }
      if (drafting != SpeculativeMode::Off) { EXPECT_GT(s.stats().drafted_tokens, 0); }
    }
  }
}

// Sampled, plain and with a draft model whose proposals (drawn from its own unmasked
// distribution) the verify step must judge against the masked one.
TEST(Constrained, SampledOutputsAreSentencesOfTheGrammar) {
  Tiny t = tiny();
  ASSERT_NE(t.model, nullptr);
  auto twin = tiny_model();
  ASSERT_NE(twin, nullptr);
  for (bool draft_model : {false, true}) {
    auto pool = pool_for(*t.model, 256);
    SchedulerOptions o;
    o.masker = t.masker;
    o.max_batch_tokens = 64;
    std::unique_ptr<BlockPool> draft_pool;
    if (draft_model) {
      auto dp = new_draft_pool(*twin, *pool);
      ASSERT_TRUE(dp.ok()) << dp.error().message;
      draft_pool = std::move(dp.value());
      o.draft_model = {twin.get(), draft_pool.get()};
      o.speculative.mode = SpeculativeMode::Draft;
      o.speculative.draft_p_min = 0;  // the random twin is never confident: draft anyway
    }
    Scheduler s(*t.model, *pool, o);
    Collected c;
    for (uint64_t seed = 0; seed < 24; seed++) ASSERT_TRUE(s.add(request(t, (int)seed % 6, true, 1.5f, seed), c.callback()).ok());
    run_all(s);
    int complete = 0;
    for (const auto& [id, fin] : c.finished) {
      expect_in_language(t, c.tokens[id], fin);
      complete += fin.finish == FinishReason::Stop;
    }
    EXPECT_EQ(c.finished.size(), 24u);
    EXPECT_GT(complete, 12);  // at most 6 numbers of 3 digits fit in 30 tokens: most finish
    EXPECT_GT(s.stats().masks, 0);
    if (draft_model) { EXPECT_GT(s.stats().drafted_tokens, 0); }
  }
}

TEST(Constrained, AGrammarWithoutAMaskerIsRefused) {
  Tiny t = tiny();
  ASSERT_NE(t.model, nullptr);
  auto pool = pool_for(*t.model, 64);
  Scheduler s(*t.model, *pool, SchedulerOptions{});
  auto id = s.add(request(t, 0, true), [](const SeqEvent&) { return true; });
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.error().message.find("masker"), std::string::npos) << id.error().message;
}

TEST(Constrained, RealModelJsonSchemaOutputParsesAndDraftingChangesNothing) {
  const std::string path = test::default_model_path();
  if (!test::exists(path)) GTEST_SKIP() << "model not found at " << path << " (run scripts/setup.sh)";
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto tok = Tokenizer::from_gguf(m.value()->gguf());
  ASSERT_TRUE(tok.ok());
  const auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"},
                   "capital": {"type": "boolean"}, "rivers": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["city", "population", "capital"]})");
  auto g = grammar::grammar_from_json_schema(schema);
  ASSERT_TRUE(g.ok()) << g.error().message;
  GenerationConfig cfg;
  cfg.max_new_tokens = 160;
  cfg.sampling.temperature = 0;
  cfg.stop_tokens = tok.value()->vocab().end_of_generation;
  cfg.grammar = g.value();
  cfg.masker = grammar::TokenMasker::for_tokenizer(*tok.value(), cfg.stop_tokens);
  const Tokens prompt = tok.value()->encode("The city of Paris as JSON, with its rivers: {\"city\": \"Paris\", ", true, false);
  auto generate = [&](const GenerationConfig& c, GenerationStats* st) {
    Tokens out;
    Generator gen(*m.value());
    auto r = gen.generate(prompt, c, [&](int32_t t) {
      out.push_back(t);
      return true;
    });
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r.ok()) *st = r.value();
    return out;
  };
  GenerationStats plain_st, spec_st;
  const Tokens plain = generate(cfg, &plain_st);
  GenerationConfig spec = cfg;
  spec.speculative.mode = SpeculativeMode::Lookup;
  const Tokens drafted = generate(spec, &spec_st);
  EXPECT_EQ(drafted, plain);
  // The model drafting for itself, blind to the schema: it proposes what the model would say
  // unconstrained, which the masked verify step takes only where the schema allows it.
  auto self = Model::load(path);
  ASSERT_TRUE(self.ok()) << self.error().message;
  GenerationConfig by_model = cfg;
  by_model.speculative.mode = SpeculativeMode::Draft;
  by_model.draft_model = self.value().get();
  GenerationStats model_st;
  EXPECT_EQ(generate(by_model, &model_st), plain);
  EXPECT_GT(model_st.n_drafted, 0);
  const std::string text = tok.value()->decode(plain);
  EXPECT_TRUE(plain_st.grammar_complete) << text;
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << text;
  ASSERT_TRUE(doc.is_object()) << text;
  EXPECT_TRUE(doc.contains("city") && doc["city"].is_string()) << text;
  EXPECT_TRUE(doc.contains("population") && doc["population"].is_number_integer()) << text;
  EXPECT_TRUE(doc.contains("capital") && doc["capital"].is_boolean()) << text;
}

}  // namespace
}  // namespace tandem
