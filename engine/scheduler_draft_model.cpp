// The draft model's passes for speculative decoding: its own K,V catch up with each
// sequence's tokens (during prefill, beside the target's pass), then one batched pass per draft
// position proposes tokens, in the draft model's own block pool.
#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "engine/scheduler_seq.h"

namespace tandem {

void Scheduler::draft_prefill(const std::vector<Planned>& plan) {
  Timer timer;
  const int64_t passes_before = stats_.draft_passes;
  std::vector<Seq*> jobs;
  std::vector<int64_t> upto;  // prompt positions each job's draft K,V should hold
  for (const Planned& p : plan) {
    Seq& s = *p.seq;
    const bool prefilling = s.draft.empty() && s.n_computed + 1 < (int64_t)s.tokens.size();
    if (!prefilling || s.spec.mode != SpeculativeMode::Draft) continue;
    // n_computed is the target's before this pass.
    const int64_t end = std::min(s.n_computed + p.n, reserve_draft_positions(s, s.n_computed + p.n));
    if (end > s.draft_computed) jobs.push_back(&s), upto.push_back(end);
  }
  const Status st = draft_advance(jobs, upto, nullptr);
  for (Seq* s : jobs) {
    if (!st.ok()) s->draft_computed = 0;  // recomputed by a later catch-up
    s->draft_kv.trim(s->draft_computed);
  }
  const double seconds = timer.seconds();
  stats_.draft_pass_s += seconds;
  stats_.draft_prefill_s += seconds;
  stats_.draft_prefill_passes += stats_.draft_passes - passes_before;
}

namespace {

// Whether the most likely token's probability under the raw softmax of `logits` is at least
// p_min: whether sum(exp(logit - max)) stays within 1 / p_min. Logits 30 below the maximum add
// under 1e-13 each and are skipped, so a confident distribution costs a few exps, and the sum
// stops as soon as it passes the limit.
bool confident(std::span<const float> logits, float p_min) {
  if (p_min <= 0.0f) return true;
  const float mx = *std::max_element(logits.begin(), logits.end());
  const double limit = 1.0 / (double)p_min;
  double sum = 0;
  for (float x : logits) {
    if (x - mx < -30.0f) continue;
    sum += std::exp((double)(x - mx));
    if (sum > limit) return false;
  }
  return true;
}

}  // namespace

// One step's drafting by the draft model: the sequences drafting and how many tokens each may
// draft (live), each one's tokens and draft so far (the draft sampler's history), and whether
// it is still drafting.
struct Scheduler::DraftRound {
  std::vector<Planned> live;
  std::vector<std::vector<int32_t>> history;
  std::vector<bool> active;
};

void Scheduler::draft_with_model(const std::vector<Planned>& jobs) {
  Timer timer;
  DraftRound r = reserve_draft_blocks(jobs);
  // Catch-up passes first, the last of a job's chunks giving its first draft token; then one
  // pass per draft position for all the jobs still drafting.
  Status st = draft_catch_up(r);
  if (st.ok()) st = draft_positions(r);
  for (const Planned& j : r.live) {
    Seq& s = *j.seq;
    if (!st.ok()) {  // a failed draft pass: no drafts this step, the draft K,V recomputed later
      s.draft.clear();
      s.draft_q.clear();
      s.draft_computed = 0;
    } else if (s.draft.empty()) {
      s.backoff.declined();
    }
    s.draft_kv.trim(s.draft_computed);
  }
  stats_.draft_pass_s += timer.seconds();
}

Scheduler::DraftRound Scheduler::reserve_draft_blocks(const std::vector<Planned>& jobs) {
  // Each job's draft K,V must hold its tokens so far (catch-up: the prompt at first, then the
  // tokens of earlier steps the draft model has not run, e.g. a bonus token) and the first
  // k - 1 drafted tokens (the last drafted one is only ever run by the target). Draft blocks
  // only come from free ones: a job that gets too few drafts less or not at all.
  DraftRound r;
  for (Planned j : jobs) {
    Seq& s = *j.seq;
    const int64_t L = (int64_t)s.tokens.size();
    j.n = std::min<int64_t>(j.n, reserve_draft_positions(s, L + j.n - 1) - L + 1);
    if (j.n <= 0) {
      s.draft_kv.trim(s.draft_computed);
      continue;
    }
    r.live.push_back(j);
    r.history.push_back(s.tokens);
    r.active.push_back(true);
  }
  return r;
}

void Scheduler::draft_propose(DraftRound& r, size_t i, std::span<const float> row) {
  Seq& s = *r.live[i].seq;
  if (!confident(row, s.spec.draft_p_min)) {
    r.active[i] = false;
    return;
  }
  std::vector<TokenProb> q;
  const int32_t t = s.draft_sampler.propose(row, r.history[i], q);
  s.draft.push_back(t);
  s.draft_q.push_back(std::move(q));
  r.history[i].push_back(t);
  r.active[i] = (int64_t)s.draft.size() < r.live[i].n;
}

Status Scheduler::draft_catch_up(DraftRound& r) {
  std::vector<Seq*> seqs;
  std::vector<int64_t> upto;
  for (const Planned& j : r.live) seqs.push_back(j.seq), upto.push_back((int64_t)j.seq->tokens.size());
  return draft_advance(seqs, upto, [&](size_t i, std::span<const float> row) { draft_propose(r, i, row); });
}

Status Scheduler::draft_advance(const std::vector<Seq*>& seqs, const std::vector<int64_t>& upto,
                                const std::function<void(size_t, std::span<const float>)>& at_end) {
  const size_t V = (size_t)opts_.draft_model.model->config().n_vocab;
  const ForwardBatch::Logits end_logits = at_end ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None;
  while (true) {
    ForwardBatch batch(opts_.draft_model.pool->block_tokens());
    std::vector<std::pair<size_t, int64_t>> in;  // job, tokens in this pass
    int64_t budget = opts_.max_batch_tokens;
    for (size_t i = 0; i < seqs.size() && budget > 0; i++) {
      Seq& s = *seqs[i];
      const int64_t n = std::min(upto[i] - s.draft_computed, budget);
      if (n <= 0) continue;
      const std::span<const int32_t> chunk(s.tokens.data() + s.draft_computed, (size_t)n);
      const bool last = s.draft_computed + n == upto[i];
      TANDEM_TRY(batch.add_sequence(chunk, s.draft_computed, s.draft_kv.tables(), last ? end_logits : ForwardBatch::Logits::None));
      in.push_back({i, n});
      budget -= n;
    }
    if (in.empty()) return Status::Ok();
    stats_.draft_passes++;
    auto logits = opts_.draft_model.model->forward(*opts_.draft_model.pool, batch);
    if (!logits.ok()) return logits.error();
    size_t row = 0;
    for (auto [i, n] : in) {
      Seq& s = *seqs[i];
      s.draft_computed += n;
      if (at_end && s.draft_computed == upto[i]) at_end(i, logits.value().subspan(row++ * V, V));
    }
  }
}

Status Scheduler::draft_positions(DraftRound& r) {
  const size_t V = (size_t)opts_.draft_model.model->config().n_vocab;
  for (size_t j = 1;; j++) {  // the pass that runs draft[j - 1] and proposes draft[j]
    ForwardBatch batch(opts_.draft_model.pool->block_tokens());
    std::vector<size_t> in;
    for (size_t i = 0; i < r.live.size(); i++) {
      Seq& s = *r.live[i].seq;
      if (!r.active[i] || s.draft.size() != j) continue;
      TANDEM_TRY(batch.add_sequence(std::span<const int32_t>(&s.draft[j - 1], 1), s.draft_computed, s.draft_kv.tables(),
                                    ForwardBatch::Logits::Last));
      in.push_back(i);
    }
    if (in.empty()) return Status::Ok();
    stats_.draft_passes++;
    auto logits = opts_.draft_model.model->forward(*opts_.draft_model.pool, batch);
    if (!logits.ok()) return logits.error();
    for (size_t k = 0; k < in.size(); k++) {
      r.live[in[k]].seq->draft_computed++;
      draft_propose(r, in[k], logits.value().subspan(k * V, V));
    }
  }
}

int64_t Scheduler::reserve_draft_positions(Seq& s, int64_t positions) {
  s.draft_kv.grow_to(positions, s.draft_computed);  // as many as are free
  return s.draft_kv.held_positions();
}

}  // namespace tandem
