// The scheduler's loop: requests in (add, cancel), and each step's three parts, schedule() ->
// run() -> postprocess(). Paging, emission, grammar constraints and speculative rounds are the
// parts it calls, each in its own scheduler_*.cpp file.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/timer.h"
#include "engine/scheduler_seq.h"

namespace tandem {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    default: return "none";
  }
}

Scheduler::Scheduler(Model& model, BlockPool& pool, const SchedulerOptions& o)
    : model_(model),
      pool_(pool),
      opts_(o),
      speculator_(opts_.speculative, opts_.draft_model, model_, opts_.max_batch_tokens, stats_) {}

Scheduler::~Scheduler() = default;  // each sequence's BlockTables give their blocks back

Result<std::unique_ptr<Scheduler::Seq>> Scheduler::prepare(RequestParams p, SeqCallback cb) {
  const int64_t ctx = model_.config().n_ctx_train;
  if (p.prompt.empty()) return make_error("the prompt is empty");
  if ((int64_t)p.prompt.size() >= ctx)
    return make_error("the prompt has {} tokens; the model's context is {}", p.prompt.size(), ctx);
  const int64_t need = blocks_for_tokens((int64_t)p.prompt.size() + 1);
  if (need > pool_.shape().n_blocks)
    return make_error("the prompt needs {} KV blocks; the pool has {}", need, pool_.shape().n_blocks);
  p.max_tokens = (int)std::min<int64_t>(std::max(0, p.max_tokens), ctx - (int64_t)p.prompt.size());
  std::optional<grammar::Matcher> matcher;
  if (p.grammar) {
    if (!opts_.masker) return make_error("constrained decoding needs the vocabulary's token masker (SchedulerOptions::masker)");
    if ((int64_t)opts_.masker->n_vocab() != model_.config().n_vocab)
      return make_error("the token masker has {} tokens; the model {}", opts_.masker->n_vocab(), model_.config().n_vocab);
    auto m = grammar::Matcher::create(p.grammar, opts_.masker->budget().state);
    if (!m.ok()) return m.error();
    matcher = std::move(m.value());
  }
  auto spec = speculator_.start(p.speculative, p.sampling);
  if (!spec.ok()) return spec.error();
  const int64_t id = next_id_++;
  auto s = std::make_unique<Seq>(id, std::move(p), std::move(cb), std::move(spec.value()));
  s->matcher = std::move(matcher);
  s->tokens = s->params.prompt;
  s->kv = BlockTable(pool_, pool_.scope_root(s->params.cache_scope));
  s->n_prompt = (int)s->tokens.size();
  return s;
}

Result<int64_t> Scheduler::add(RequestParams p, SeqCallback cb) {
  auto s = prepare(std::move(p), std::move(cb));
  if (!s.ok()) return s.error();
  const int64_t id = s.value()->id;
  waiting_.push_back(std::move(s.value()));
  return id;
}

void Scheduler::cancel(int64_t id) {
  for (auto& s : waiting_)
    if (s->id == id) s->cancelled = true;
  for (auto& s : running_)
    if (s->id == id) s->cancelled = true;
}

void Scheduler::abort_all(const std::string& why) {
  for (auto& s : waiting_) finish(*s, FinishReason::Error, why);
  for (auto& s : running_) finish(*s, FinishReason::Error, why);
  waiting_.clear();
  running_.clear();
}

// One iteration in three parts, as nano-vllm and vLLM run it: schedule() decides which
// sequences run how many tokens and gives them blocks, run() is the one forward pass over
// their ForwardBatch, postprocess() samples and reports.
Status Scheduler::step() {
  drop_cancelled();
  admit_waiting();
  const std::vector<Planned> plan = schedule();
  if (plan.empty()) return Status::Ok();
  std::vector<Planned> logit_rows;
  Timer pass_timer;
  auto logits = run(plan, logit_rows);
  stats_.pass_s += pass_timer.seconds();
  stats_.steps++;
  if (!logits.ok()) {
    const std::string msg = logits.error().message;
    for (const Planned& p : plan) p.seq->spec.clear_draft(), finish(*p.seq, FinishReason::Error, msg);
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }), running_.end());
    return logits.error();
  }
  if (speculator_.has_draft_model()) draft_prefill(plan);
  postprocess(plan, logit_rows, logits.value());
  return Status::Ok();
}

void Scheduler::drop_cancelled() {
  // Cancelled requests first: their blocks return to the pool now.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled) {
      finish(**it, FinishReason::Cancelled);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->cancelled) {
      finish(**it, FinishReason::Cancelled);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::admit_waiting() {
  // A preempted sequence whose tokens so far outgrew the whole pool can never run again, and
  // one that cannot be admitted into an empty batch never will be: both end as "length" (cut
  // short for want of KV blocks) rather than waiting forever.
  preempt_for_waiting_tenant();
  while (!waiting_.empty() && (int)running_.size() < opts_.max_running) {
    const auto next = waiting_.begin() + (ptrdiff_t)next_admission();  // the tenant with the fewest running
    Seq& s = **next;
    const bool outgrown = blocks_for_tokens((int64_t)s.tokens.size()) > pool_.shape().n_blocks;
    if (!outgrown && admit(s)) {
      running_.push_back(std::move(*next));
      waiting_.erase(next);
      continue;
    }
    if (!outgrown && preempt_for_blocks_of(s)) continue;  // a tenant with nothing running: room from the largest
    if (!outgrown && !running_.empty()) break;  // room comes back as others finish
    finish(s, FinishReason::Length, "the KV pool is full");
    waiting_.erase(next);
  }
}

std::vector<Scheduler::Planned> Scheduler::schedule() {
  std::vector<Planned> plan;
  if (running_.empty()) return plan;
  // Decode tokens first (one each), then prefill chunks within the budget, shared between
  // tenants (scheduler_fairness.cpp).
  int64_t budget = opts_.max_batch_tokens;
  if (plan_first_tokens(plan, budget)) budget = 0;  // a waiting tenant's first tokens, alone
  for (auto& sp : running_) {
    Seq& s = *sp;
    if ((int64_t)s.tokens.size() - s.n_computed != 1 || budget <= 0) continue;
    plan.push_back({&s, 1});
    budget--;
  }
  plan_prefill(plan, budget);
  // Blocks for the plan; when the pool is exhausted preempt the newest running sequence that
  // has made progress since it last came back (possibly the one asking), so that no sequence
  // is preempted and readmitted in a loop without producing a token. A sequence alone that
  // still cannot grow has outgrown the pool.
  for (size_t i = 0; i < plan.size();) {
    Seq* s = plan[i].seq;
    if (s->kv.grow_to(s->n_computed + plan[i].n, s->n_computed)) {
      i++;
      continue;
    }
    if (running_.size() == 1) {
      finish(*s, FinishReason::Length, "the KV pool is full");
      running_.clear();
      plan.clear();
      break;
    }
    Seq* victim = preemption_victim();
    if (!victim && plan.size() > 1) {  // every candidate is yet to make progress: this one waits a step
      plan.erase(plan.begin() + (ptrdiff_t)i);
      continue;
    }
    if (!victim) victim = running_.back().get();  // never stall the whole batch
    auto vit = std::find_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.seq == victim; });
    if (vit != plan.end()) {
      const size_t vi = (size_t)(vit - plan.begin());
      plan.erase(vit);
      if (vi < i) i--;
    }
    requeue(*victim, /*at_front=*/true);
  }
  propose_drafts(plan, budget);
  return plan;
}

Result<std::span<const float>> Scheduler::run(const std::vector<Planned>& plan, std::vector<Planned>& logit_rows) {
  // The pass's batch: each planned sequence's next tokens; logits where a chunk reaches the
  // sequence's last token (a prompt's end, or a decode token), and for every drafted token.
  ForwardBatch batch(pool_.block_tokens());
  for (const Planned& p : plan) {
    Seq& s = *p.seq;
    if (!s.spec.draft.empty()) {  // the decode token, then the draft at the positions after it
      std::vector<int32_t> chunk(1, s.tokens.back());
      chunk.insert(chunk.end(), s.spec.draft.begin(), s.spec.draft.end());
      TANDEM_TRY(batch.add_sequence(chunk, s.n_computed, s.kv.tables(), ForwardBatch::Logits::All));
      logit_rows.push_back({&s, (int64_t)chunk.size()});
      continue;
    }
    const bool last = s.n_computed + p.n == (int64_t)s.tokens.size();
    const std::span<const int32_t> chunk(s.tokens.data() + s.n_computed, (size_t)p.n);
    TANDEM_TRY(batch.add_sequence(chunk, s.n_computed, s.kv.tables(), last ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None));
    if (last) logit_rows.push_back({&s, 1});
  }
  // Rows that only their argmax is read from let the backend skip most of an exact head's
  // work (a serving step's many rows make it compute-bound); the tokens are the same.
  batch.argmax_logits = !logit_rows.empty() && std::all_of(logit_rows.begin(), logit_rows.end(), [](const Planned& p) {
    const Seq& s = *p.seq;
    return s.sampler.plain_greedy() && !s.matcher && !s.params.want_logprobs && s.params.top_logprobs == 0 &&
           !s.params.prefill_only;
  });
  return model_.forward(pool_, batch);
}

void Scheduler::postprocess(const std::vector<Planned>& plan, const std::vector<Planned>& logit_rows,
                            std::span<const float> logits) {
  for (const Planned& p : plan) {
    // A drafted position counts as computed only once the target accepts its token.
    p.seq->n_computed += p.seq->spec.draft.empty() ? p.n : 1;
    if (!opts_.no_kv_cache) {
      p.seq->kv.publish_full(p.seq->tokens, p.seq->n_computed);
      p.seq->kv.drop_out_of_window(p.seq->n_computed);
    }
    if (opts_.on_computed) opts_.on_computed(p.seq->id, p.seq->kv, p.seq->n_computed);
  }
  // Sample for every sequence whose last token ran (verify its draft), and report.
  const size_t V = (size_t)model_.config().n_vocab;
  std::vector<Seq*> done;
  size_t row = 0;
  for (const Planned& lr : logit_rows) {
    Seq& s = *lr.seq;
    const std::span<const float> rows = logits.subspan(row * V, (size_t)lr.n * V);
    row += (size_t)lr.n;
    if (s.params.prefill_only) {
      finish_prefill(s, rows);
      continue;
    }
    if (s.n_generated >= s.params.max_tokens) {  // max_tokens == 0, or resumed at the limit
      s.spec.clear_draft();
      done.push_back(&s);
      continue;
    }
    if (!s.spec.draft.empty()) {
      verify_draft(s, rows, done);
      continue;
    }
    const int32_t tok = sample_next(s, rows);
    if (tok < 0) continue;  // finished: the grammar allows no token
    if (opts_.no_kv_cache) s.n_computed = 0;  // naive mode: the next pass recomputes every K,V
    emit(s, tok, rows, done);
  }
  for (Seq* s : done) finish(*s, FinishReason::Length);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }), running_.end());
}

}  // namespace tandem
