// The scheduler's emission: one generated token reported to its request (log-probabilities,
// stop tokens, the grammar's matcher advanced, limits), and a request's finish event.
#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "engine/scheduler_seq.h"

namespace tandem {

namespace {

// log(sum(exp(logits))), computed stably: logit - this is the log-softmax.
double log_softmax_norm(std::span<const float> logits) {
  float mx = logits[0];
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp((double)x - mx);
  return mx + std::log(sum);
}

// The n most likely token ids, most likely first (ties: the lower id first).
std::vector<int32_t> top_ids(std::span<const float> logits, int n) {
  n = std::clamp(n, 0, (int)logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)i;
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[(size_t)a] > logits[(size_t)b] || (logits[(size_t)a] == logits[(size_t)b] && a < b);
  });
  ids.resize((size_t)n);
  return ids;
}

}  // namespace

bool Scheduler::emit(Seq& s, int32_t tok, std::span<const float> row, std::vector<Seq*>& done) {
  SeqEvent e;
  e.id = s.id;
  e.token = tok;
  if (s.params.want_logprobs || s.params.top_logprobs > 0) {
    const double norm = log_softmax_norm(row);
    e.logprob = (float)((double)row[(size_t)tok] - norm);
    if (s.params.top_logprobs > 0)
      for (int32_t id : top_ids(row, s.params.top_logprobs)) e.top_logprobs.push_back({id, (float)((double)row[(size_t)id] - norm)});
  }
  const bool eog = std::find(s.params.stop_tokens.begin(), s.params.stop_tokens.end(), tok) != s.params.stop_tokens.end();
  if (eog) {
    finish(s, FinishReason::Stop, "", true);
    return false;
  }
  bool sentence_complete = false;
  if (s.matcher) {
    // The mask let only tokens that continue the sentence through, so this cannot fail; if it
    // does (a bug), the request ends with an error rather than leave its grammar.
    Timer t;
    const bool ok = s.matcher->accept(opts_.masker->token_bytes(tok));
    sentence_complete = ok && s.matcher->must_end();
    stats_.mask_s += t.seconds();
    if (!ok) {
      const std::string over = s.matcher->budget_error();
      if (!over.empty()) opts_.masker->forget(&s.matcher->grammar());  // its states are done with
      s.over_budget = !over.empty();
      finish(s, FinishReason::Error, !over.empty() ? over : fmt::format("token {} does not continue the grammar's sentence", tok));
      return false;
    }
  }
  s.tokens.push_back(tok);
  s.n_generated++;
  stats_.generated_tokens++;
  if (!s.cb(e)) {
    finish(s, FinishReason::Cancelled);
    return false;
  }
  if (sentence_complete) {  // nothing can follow: done without waiting for a stop token
    finish(s, FinishReason::Stop);
    return false;
  }
  if (s.n_generated >= s.params.max_tokens || (int64_t)s.tokens.size() >= model_.config().n_ctx_train) {
    done.push_back(&s);
    return false;
  }
  return true;
}

void Scheduler::finish(Seq& s, FinishReason r, const std::string& error, bool by_stop_token) {
  s.finished = true;
  release_blocks(s);
  SeqEvent e;
  e.id = s.id;
  e.finish = r;
  e.by_stop_token = by_stop_token;
  e.error = error;
  e.n_prompt = s.n_prompt;
  e.n_cached = s.n_cached;
  e.n_generated = s.n_generated;
  e.n_preemptions = s.n_preemptions;
  e.over_budget = s.over_budget;
  s.cb(e);
}

}  // namespace tandem
