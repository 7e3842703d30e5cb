// The Speculator's rounds: drafts proposed into free blocks (prompt lookup here, the draft
// model's passes in speculator_draft_model.cpp), the target's verdicts walked over them, and
// the rejected positions rolled back.
#include "engine/speculator.h"

#include <algorithm>

#include "engine/draft_lookup.h"

namespace tandem {

namespace {

SamplingParams draft_sampling(SamplingParams sp) {
  sp.seed ^= 0x9E3779B97F4A7C15ull;  // the draft model's own random stream
  return sp;
}

}  // namespace

Speculation::Speculation(const SpeculativeParams& p, const SamplingParams& sampling)
    : params(p), backoff(p.draft_max, p.mode == SpeculativeMode::Draft), draft_sampler(draft_sampling(sampling)) {}

Speculator::Speculator(const SpeculativeParams& defaults, DraftModel draft_model, const Model& target,
                       int64_t max_batch_tokens, SpeculationStats& stats)
    : defaults_(defaults),
      draft_model_(draft_model),
      n_vocab_((size_t)target.config().n_vocab),
      max_batch_tokens_(max_batch_tokens),
      stats_(stats) {
  if (draft_model_) draft_cost_ = draft_model_min_rate((double)draft_model_.model->gguf().tensor_bytes(),
                                                       (double)target.gguf().tensor_bytes());
}

Result<Speculation> Speculator::start(const std::optional<SpeculativeParams>& asked, const SamplingParams& sampling) const {
  const SpeculativeParams p = asked.value_or(defaults_);
  if (p.mode == SpeculativeMode::Draft) {
    if (!draft_model_) return make_error("speculative mode 'draft' needs a draft model (start with --draft-model FILE)");
    if ((size_t)draft_model_.model->config().n_vocab != n_vocab_)
      return make_error("the draft model's vocabulary ({} tokens) is not the model's ({})",
                        draft_model_.model->config().n_vocab, n_vocab_);
  }
  Speculation sp(p, sampling);
  if (draft_model_) sp.draft_kv = BlockTable(*draft_model_.pool);
  return sp;
}

int64_t Speculator::propose(std::vector<DraftRequest>& reqs, int64_t budget) {
  // Drafts come last in a step: in a pass that also prefills, the budget left is what prefill
  // did not need.
  std::vector<Job> jobs;  // sequences the draft model drafts for
  std::vector<DraftRequest*> by_model;
  int64_t drafted = 0;
  for (DraftRequest& r : reqs) {
    Speculation& sp = *r.spec;
    sp.clear_draft();
    if (sp.params.mode == SpeculativeMode::Off) continue;
    if (sp.backoff.allowed() == 0) {
      sp.backoff.step_without_draft();
      continue;
    }
    const int64_t k = std::min<int64_t>({sp.backoff.allowed(), r.room, budget});
    if (k <= 0) continue;
    if (sp.params.mode == SpeculativeMode::Draft) {
      // The target's blocks first: draft passes for tokens the verify pass has no room for
      // would be wasted.
      const int64_t fits = fit_target(r, k);
      if (fits > 0) jobs.push_back({&sp, r.tokens, fits}), by_model.push_back(&r), budget -= fits;
      continue;
    }
    sp.draft = lookup_draft(r.tokens, sp.params.lookup, (int)k);
    if (r.prune) r.prune(sp.draft);
    sp.draft.resize((size_t)fit_target(r, (int64_t)sp.draft.size()));
    budget -= (int64_t)sp.draft.size();
    drafted += (int64_t)sp.draft.size();
  }
  if (!jobs.empty()) {
    draft_with_model(jobs);
    // Target blocks reserved for draft tokens the draft model did not propose go back.
    for (DraftRequest* r : by_model) {
      r->kv->trim(r->n_computed() + 1 + (int64_t)r->spec->draft.size());
      drafted += (int64_t)r->spec->draft.size();
    }
  }
  return drafted;
}

int64_t Speculator::fit_target(const DraftRequest& r, int64_t k) {
  const int64_t n_computed = r.n_computed();
  if (k <= 0 || r.kv->grow_to(n_computed + 1 + k, n_computed)) return std::max<int64_t>(0, k);
  return std::max<int64_t>(0, r.kv->held_positions() - n_computed - 1);
}

Speculator::Verified Speculator::verify(Speculation& sp, std::span<const float> rows, const VerifySteps& steps) {
  // Walk the draft while the target accepts it; the first rejection's replacement, or after a
  // draft accepted whole the last row's own sample, ends the step.
  const std::vector<int32_t> draft = std::move(sp.draft);
  const std::vector<std::vector<TokenProb>> draft_q = std::move(sp.draft_q);
  sp.clear_draft();
  Verified out;
  for (size_t j = 0; j <= draft.size() && out.alive; j++) {
    const std::span<const float> row = rows.subspan(j * n_vocab_, n_vocab_);
    if (j == draft.size()) {
      const int32_t tok = steps.sample(row);
      out.alive = tok >= 0 && steps.emit(tok, row);
      break;
    }
    const auto v = steps.judge(row, draft[j], draft_q.empty() ? std::span<const TokenProb>() : draft_q[j]);
    if (!v) {
      out.alive = false;
      break;
    }
    if (!v->accepted) {
      out.alive = steps.emit(v->token, row);
      break;
    }
    out.accepted++;
    out.alive = steps.emit(draft[j], row);
  }
  stats_.drafted_tokens += (int64_t)draft.size();
  stats_.accepted_tokens += out.accepted;
  stats_.verify_steps++;
  sp.backoff.verified((int)draft.size(), out.accepted, sp.params.mode == SpeculativeMode::Draft ? draft_cost_ : 0.0);
  return out;
}

void Speculator::rollback(Speculation& sp, int64_t n_computed) {
  // The draft model ran the accepted drafts but the last (it only proposed that one) and the
  // rejected ones: it keeps the accepted positions it holds; the next step's catch-up runs
  // what it has not seen (the last accepted draft, the target's own token).
  sp.draft_computed = std::min(sp.draft_computed, n_computed);
  sp.draft_kv.trim(sp.draft_computed);
}

}  // namespace tandem
