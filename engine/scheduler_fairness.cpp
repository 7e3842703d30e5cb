// Fairness between tenants (RequestParams::tenant: one per API key on a server with keys).
// Without it one tenant's flood of long prompts sat ahead of everyone else: admission was
// first come first served and prefill chunks went to the oldest sequences, so another
// tenant's first token waited for every earlier prompt (8.3 s instead of 15 ms in issue 45's
// probe). Here admission takes the tenant with the fewest running sequences first, the
// prefill budget of a step is shared between the tenants that have prompts to prefill, and
// preemption (for blocks or for a slot) takes from the tenant that holds the most. With one
// tenant (a server without keys, `run`, `chat`) every choice is the old one.
#include <algorithm>
#include <map>

#include "engine/scheduler_seq.h"

namespace tandem {

namespace {

std::map<std::string_view, int> running_per_tenant(const std::vector<std::unique_ptr<Scheduler::Seq>>& running) {
  std::map<std::string_view, int> n;
  for (const auto& s : running) n[s->params.tenant]++;
  return n;
}

}  // namespace

size_t Scheduler::next_admission() const {
  // The first waiting sequence of the tenant with the fewest running (the queue's order among
  // equals: preempted sequences, at the front, come back first).
  const auto running = running_per_tenant(running_);
  size_t best = 0;
  int best_running = INT32_MAX;
  for (size_t i = 0; i < waiting_.size(); i++) {
    const auto it = running.find(waiting_[i]->params.tenant);
    const int r = it == running.end() ? 0 : it->second;
    if (r < best_running) best = i, best_running = r;
    if (r == 0) break;
  }
  return best;
}

bool Scheduler::preempt_for_waiting_tenant() {
  // Every slot is taken: a tenant with nothing running gets one from the tenant that holds the
  // most (its newest sequence that made progress), as long as that one holds more than one.
  if (waiting_.empty() || (int)running_.size() < opts_.max_running) return false;
  const auto running = running_per_tenant(running_);
  const bool starved = std::any_of(waiting_.begin(), waiting_.end(),
                                   [&](const auto& s) { return running.find(s->params.tenant) == running.end(); });
  if (!starved) return false;
  Seq* victim = preemption_victim();
  if (!victim || running.at(victim->params.tenant) < 2) return false;
  requeue(*victim, /*at_front=*/false);  // behind the starved tenant's request
  return true;
}

Scheduler::Seq* Scheduler::preemption_victim() {
  // The newest sequence that made progress since it was last preempted, of the tenant that
  // holds the most running sequences (the newest such, with one tenant).
  const auto running = running_per_tenant(running_);
  Seq* best = nullptr;
  int most = 0;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Seq& s = **it;
    if (s.n_generated <= s.generated_at_preemption) continue;
    const int r = running.at(s.params.tenant);
    if (r > most) best = &s, most = r;
  }
  return best;
}

bool Scheduler::preempt_for_blocks_of(const Seq& s) {
  // `s` cannot be admitted for want of blocks. If its tenant has nothing running while
  // another tenant does, the largest tenant gives up its newest sequence (it comes back later
  // from its tokens so far); else `s` waits for blocks as everyone does.
  const auto running = running_per_tenant(running_);
  if (running.count(s.params.tenant) || running.empty()) return false;
  Seq* victim = preemption_victim();
  if (!victim) return false;
  requeue(*victim, /*at_front=*/false);
  return true;
}

bool Scheduler::plan_first_tokens(std::vector<Planned>& plan, int64_t budget) {
  // Tenants with a prompt to prefill and nothing decoding wait for their first token. When
  // all their prompts fit this step's budget and others are decoding, the step is theirs
  // alone: their first token then waits for one short pass, not for a pass of everyone's
  // batch (a 32-stream batch's step is ~25x a short prompt's on a CPU).
  if (running_.empty()) return false;
  std::map<std::string_view, bool> decoding;  // tenant -> has a decoding sequence
  for (const auto& sp : running_) {
    bool& d = decoding[sp->params.tenant];
    d = d || (int64_t)sp->tokens.size() - sp->n_computed == 1;
  }
  std::vector<Seq*> first;
  int64_t tokens = 0;
  bool others_decode = false;
  for (const auto& sp : running_) {
    const bool starved = !decoding[sp->params.tenant];
    if (!starved) others_decode = true;
    if (starved && (int64_t)sp->tokens.size() - sp->n_computed > 1) {
      first.push_back(sp.get());
      tokens += (int64_t)sp->tokens.size() - sp->n_computed;
    }
  }
  if (first.empty() || !others_decode || tokens > budget) return false;
  for (Seq* s : first) plan.push_back({s, (int64_t)s->tokens.size() - s->n_computed});
  return true;
}

void Scheduler::plan_prefill(std::vector<Planned>& plan, int64_t& budget) {
  // Sequences with prompt left, by tenant (oldest first within one). Each tenant gets an equal
  // share of the budget in turn; what a tenant cannot use goes to the others, so one tenant
  // alone takes it all, as before.
  std::vector<std::pair<std::string_view, std::vector<Seq*>>> tenants;
  for (auto& sp : running_) {
    Seq& s = *sp;
    if ((int64_t)s.tokens.size() - s.n_computed <= 1) continue;  // decoding (planned already)
    auto it = std::find_if(tenants.begin(), tenants.end(), [&](const auto& t) { return t.first == s.params.tenant; });
    if (it == tenants.end()) it = tenants.insert(tenants.end(), {s.params.tenant, {}});
    it->second.push_back(&s);
  }
  std::map<Seq*, size_t> at;  // a sequence's entry in `plan`
  while (budget > 0) {
    size_t hungry = 0;
    for (const auto& t : tenants) hungry += t.second.empty() ? 0 : 1;
    if (hungry == 0) break;
    const int64_t share = std::max<int64_t>(1, budget / (int64_t)hungry);
    for (auto& [name, seqs] : tenants) {
      int64_t left = std::min(share, budget);
      while (left > 0 && !seqs.empty()) {
        Seq& s = *seqs.front();
        auto [it, fresh] = at.emplace(&s, plan.size());
        if (fresh) plan.push_back({&s, 0});
        Planned& p = plan[it->second];
        const int64_t n = std::min(left, (int64_t)s.tokens.size() - s.n_computed - p.n);
        p.n += n;
        left -= n;
        budget -= n;
        if (s.n_computed + p.n == (int64_t)s.tokens.size()) seqs.erase(seqs.begin());
      }
      if (budget <= 0) break;
    }
  }
}

}  // namespace tandem
