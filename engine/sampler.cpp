#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace tandem {

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

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); i++) cand_[i] = {(int32_t)i, logits[i], 0.0f};
  if (p_.repeat_penalty != 1.0f) apply_repeat_penalty(history);
  if (p_.temperature <= 0.0f) {
    auto best = std::max_element(cand_.begin(), cand_.end(),
                                 [](const Candidate& a, const Candidate& b) { return a.logit < b.logit; });
    return best->id;
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
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
  // Inverse-CDF draw with a uniform built from the raw 64-bit output, so a seed gives the same
  // tokens whatever standard library is in use.
  const double u = (double)(rng_() >> 11) * (1.0 / 9007199254740992.0);
  double cum = 0.0;
  for (const auto& c : cand_) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return cand_.back().id;
}

}  // namespace tandem
