// The draft model's passes for speculative decoding: its own K,V catch up with each
// sequence's tokens (during prefill, beside the target's pass), then one batched pass per draft
// position proposes tokens, in the draft model's own block pool.
#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "engine/speculator.h"

namespace tandem {

// One step's drafting by the draft model: the jobs drafting, each one's tokens and draft so
// far (the draft sampler's history), and whether it is still drafting.
struct Speculator::Round {
  std::vector<Job> live;
  std::vector<std::vector<int32_t>> history;
  std::vector<bool> active;
};

void Speculator::prefill(const std::vector<PrefillChunk>& chunks) {
  Timer timer;
  const int64_t passes_before = stats_.draft_passes;
  std::vector<Job> jobs;
  std::vector<int64_t> upto;  // prompt positions each job's draft K,V should hold
  for (const PrefillChunk& c : chunks) {
    const int64_t end = std::min(c.end, reserve_draft_positions(*c.spec, c.end));
    if (end > c.spec->draft_computed) jobs.push_back({c.spec, c.tokens, 0}), upto.push_back(end);
  }
  const Status st = advance(jobs, upto, nullptr);
  for (const Job& j : jobs) {
    if (!st.ok()) j.sp->draft_computed = 0;  // recomputed by a later catch-up
    j.sp->draft_kv.trim(j.sp->draft_computed);
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

void Speculator::draft_with_model(const std::vector<Job>& jobs) {
  Timer timer;
  Round r = reserve_draft_blocks(jobs);
  // Catch-up passes first, the last of a job's chunks giving its first draft token; then one
  // pass per draft position for all the jobs still drafting.
  Status st = catch_up(r);
  if (st.ok()) st = draft_positions(r);
  for (const Job& j : r.live) {
    Speculation& sp = *j.sp;
    if (!st.ok()) {  // a failed draft pass: no drafts this step, the draft K,V recomputed later
      sp.clear_draft();
      sp.draft_computed = 0;
    } else if (sp.draft.empty()) {
      sp.backoff.declined();
    }
    sp.draft_kv.trim(sp.draft_computed);
  }
  stats_.draft_pass_s += timer.seconds();
}

Speculator::Round Speculator::reserve_draft_blocks(const std::vector<Job>& jobs) {
  // Each job's draft K,V must hold its tokens so far (catch-up: the prompt at first, then the
  // tokens of earlier steps the draft model has not run, e.g. a bonus token) and the first
  // k - 1 drafted tokens (the last drafted one is only ever run by the target). Draft blocks
  // only come from free ones: a job that gets too few drafts less or not at all.
  Round r;
  for (Job j : jobs) {
    Speculation& sp = *j.sp;
    const int64_t L = (int64_t)j.tokens.size();
    j.n = std::min<int64_t>(j.n, reserve_draft_positions(sp, L + j.n - 1) - L + 1);
    if (j.n <= 0) {
      sp.draft_kv.trim(sp.draft_computed);
      continue;
    }
    r.live.push_back(j);
    r.history.emplace_back(j.tokens.begin(), j.tokens.end());
    r.active.push_back(true);
  }
  return r;
}

void Speculator::take_proposal(Round& r, size_t i, std::span<const float> row) {
  Speculation& sp = *r.live[i].sp;
  if (!confident(row, sp.params.draft_p_min)) {
    r.active[i] = false;
    return;
  }
  std::vector<TokenProb> q;
  const int32_t t = sp.draft_sampler.propose(row, r.history[i], q);
  sp.draft.push_back(t);
  sp.draft_q.push_back(std::move(q));
  r.history[i].push_back(t);
  r.active[i] = (int64_t)sp.draft.size() < r.live[i].n;
}

Status Speculator::catch_up(Round& r) {
  std::vector<int64_t> upto;
  for (const Job& j : r.live) upto.push_back((int64_t)j.tokens.size());
  return advance(r.live, upto, [&](size_t i, std::span<const float> row) { take_proposal(r, i, row); });
}

Status Speculator::advance(const std::vector<Job>& jobs, const std::vector<int64_t>& upto,
                           const std::function<void(size_t, std::span<const float>)>& at_end) {
  const ForwardBatch::Logits end_logits = at_end ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None;
  while (true) {
    ForwardBatch batch(draft_model_.pool->block_tokens());
    std::vector<std::pair<size_t, int64_t>> in;  // job, tokens in this pass
    int64_t budget = max_batch_tokens_;
    for (size_t i = 0; i < jobs.size() && budget > 0; i++) {
      Speculation& sp = *jobs[i].sp;
      const int64_t n = std::min(upto[i] - sp.draft_computed, budget);
      if (n <= 0) continue;
      const std::span<const int32_t> chunk = jobs[i].tokens.subspan((size_t)sp.draft_computed, (size_t)n);
      const bool last = sp.draft_computed + n == upto[i];
      TANDEM_TRY(batch.add_sequence(chunk, sp.draft_computed, sp.draft_kv.tables(), last ? end_logits : ForwardBatch::Logits::None));
      in.push_back({i, n});
      budget -= n;
    }
    if (in.empty()) return Status::Ok();
    stats_.draft_passes++;
    auto logits = draft_model_.model->forward(*draft_model_.pool, batch);
    if (!logits.ok()) return logits.error();
    size_t row = 0;
    for (auto [i, n] : in) {
      Speculation& sp = *jobs[i].sp;
      sp.draft_computed += n;
      if (at_end && sp.draft_computed == upto[i]) at_end(i, logits.value().subspan(row++ * n_vocab_, n_vocab_));
    }
  }
}

Status Speculator::draft_positions(Round& r) {
  for (size_t j = 1;; j++) {  // the pass that runs draft[j - 1] and proposes draft[j]
    ForwardBatch batch(draft_model_.pool->block_tokens());
    std::vector<size_t> in;
    for (size_t i = 0; i < r.live.size(); i++) {
      Speculation& sp = *r.live[i].sp;
      if (!r.active[i] || sp.draft.size() != j) continue;
      TANDEM_TRY(batch.add_sequence(std::span<const int32_t>(&sp.draft[j - 1], 1), sp.draft_computed, sp.draft_kv.tables(),
                                    ForwardBatch::Logits::Last));
      in.push_back(i);
    }
    if (in.empty()) return Status::Ok();
    stats_.draft_passes++;
    auto logits = draft_model_.model->forward(*draft_model_.pool, batch);
    if (!logits.ok()) return logits.error();
    for (size_t k = 0; k < in.size(); k++) {
      r.live[in[k]].sp->draft_computed++;
      take_proposal(r, in[k], logits.value().subspan(k * n_vocab_, n_vocab_));
    }
  }
}

int64_t Speculator::reserve_draft_positions(Speculation& sp, int64_t positions) {
  sp.draft_kv.grow_to(positions, sp.draft_computed);  // as many as are free
  return sp.draft_kv.held_positions();
}

}  // namespace tandem
