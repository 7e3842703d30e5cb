// What the router sends a decode rank of its own and what comes back (engine/handoff_request.h):
// a request with every field the decode rank's scheduler reads (sampling, stop tokens,
// logprobs, speculation, a grammar) comes back equal; cut or corrupt bytes and a grammar that
// does not validate are refused with an error; a request's events (tokens, logprobs, their
// alternatives, the finish) come back as the scheduler reported them.
#include <gtest/gtest.h>

#include "engine/grammar/gbnf_parser.h"
#include "engine/handoff_request.h"

namespace tandem {
namespace {

RequestParams full_request() {
  RequestParams p;
  p.prompt = {1, 504, 3575, 28, 9};
  p.max_tokens = 77;
  p.sampling.temperature = 0.7f, p.sampling.top_k = 12, p.sampling.top_p = 0.9f, p.sampling.min_p = 0.01f;
  p.sampling.repeat_penalty = 1.1f, p.sampling.repeat_last_n = 32, p.sampling.seed = 0xfeedfacecafebeefull;
  p.stop_tokens = {2, 49152};
  p.want_logprobs = true;
  p.top_logprobs = 5;
  SpeculativeParams sp;
  sp.mode = SpeculativeMode::Lookup, sp.draft_max = 6, sp.lookup.ngram_min = 1, sp.lookup.ngram_max = 4, sp.draft_p_min = 0.25f;
  p.speculative = sp;
  auto g = grammar::parse_gbnf(R"(root ::= "The answer is " [0-9]+ ("." | " because " [a-z ]+ "."))");
  EXPECT_TRUE(g.ok());
  p.grammar = g.value();
  p.cache_scope = "key:7";
  p.tenant = "alice";
  return p;
}

void expect_same_grammar(const grammar::Grammar& a, const grammar::Grammar& b) {
  EXPECT_EQ(a.root, b.root);
  EXPECT_EQ(a.source, b.source);
  ASSERT_EQ(a.rules.size(), b.rules.size());
  for (size_t i = 0; i < a.rules.size(); i++) {
    EXPECT_EQ(a.rules[i].name, b.rules[i].name);
    ASSERT_EQ(a.rules[i].alternatives.size(), b.rules[i].alternatives.size());
    for (size_t k = 0; k < a.rules[i].alternatives.size(); k++) {
      const grammar::Sequence &x = a.rules[i].alternatives[k], &y = b.rules[i].alternatives[k];
      ASSERT_EQ(x.size(), y.size());
      for (size_t e = 0; e < x.size(); e++) {
        EXPECT_EQ(x[e].kind, y[e].kind);
        EXPECT_EQ(x[e].bytes, y[e].bytes);
        EXPECT_EQ(x[e].rule, y[e].rule);
      }
    }
  }
}

TEST(HandoffRequest, EveryFieldRoundTrips) {
  const RequestParams p = full_request();
  auto back = decode_request(encode_request(p));
  ASSERT_TRUE(back.ok()) << back.error().message;
  const RequestParams& q = back.value();
  EXPECT_EQ(q.prompt, p.prompt);
  EXPECT_EQ(q.max_tokens, p.max_tokens);
  EXPECT_EQ(q.sampling.temperature, p.sampling.temperature);
  EXPECT_EQ(q.sampling.top_k, p.sampling.top_k);
  EXPECT_EQ(q.sampling.top_p, p.sampling.top_p);
  EXPECT_EQ(q.sampling.min_p, p.sampling.min_p);
  EXPECT_EQ(q.sampling.repeat_penalty, p.sampling.repeat_penalty);
  EXPECT_EQ(q.sampling.repeat_last_n, p.sampling.repeat_last_n);
  EXPECT_EQ(q.sampling.seed, p.sampling.seed);
  EXPECT_EQ(q.stop_tokens, p.stop_tokens);
  EXPECT_EQ(q.want_logprobs, p.want_logprobs);
  EXPECT_EQ(q.top_logprobs, p.top_logprobs);
  ASSERT_TRUE(q.speculative);
  EXPECT_EQ(q.speculative->mode, p.speculative->mode);
  EXPECT_EQ(q.speculative->draft_max, p.speculative->draft_max);
  EXPECT_EQ(q.speculative->lookup.ngram_min, p.speculative->lookup.ngram_min);
  EXPECT_EQ(q.speculative->lookup.ngram_max, p.speculative->lookup.ngram_max);
  EXPECT_EQ(q.speculative->draft_p_min, p.speculative->draft_p_min);
  ASSERT_TRUE(q.grammar);
  expect_same_grammar(*q.grammar, *p.grammar);
  EXPECT_EQ(q.cache_scope, p.cache_scope);
  EXPECT_EQ(q.tenant, p.tenant);
  EXPECT_FALSE(q.prefill_only);
}

TEST(HandoffRequest, AbsentSpeculationAndGrammarStayAbsent) {
  RequestParams p;
  p.prompt = {5};
  auto back = decode_request(encode_request(p));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_FALSE(back->speculative);
  EXPECT_FALSE(back->grammar);
  EXPECT_EQ(back->prompt, p.prompt);
}

TEST(HandoffRequest, TruncatedTrailingAndCorruptBytesAreRefused) {
  const std::vector<uint8_t> bytes = encode_request(full_request());
  for (size_t n = 0; n < bytes.size(); n++) {
    auto r = decode_request(std::vector<uint8_t>(bytes.begin(), bytes.begin() + (ptrdiff_t)n));
    ASSERT_FALSE(r.ok()) << n << " of " << bytes.size();
    EXPECT_NE(r.error().message.find("hand-off request of " + std::to_string(n) + " bytes"), std::string::npos) << r.error().message;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(1);
  auto r = decode_request(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("1 bytes left over"), std::string::npos) << r.error().message;
  std::vector<uint8_t> wrong = bytes;
  wrong[1] ^= 0x40;
  r = decode_request(wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not one"), std::string::npos) << r.error().message;
  // Every single byte flipped: decoded or refused, never read past the end (ASan checks).
  for (size_t i = 0; i < bytes.size(); i++) {
    std::vector<uint8_t> b = bytes;
    b[i] ^= 0xff;
    (void)decode_request(b);
  }
}

TEST(HandoffRequest, GrammarThatDoesNotValidateIsRefused) {
  RequestParams p;
  p.prompt = {5};
  auto g = std::make_shared<grammar::Grammar>();
  g->rules.push_back({"root", {{grammar::Element::ref(7)}}});  // a rule that is not there
  g->source = "GBNF";
  p.grammar = g;
  auto r = decode_request(encode_request(p));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("its grammar"), std::string::npos) << r.error().message;
}

TEST(HandoffRequest, EventsRoundTrip) {
  std::vector<SeqEvent> events(3);
  events[0].id = 4, events[0].token = 17, events[0].logprob = -0.25f, events[0].top_logprobs = {{17, -0.25f}, {3, -1.5f}};
  events[1].id = 4, events[1].token = 2, events[1].logprob = -0.75f;
  events[2].id = 4, events[2].finish = FinishReason::Error, events[2].error = "grammar budget";
  events[2].over_budget = true, events[2].n_prompt = 30, events[2].n_cached = 16, events[2].n_generated = 2;
  events[2].n_preemptions = 1;
  HandoffMessage m;
  m.kind = HandoffMessage::Kind::Events;
  m.id = 4;
  for (const SeqEvent& e : events) append_event(m, e);
  auto decoded = HandoffMessage::decode(m.encode());
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  const std::vector<SeqEvent> back = events_of(decoded.value());
  ASSERT_EQ(back.size(), events.size());
  for (size_t i = 0; i < events.size(); i++) {
    SCOPED_TRACE(i);
    EXPECT_EQ(back[i].id, events[i].id);
    EXPECT_EQ(back[i].token, events[i].token);
    EXPECT_EQ(back[i].logprob, events[i].logprob);
    EXPECT_EQ(back[i].top_logprobs, events[i].top_logprobs);
    EXPECT_EQ(back[i].finish, events[i].finish);
    EXPECT_EQ(back[i].error, events[i].error);
    EXPECT_EQ(back[i].by_stop_token, events[i].by_stop_token);
    EXPECT_EQ(back[i].over_budget, events[i].over_budget);
    EXPECT_EQ(back[i].n_prompt, events[i].n_prompt);
    EXPECT_EQ(back[i].n_cached, events[i].n_cached);
    EXPECT_EQ(back[i].n_generated, events[i].n_generated);
    EXPECT_EQ(back[i].n_preemptions, events[i].n_preemptions);
  }
}

}  // namespace
}  // namespace tandem
