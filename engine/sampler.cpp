#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <unordered_set>

namespace tandem {

namespace {

// Inverse-CDF draw: the id of the first item whose running sum of weight(item) passes u (a
// uniform draw scaled to the weights' total); items weighing nothing are skipped, and when
// rounding leaves u past the whole sum the last weighted item wins. -1 if none weighs anything.
template <class Items, class Weight>
int32_t draw(const Items& items, double u, Weight weight) {
  double cum = 0.0;
  int32_t last = -1;
  for (const auto& c : items) {
    const double w = weight(c);
    if (!(w > 0.0)) continue;
    cum += w;
    last = c.id;
    if (u < cum) break;
  }
  return last;
}

}  // namespace

int32_t Sampler::argmax(std::span<const float> logits) {
  // First maximum wins, so ties resolve to the lowest id, as in llama.cpp.
  return (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void Sampler::softmax() {
  float mx = -INFINITY;
  for (const auto& c : cand_) mx = std::max(mx, c.logit);
  double sum = 0.0;
  for (auto& c : cand_) sum += (c.p = std::exp(c.logit - mx));
  for (auto& c : cand_) c.p = (float)(c.p / sum);
}

void Sampler::apply_repeat_penalty(std::span<const int32_t> history) {
  const size_t n = std::min<size_t>(history.size(), std::max(0, p_.repeat_last_n));
  std::unordered_set<int32_t> seen(history.end() - n, history.end());
  for (auto& c : cand_)
    if (seen.count(c.id)) c.logit = c.logit > 0 ? c.logit / p_.repeat_penalty : c.logit * p_.repeat_penalty;
}

void Sampler::build_distribution(std::span<const float> logits, std::span<const int32_t> history,
                                 std::span<const uint64_t> allowed) {
  cand_.clear();
  if (!allowed.empty()) {  // only the allowed tokens become candidates: one pass over the mask's words
    for (size_t w = 0; w < allowed.size() && w * 64 < logits.size(); w++)
      for (uint64_t bits = allowed[w]; bits; bits &= bits - 1) {
        const size_t i = w * 64 + (size_t)std::countr_zero(bits);
        if (i < logits.size()) cand_.push_back({(int32_t)i, logits[i], 0.0f});
      }
  }
  if (cand_.empty()) {
    cand_.resize(logits.size());
    for (size_t i = 0; i < logits.size(); i++) cand_[i] = {(int32_t)i, logits[i], 0.0f};
  }
  if (p_.repeat_penalty != 1.0f) apply_repeat_penalty(history);
  if (p_.temperature <= 0.0f) {
    const Candidate best = *std::max_element(cand_.begin(), cand_.end(),
                                             [](const Candidate& a, const Candidate& b) { return a.logit < b.logit; });
    cand_.assign(1, {best.id, best.logit, 1.0f});
    return;
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if ((p_.top_k <= 0 || (size_t)p_.top_k >= cand_.size()) && p_.top_p >= 1.0f && p_.min_p > 0.0f) {
    // No truncation by rank, only min-p: it keeps the tokens whose probability is within a
    // factor min_p of the most likely, i.e. whose logit is within log(min_p) of the largest,
    // found in one pass; only they are sorted (not the whole 49k-262k vocabulary, a few ms per
    // token), and the draw walks them most likely first, as before.
    float mx = -INFINITY;
    for (const auto& c : cand_) mx = std::max(mx, c.logit);
    const float cut = mx + std::log(p_.min_p);
    std::erase_if(cand_, [cut](const Candidate& c) { return c.logit < cut; });
    std::sort(cand_.begin(), cand_.end(), by_logit);
    for (auto& c : cand_) c.logit /= p_.temperature;
    softmax();
    return;
  }
  if (p_.top_k > 0 && (size_t)p_.top_k < cand_.size()) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    cand_.resize(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  softmax();
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); i++) {
      cum += cand_[i].p;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  if (p_.min_p > 0.0f) {
    const float floor = cand_[0].p * p_.min_p;  // sorted: cand_[0] is the most likely
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].p >= floor) keep++;
    cand_.resize(keep);
  }
  for (auto& c : cand_) c.logit /= p_.temperature;
  softmax();
}

double Sampler::uniform() { return (double)(rng_() >> 11) * (1.0 / 9007199254740992.0); }

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, std::span<const uint64_t> allowed) {
  if (allowed.empty() && plain_greedy()) return argmax(logits);
  build_distribution(logits, history, allowed);
  if (p_.temperature <= 0.0f) return cand_[0].id;  // greedy draws nothing
  const int32_t t = draw(cand_, uniform(), [](const Candidate& c) { return (double)c.p; });
  return t >= 0 ? t : cand_[0].id;
}

Sampler::Verdict Sampler::verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                                 std::span<const uint64_t> allowed) {
  if (allowed.empty() && plain_greedy()) {
    const int32_t best = argmax(logits);
    return {best, best == draft};
  }
  build_distribution(logits, history, allowed);
  if (p_.temperature <= 0.0f) return {cand_[0].id, cand_[0].id == draft};
  double p_draft = 0.0, rest = 0.0;
  for (const auto& c : cand_) (c.id == draft ? p_draft : rest) += c.p;
  if (uniform() < p_draft || rest <= 0.0) return {draft, true};
  // Rejected: draw from the distribution without the draft, renormalized by its mass `rest`.
  return {draw(cand_, uniform() * rest, [&](const Candidate& c) { return c.id == draft ? 0.0 : (double)c.p; }), false};
}

int32_t Sampler::propose(std::span<const float> logits, std::span<const int32_t> history, std::vector<TokenProb>& q) {
  q.clear();
  if (plain_greedy()) {
    q.push_back({argmax(logits), 1.0f});
    return q[0].id;
  }
  build_distribution(logits, history, {});
  for (const auto& c : cand_)
    if (c.p > 0) q.push_back({c.id, c.p});
  if (p_.temperature <= 0.0f) return cand_[0].id;
  const int32_t t = draw(q, uniform(), [](const TokenProb& c) { return (double)c.p; });
  return t >= 0 ? t : cand_[0].id;
}

Sampler::Verdict Sampler::verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                                 std::span<const TokenProb> q, std::span<const uint64_t> allowed) {
  if (allowed.empty() && plain_greedy()) return verify(logits, history, draft);
  build_distribution(logits, history, allowed);
  if (p_.temperature <= 0.0f) return {cand_[0].id, cand_[0].id == draft};
  if (q_dense_.size() < logits.size()) q_dense_.assign(logits.size(), 0.0f);
  for (const TokenProb& t : q)
    if (t.id >= 0 && (size_t)t.id < q_dense_.size()) q_dense_[(size_t)t.id] += t.p;
  double p_draft = 0.0;
  for (const auto& c : cand_)
    if (c.id == draft) p_draft = c.p;
  const double q_draft = draft >= 0 && (size_t)draft < q_dense_.size() ? q_dense_[(size_t)draft] : 0.0;
  Verdict v{draft, true};
  // q_draft == 0 cannot happen for a token drawn from q; such a draft is accepted with p alone.
  const double ratio = q_draft > 0 ? p_draft / q_draft : (p_draft > 0 ? 1.0 : 0.0);
  if (!(ratio >= 1.0 || uniform() < ratio)) {
    // Rejected: draw from the residual max(0, p - q), where p exceeds what q proposed.
    double mass = 0.0;
    for (const auto& c : cand_) mass += std::max(0.0, (double)c.p - q_dense_[(size_t)c.id]);
    v.accepted = false;
    // A residual lost to rounding (p and q equal but for float error) falls back to p.
    v.token = draw(cand_, uniform(), [&](const Candidate& c) {
      return mass > 1e-12 ? std::max(0.0, (double)c.p - q_dense_[(size_t)c.id]) / mass : (double)c.p;
    });
    if (v.token < 0) v.token = cand_[0].id;
  }
  for (const TokenProb& t : q)
    if (t.id >= 0 && (size_t)t.id < q_dense_.size()) q_dense_[(size_t)t.id] = 0.0f;
  return v;
}

}  // namespace tandem
