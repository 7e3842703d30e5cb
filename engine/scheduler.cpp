#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "engine/draft_lookup.h"

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

struct Scheduler::Seq {
  int64_t id = 0;
  RequestParams params;
  SeqCallback cb;
  Sampler sampler;
  std::vector<int32_t> tokens;   // prompt, then generated
  int64_t n_computed = 0;        // tokens whose K,V are in `blocks`
  std::vector<int32_t> blocks;   // block table
  std::vector<uint64_t> hashes;  // chained hash of each full block (0 = not yet)
  int n_prompt = 0, n_cached = 0, n_generated = 0;
  bool cancelled = false;  // asked to stop (cancel()); finished at the next step
  bool finished = false;   // its finish event is sent; removed from running_ at the end of the step
  bool admitted = false;  // admitted once (a preempted sequence comes back)
  SpeculativeParams spec;        // mode Off: never drafts
  DraftBackoff backoff;
  std::vector<int32_t> draft;    // this step's proposal after tokens.back(), verified in the pass
  // Draft model only: the distribution each draft token was drawn from, the draft model's own
  // block table and how many of `tokens` its K,V hold, and the sampler it draws with (its own
  // random stream: the draws and the acceptance tests must be independent).
  std::vector<std::vector<TokenProb>> draft_q;
  std::vector<int32_t> draft_blocks;
  int64_t draft_computed = 0;
  Sampler draft_sampler;
  Seq(int64_t i, RequestParams p, SeqCallback c, const SpeculativeParams& sp)
      : id(i), params(std::move(p)), cb(std::move(c)), sampler(params.sampling),
        spec(params.speculative.value_or(sp)), backoff(spec.draft_max), draft_sampler(draft_sampling(params.sampling)) {}
  static SamplingParams draft_sampling(SamplingParams sp) {
    sp.seed ^= 0x9E3779B97F4A7C15ull;
    return sp;
  }
};

Scheduler::Scheduler(Model& model, BlockPool& pool, const SchedulerOptions& o) : model_(model), pool_(pool), opts_(o) {}
Scheduler::~Scheduler() {
  for (auto& s : running_) release_blocks(*s);
}

Result<int64_t> Scheduler::add(RequestParams p, SeqCallback cb) {
  const int64_t ctx = model_.config().n_ctx_train;
  if (p.prompt.empty()) return make_error("the prompt is empty");
  if ((int64_t)p.prompt.size() >= ctx)
    return make_error("the prompt has {} tokens; the model's context is {}", p.prompt.size(), ctx);
  const int64_t B = pool_.block_tokens();
  const int64_t need = ((int64_t)p.prompt.size() + 1 + B - 1) / B;
  if (need > pool_.shape().n_blocks)
    return make_error("the prompt needs {} KV blocks; the pool has {}", need, pool_.shape().n_blocks);
  p.max_tokens = (int)std::min<int64_t>(std::max(0, p.max_tokens), ctx - (int64_t)p.prompt.size());
  if (p.speculative.value_or(opts_.speculative).mode == SpeculativeMode::Draft) {
    if (!opts_.draft_model) return make_error("speculative mode 'draft' needs a draft model (start with --draft-model FILE)");
    if (opts_.draft_model.model->config().n_vocab != model_.config().n_vocab)
      return make_error("the draft model's vocabulary ({} tokens) is not the model's ({})",
                        opts_.draft_model.model->config().n_vocab, model_.config().n_vocab);
  }
  const int64_t id = next_id_++;
  auto s = std::make_unique<Seq>(id, std::move(p), std::move(cb), opts_.speculative);
  s->tokens = s->params.prompt;
  s->n_prompt = (int)s->tokens.size();
  waiting_.push_back(std::move(s));
  return id;
}

void Scheduler::cancel(int64_t id) {
  for (auto& s : waiting_)
    if (s->id == id) s->cancelled = true;
  for (auto& s : running_)
    if (s->id == id) s->cancelled = true;
}

bool Scheduler::admit(Seq& s) {
  // Reuse cached full blocks of the prefix; at least one token stays to compute, for logits.
  // Each hit is verified by the pool (token ids and parent), so a hash collision is a miss.
  const int64_t B = pool_.block_tokens();
  uint64_t parent = 0;
  const int64_t reusable = opts_.no_kv_cache ? 0 : ((int64_t)s.tokens.size() - 1) / B;
  for (int64_t k = 0; k < reusable; k++) {
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    const uint64_t h = pool_.chain_hash(parent, block);
    const int32_t b = pool_.lookup(k ? s.blocks.back() : -1, h, block);
    if (b < 0) break;
    s.blocks.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  s.n_computed = (int64_t)s.blocks.size() * B;
  const bool first_time = !s.admitted;
  if (first_time) s.n_cached = (int)s.n_computed;
  if (!ensure_blocks(s, s.n_computed + 1)) {
    release_blocks(s);
    s.n_computed = 0;
    if (first_time) s.n_cached = 0;
    return false;
  }
  if (first_time) {
    stats_.prompt_tokens += s.n_prompt;
    stats_.cached_prompt_tokens += s.n_cached;
  }
  s.admitted = true;
  return true;
}

bool Scheduler::ensure_blocks(Seq& s, int64_t upto) {
  const int64_t B = pool_.block_tokens();
  while ((int64_t)s.blocks.size() * B < upto) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
    s.hashes.push_back(0);
  }
  return true;
}

void Scheduler::preempt(Seq& s) {
  // Free everything; the sequence restarts from its tokens so far (prompt + generated).
  release_blocks(s);
  s.n_computed = 0;
  stats_.preemptions++;
}

void Scheduler::release_blocks(Seq& s) {
  // Last block first: the LRU then evicts a cached prefix from its end, and what stays cached
  // is still a prefix that a later request can reach from the start.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s.blocks.clear();
  s.hashes.clear();
  trim_draft_blocks(s, 0);
  s.draft_computed = 0;
}

void Scheduler::publish_full_blocks(Seq& s) {
  const int64_t B = pool_.block_tokens();
  const int64_t full = s.n_computed / B;
  for (int64_t k = 0; k < full && k < (int64_t)s.blocks.size(); k++) {
    if (s.hashes[(size_t)k] != 0) continue;
    const uint64_t parent = k ? s.hashes[(size_t)k - 1] : 0;
    const std::span<const int32_t> block(s.tokens.data() + k * B, (size_t)B);
    s.hashes[(size_t)k] = pool_.chain_hash(parent, block);
    pool_.publish(s.blocks[(size_t)k], k ? s.blocks[(size_t)k - 1] : -1, s.hashes[(size_t)k], block);
  }
}

void Scheduler::finish(Seq& s, FinishReason r, const std::string& error) {
  s.finished = true;
  release_blocks(s);
  SeqEvent e;
  e.id = s.id;
  e.finish = r;
  e.error = error;
  e.n_prompt = s.n_prompt;
  e.n_cached = s.n_cached;
  e.n_generated = s.n_generated;
  s.cb(e);
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
    for (const Planned& p : plan) p.seq->draft.clear(), p.seq->draft_q.clear(), finish(*p.seq, FinishReason::Error, msg);
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }), running_.end());
    return logits.error();
  }
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
  const int64_t B = pool_.block_tokens();
  while (!waiting_.empty() && (int)running_.size() < opts_.max_running) {
    Seq& s = *waiting_.front();
    const bool outgrown = ((int64_t)s.tokens.size() + B - 1) / B > pool_.shape().n_blocks;
    if (!outgrown && admit(s)) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    if (!outgrown && !running_.empty()) break;  // room comes back as others finish
    finish(s, FinishReason::Length, "the KV pool is full");
    waiting_.pop_front();
  }
}

std::vector<Scheduler::Planned> Scheduler::schedule() {
  std::vector<Planned> plan;
  if (running_.empty()) return plan;
  // Decode tokens first (one each), then prefill chunks, within the budget.
  int64_t budget = opts_.max_batch_tokens;
  for (int pass = 0; pass < 2; pass++)
    for (auto& sp : running_) {
      Seq& s = *sp;
      const int64_t remaining = (int64_t)s.tokens.size() - s.n_computed;
      const bool decoding = remaining == 1;
      if ((pass == 0) != decoding || budget <= 0) continue;
      plan.push_back({&s, std::min(remaining, budget)});
      budget -= plan.back().n;
    }
  // Blocks for the plan; when the pool is exhausted preempt the newest running sequence
  // (possibly the one asking). A sequence alone that still cannot grow has outgrown the pool.
  for (size_t i = 0; i < plan.size();) {
    Seq* s = plan[i].seq;
    if (ensure_blocks(*s, s->n_computed + plan[i].n)) {
      i++;
      continue;
    }
    if (running_.size() == 1) {
      finish(*s, FinishReason::Length, "the KV pool is full");
      running_.clear();
      plan.clear();
      break;
    }
    Seq* victim = running_.back().get();
    preempt(*victim);
    auto vit = std::find_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.seq == victim; });
    if (vit != plan.end()) {
      const size_t vi = (size_t)(vit - plan.begin());
      plan.erase(vit);
      if (vi < i) i--;
    }
    waiting_.push_front(std::move(running_.back()));
    running_.pop_back();
  }
  propose_drafts(plan, budget);
  return plan;
}

void Scheduler::propose_drafts(std::vector<Planned>& plan, int64_t budget) {
  // Drafts come last: in a pass that also prefills, the budget left is what prefill did not
  // need, and a draft only takes KV blocks that are free now (it never preempts).
  if (opts_.no_kv_cache) return;
  std::vector<Planned> jobs;  // sequences the draft model drafts for, and how many tokens each may
  for (Planned& p : plan) {
    Seq& s = *p.seq;
    s.draft.clear();
    s.draft_q.clear();
    const bool decoding = p.n == 1 && s.n_computed + 1 == (int64_t)s.tokens.size();
    if (!decoding || s.spec.mode == SpeculativeMode::Off) continue;
    if (s.backoff.allowed() == 0) {
      s.backoff.step_without_draft();
      continue;
    }
    // At most one token short of max_tokens: the step adds the target's own token after them.
    const int64_t k = std::min<int64_t>({s.backoff.allowed(), s.params.max_tokens - s.n_generated - 1, budget});
    if (k <= 0) continue;
    if (s.spec.mode == SpeculativeMode::Draft) {
      // The target's blocks first: draft passes for tokens the verify pass has no room for
      // would be wasted.
      const int64_t fits = fit_draft(s, k);
      if (fits > 0) jobs.push_back({&s, fits}), budget -= fits;
      continue;
    }
    s.draft = lookup_draft(s.tokens, s.spec.lookup, (int)k);
    s.draft.resize((size_t)fit_draft(s, (int64_t)s.draft.size()));
    budget -= (int64_t)s.draft.size();
  }
  if (!jobs.empty()) {
    draft_with_model(jobs);
    // Blocks reserved for draft tokens the draft model did not propose go back.
    for (const Planned& j : jobs) trim_blocks(*j.seq, j.seq->n_computed + 1 + (int64_t)j.seq->draft.size());
  }
  for (Planned& p : plan) p.n += (int64_t)p.seq->draft.size();
}

int64_t Scheduler::fit_draft(Seq& s, int64_t k) {
  if (k <= 0 || ensure_blocks(s, s.n_computed + 1 + k)) return std::max<int64_t>(0, k);
  const int64_t room = (int64_t)s.blocks.size() * pool_.block_tokens() - s.n_computed - 1;
  return std::max<int64_t>(0, room);
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
    }
    trim_draft_blocks(s, s.draft_computed);
  }
  stats_.draft_pass_s += timer.seconds();
}

Scheduler::DraftRound Scheduler::reserve_draft_blocks(const std::vector<Planned>& jobs) {
  // Each job's draft K,V must hold its tokens so far (catch-up: the prompt at first, then the
  // tokens of earlier steps the draft model has not run, e.g. a bonus token) and the first
  // k - 1 drafted tokens (the last drafted one is only ever run by the target). Draft blocks
  // only come from free ones: a job that gets too few drafts less or not at all.
  BlockPool& dp = *opts_.draft_model.pool;
  const int64_t B = dp.block_tokens();
  DraftRound r;
  for (Planned j : jobs) {
    Seq& s = *j.seq;
    const int64_t L = (int64_t)s.tokens.size();
    while ((int64_t)s.draft_blocks.size() * B < L + j.n - 1) {
      const int32_t b = dp.allocate();
      if (b < 0) break;
      s.draft_blocks.push_back(b);
    }
    j.n = std::min<int64_t>(j.n, (int64_t)s.draft_blocks.size() * B - L + 1);
    if (j.n <= 0) {
      trim_draft_blocks(s, s.draft_computed);
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
  const size_t V = (size_t)opts_.draft_model.model->config().n_vocab;
  while (true) {
    ForwardBatch batch(opts_.draft_model.pool->block_tokens());
    std::vector<std::pair<size_t, int64_t>> in;  // job, tokens in this pass
    int64_t budget = opts_.max_batch_tokens;
    for (size_t i = 0; i < r.live.size() && budget > 0; i++) {
      Seq& s = *r.live[i].seq;
      const int64_t L = (int64_t)s.tokens.size(), n = std::min(L - s.draft_computed, budget);
      if (n <= 0) continue;
      const std::span<const int32_t> chunk(s.tokens.data() + s.draft_computed, (size_t)n);
      const bool last = s.draft_computed + n == L;
      TANDEM_TRY(batch.add_sequence(chunk, s.draft_computed, s.draft_blocks, last ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None));
      in.push_back({i, n});
      budget -= n;
    }
    if (in.empty()) return Status::Ok();
    stats_.draft_passes++;
    auto logits = opts_.draft_model.model->forward(*opts_.draft_model.pool, batch);
    if (!logits.ok()) return logits.error();
    size_t row = 0;
    for (auto [i, n] : in) {
      Seq& s = *r.live[i].seq;
      s.draft_computed += n;
      if (s.draft_computed == (int64_t)s.tokens.size()) draft_propose(r, i, logits.value().subspan(row++ * V, V));
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
      TANDEM_TRY(batch.add_sequence(std::span<const int32_t>(&s.draft[j - 1], 1), s.draft_computed, s.draft_blocks,
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

Result<std::span<const float>> Scheduler::run(const std::vector<Planned>& plan, std::vector<Planned>& logit_rows) {
  // The pass's batch: each planned sequence's next tokens; logits where a chunk reaches the
  // sequence's last token (a prompt's end, or a decode token), and for every drafted token.
  ForwardBatch batch(pool_.block_tokens());
  for (const Planned& p : plan) {
    Seq& s = *p.seq;
    if (!s.draft.empty()) {  // the decode token, then the draft at the positions after it
      std::vector<int32_t> chunk(1, s.tokens.back());
      chunk.insert(chunk.end(), s.draft.begin(), s.draft.end());
      TANDEM_TRY(batch.add_sequence(chunk, s.n_computed, s.blocks, ForwardBatch::Logits::All));
      logit_rows.push_back({&s, (int64_t)chunk.size()});
      continue;
    }
    const bool last = s.n_computed + p.n == (int64_t)s.tokens.size();
    const std::span<const int32_t> chunk(s.tokens.data() + s.n_computed, (size_t)p.n);
    TANDEM_TRY(batch.add_sequence(chunk, s.n_computed, s.blocks, last ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None));
    if (last) logit_rows.push_back({&s, 1});
  }
  return model_.forward(pool_, batch);
}

void Scheduler::postprocess(const std::vector<Planned>& plan, const std::vector<Planned>& logit_rows,
                            std::span<const float> logits) {
  for (const Planned& p : plan) {
    // A drafted position counts as computed only once the target accepts its token.
    p.seq->n_computed += p.seq->draft.empty() ? p.n : 1;
    if (!opts_.no_kv_cache) publish_full_blocks(*p.seq);
  }
  // Sample for every sequence whose last token ran (verify its draft), and report.
  const size_t V = (size_t)model_.config().n_vocab;
  std::vector<Seq*> done;
  size_t row = 0;
  for (const Planned& lr : logit_rows) {
    Seq& s = *lr.seq;
    const std::span<const float> rows = logits.subspan(row * V, (size_t)lr.n * V);
    row += (size_t)lr.n;
    if (s.n_generated >= s.params.max_tokens) {  // max_tokens == 0, or resumed at the limit
      s.draft.clear();
      done.push_back(&s);
      continue;
    }
    if (!s.draft.empty()) {
      verify_draft(s, rows, done);
      continue;
    }
    const int32_t tok = s.sampler.sample(rows, s.tokens);
    if (opts_.no_kv_cache) s.n_computed = 0;  // naive mode: the next pass recomputes every K,V
    emit(s, tok, rows, done);
  }
  for (Seq* s : done) finish(*s, FinishReason::Length);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }), running_.end());
}

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
    finish(s, FinishReason::Stop);
    return false;
  }
  s.tokens.push_back(tok);
  s.n_generated++;
  stats_.generated_tokens++;
  if (!s.cb(e)) {
    finish(s, FinishReason::Cancelled);
    return false;
  }
  if (s.n_generated >= s.params.max_tokens || (int64_t)s.tokens.size() >= model_.config().n_ctx_train) {
    done.push_back(&s);
    return false;
  }
  return true;
}

void Scheduler::verify_draft(Seq& s, std::span<const float> rows, std::vector<Seq*>& done) {
  // Row j holds the target's logits after draft[0..j) (row 0: after the decode token). Walk the
  // draft while the target accepts it; the first rejection's replacement, or after a draft
  // accepted whole the last row's own sample, ends the step.
  const std::vector<int32_t> draft = std::move(s.draft);
  const std::vector<std::vector<TokenProb>> draft_q = std::move(s.draft_q);
  s.draft.clear();
  s.draft_q.clear();
  const size_t V = (size_t)model_.config().n_vocab;
  int accepted = 0;
  bool alive = true;
  for (size_t j = 0; j <= draft.size() && alive; j++) {
    const std::span<const float> row = rows.subspan(j * V, V);
    if (j == draft.size()) {
      alive = emit(s, s.sampler.sample(row, s.tokens), row, done);
      break;
    }
    const Sampler::Verdict v = draft_q.empty() ? s.sampler.verify(row, s.tokens, draft[j])
                                               : s.sampler.verify(row, s.tokens, draft[j], draft_q[j]);
    if (!v.accepted) {
      alive = emit(s, v.token, row, done);
      break;
    }
    accepted++;
    alive = emit(s, draft[j], row, done);
  }
  stats_.drafted_tokens += (int64_t)draft.size();
  stats_.accepted_tokens += accepted;
  stats_.verify_steps++;
  s.backoff.verified((int)draft.size(), accepted);
  if (!alive) return;  // finished (its blocks are gone) or about to be
  // The accepted drafts' K,V were computed from accepted tokens only: they stay. Positions
  // past them are rolled back: beyond the context length nothing reads them, and the blocks
  // that only they used go back to the pool (the next step takes what it needs, as after a
  // plain decode step).
  s.n_computed += accepted;
  trim_blocks(s, s.n_computed);
  publish_full_blocks(s);
  // The draft model ran the accepted drafts but the last (it only proposed that one) and the
  // rejected ones: it keeps the accepted positions it holds; the next step's catch-up runs
  // what it has not seen (the last accepted draft, the target's own token).
  s.draft_computed = std::min(s.draft_computed, s.n_computed);
  trim_draft_blocks(s, s.draft_computed);
}

void Scheduler::trim_draft_blocks(Seq& s, int64_t upto) {
  if (s.draft_blocks.empty()) return;
  const int64_t B = opts_.draft_model.pool->block_tokens();
  const size_t keep = (size_t)((upto + B - 1) / B);
  while (s.draft_blocks.size() > keep) {
    opts_.draft_model.pool->release(s.draft_blocks.back());
    s.draft_blocks.pop_back();
  }
}

void Scheduler::trim_blocks(Seq& s, int64_t upto) {
  const int64_t B = pool_.block_tokens();
  const size_t keep = (size_t)((upto + B - 1) / B);
  while (s.blocks.size() > keep) {
    pool_.release(s.blocks.back());
    s.blocks.pop_back();
    s.hashes.pop_back();
  }
}

}  // namespace tandem
