#include "engine/handoff_request.h"

#include <numeric>

#include "engine/grammar/grammar.h"
#include "engine/handoff_codec.h"

namespace tandem {

namespace {

constexpr uint32_t kRequestMagic = 0x51524b54;  // "TKRQ" in memory

// The grammar's rules, alternatives and elements, each count before what it counts. A reader
// stops at the first count past the bytes left, so a forged count costs no allocation.
void write_grammar(HandoffWriter& w, const grammar::Grammar& g) {
  w.pod("grammar.root", g.root);
  w.text("grammar.source", g.source);
  w.pod("grammar.rules", (uint64_t)g.rules.size());
  for (const grammar::Rule& r : g.rules) {
    w.text("rule.name", r.name);
    w.pod("rule.alternatives", (uint64_t)r.alternatives.size());
    for (const grammar::Sequence& seq : r.alternatives) {
      w.pod("sequence.elements", (uint64_t)seq.size());
      for (const grammar::Element& e : seq) w.pod("element.kind", e.kind), w.pod("element.bytes", e.bytes), w.pod("element.rule", e.rule);
    }
  }
}

// A count read from the buffer, checked against the least bytes each counted item takes.
uint64_t read_count(HandoffReader& r, const char* name, size_t min_item_bytes) {
  uint64_t n = 0;
  r.pod(name, n);
  if (r.ok() && n > r.in.size() / min_item_bytes)
    r.fail(fmt::format("field '{}' claims {} entries, but {} bytes are left", name, n, r.in.size()));
  return r.ok() ? n : 0;
}

std::shared_ptr<grammar::Grammar> read_grammar(HandoffReader& r) {
  auto g = std::make_shared<grammar::Grammar>();
  r.pod("grammar.root", g->root);
  r.text("grammar.source", g->source);
  const uint64_t n_rules = read_count(r, "grammar.rules", 16);
  for (uint64_t i = 0; i < n_rules && r.ok(); i++) {
    grammar::Rule& rule = g->rules.emplace_back();
    r.text("rule.name", rule.name);
    const uint64_t n_alts = read_count(r, "rule.alternatives", 8);
    for (uint64_t a = 0; a < n_alts && r.ok(); a++) {
      grammar::Sequence& seq = rule.alternatives.emplace_back();
      const uint64_t n_el = read_count(r, "sequence.elements", 1 + 32 + 4);
      for (uint64_t k = 0; k < n_el && r.ok(); k++) {
        grammar::Element& e = seq.emplace_back();
        r.pod("element.kind", e.kind), r.pod("element.bytes", e.bytes), r.pod("element.rule", e.rule);
        if (r.ok() && e.kind != grammar::Element::Kind::Bytes && e.kind != grammar::Element::Kind::Rule)
          r.fail(fmt::format("grammar element of unknown kind {}", (int)e.kind));
      }
    }
  }
  return g;
}

template <class Io, class P>
void request_fields(Io& io, P& p) {
  io.array("prompt", p.prompt);
  io.pod("max_tokens", p.max_tokens);
  io.pod("temperature", p.sampling.temperature), io.pod("top_k", p.sampling.top_k), io.pod("top_p", p.sampling.top_p);
  io.pod("min_p", p.sampling.min_p), io.pod("repeat_penalty", p.sampling.repeat_penalty);
  io.pod("repeat_last_n", p.sampling.repeat_last_n), io.pod("seed", p.sampling.seed);
  io.array("stop_tokens", p.stop_tokens);
  io.pod("want_logprobs", p.want_logprobs), io.pod("top_logprobs", p.top_logprobs);
  io.text("cache_scope", p.cache_scope), io.text("tenant", p.tenant);
}

template <class Io, class S>
void speculative_fields(Io& io, S& s) {
  io.pod("speculative.mode", s.mode), io.pod("speculative.draft_max", s.draft_max);
  io.pod("speculative.ngram_min", s.lookup.ngram_min), io.pod("speculative.ngram_max", s.lookup.ngram_max);
  io.pod("speculative.draft_p_min", s.draft_p_min);
}

}  // namespace

std::vector<uint8_t> encode_request(const RequestParams& p) {
  HandoffWriter w;
  w.pod("magic", kRequestMagic);
  request_fields(w, p);
  w.pod("has_speculative", (uint8_t)p.speculative.has_value());
  if (p.speculative) speculative_fields(w, *p.speculative);
  w.pod("has_grammar", (uint8_t)(p.grammar != nullptr));
  if (p.grammar) write_grammar(w, *p.grammar);
  return std::move(w.out);
}

Result<RequestParams> decode_request(std::span<const uint8_t> bytes) {
  RequestParams p;
  HandoffReader r{bytes, {}};
  uint32_t magic = 0;
  r.pod("magic", magic);
  if (r.ok() && magic != kRequestMagic) return make_error("hand-off request of {} bytes: not one (it starts with {:#010x})", bytes.size(), magic);
  request_fields(r, p);
  uint8_t has = 0;
  r.pod("has_speculative", has);
  if (r.ok() && has) {
    SpeculativeParams s;
    speculative_fields(r, s);
    if (r.ok() && (s.mode < SpeculativeMode::Off || s.mode > SpeculativeMode::Draft))
      r.fail(fmt::format("speculative mode {} is not one", (int)s.mode));
    p.speculative = s;
  }
  r.pod("has_grammar", has);
  std::shared_ptr<grammar::Grammar> g;
  if (r.ok() && has) g = read_grammar(r);
  if (!r.ok()) return make_error("hand-off request of {} bytes: {}", bytes.size(), r.error);
  if (!r.in.empty()) return make_error("hand-off request of {} bytes: {} bytes left over after its last field", bytes.size(), r.in.size());
  if (g) {
    if (Status st = grammar::validate(*g); !st.ok()) return make_error("hand-off request: its grammar: {}", st.error().message);
    p.grammar = std::move(g);
  }
  return p;
}

void append_event(HandoffMessage& m, const SeqEvent& e) {
  if (e.finish == FinishReason::None) {
    m.ev_tokens.push_back(e.token);
    m.ev_logprobs.push_back(e.logprob);
    m.ev_top_n.push_back((int32_t)e.top_logprobs.size());
    for (const auto& [id, lp] : e.top_logprobs) m.ev_top_ids.push_back(id), m.ev_top_logprobs.push_back(lp);
    return;
  }
  m.finish = (uint8_t)e.finish;
  m.finish_flags = (uint8_t)((e.by_stop_token ? 1 : 0) | (e.over_budget ? 2 : 0));
  m.error = e.error;
  m.n_prompt = e.n_prompt, m.n_cached = e.n_cached, m.n_generated = e.n_generated, m.n_preemptions = e.n_preemptions;
}

std::vector<SeqEvent> events_of(const HandoffMessage& m) {
  std::vector<SeqEvent> out;
  size_t top = 0;
  for (size_t i = 0; i < m.ev_tokens.size(); i++) {
    SeqEvent& e = out.emplace_back();
    e.id = m.id;
    e.token = m.ev_tokens[i];
    e.logprob = m.ev_logprobs[i];
    for (int32_t k = 0; k < m.ev_top_n[i]; k++, top++) e.top_logprobs.push_back({m.ev_top_ids[top], m.ev_top_logprobs[top]});
  }
  if (m.finish != 0) {
    SeqEvent& e = out.emplace_back();
    e.id = m.id;
    e.finish = (FinishReason)m.finish;
    e.by_stop_token = m.finish_flags & 1;
    e.over_budget = m.finish_flags & 2;
    e.error = m.error;
    e.n_prompt = (int)m.n_prompt, e.n_cached = (int)m.n_cached, e.n_generated = (int)m.n_generated;
    e.n_preemptions = (int)m.n_preemptions;
  }
  return out;
}

}  // namespace tandem
