#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

namespace tandem {

std::vector<std::vector<int32_t>> perplexity_windows(std::span<const int32_t> text, int64_t ctx, int32_t bos,
                                                     int64_t max_windows) {
  std::vector<std::vector<int32_t>> out;
  const int64_t per = bos >= 0 ? ctx - 1 : ctx;  // text tokens per window
  if (ctx < 2 || per < 1) return out;
  for (int64_t at = 0; at + per <= (int64_t)text.size(); at += per) {
    if (max_windows > 0 && (int64_t)out.size() >= max_windows) break;
    std::vector<int32_t> w;
    w.reserve((size_t)ctx);
    if (bos >= 0) w.push_back(bos);
    w.insert(w.end(), text.begin() + at, text.begin() + at + per);
    out.push_back(std::move(w));
  }
  return out;
}

namespace {

double log_sum_exp(std::span<const float> row) {
  float mx = -INFINITY;
  for (float x : row) mx = std::max(mx, x);
  double sum = 0;
  for (float x : row) sum += std::exp((double)x - mx);
  return mx + std::log(sum);
}

}  // namespace

double log_softmax_at(std::span<const float> row, int32_t id) { return (double)row[(size_t)id] - log_sum_exp(row); }

double kl_divergence(std::span<const float> base, std::span<const float> row) {
  const double lp = log_sum_exp(base), lq = log_sum_exp(row);
  double kl = 0;
  for (size_t i = 0; i < base.size(); i++) {
    const double log_p = (double)base[i] - lp;
    kl += std::exp(log_p) * (log_p - ((double)row[i] - lq));
  }
  return std::max(0.0, kl);  // rounding can leave -1e-17 where the two are equal
}

void NllStats::add(double nll) {
  n_++;
  sum_ += nll;
  sum_sq_ += nll * nll;
}

double NllStats::perplexity() const { return std::exp(mean()); }

double NllStats::perplexity_error() const {
  if (n_ < 2) return 0.0;
  const double m = mean(), var = std::max(0.0, sum_sq_ / (double)n_ - m * m);
  // d exp(m) = exp(m) dm, with dm the standard error of the mean.
  return perplexity() * std::sqrt(var / (double)(n_ - 1));
}

void KlStats::add(double kl, bool same_top) {
  kl_.push_back(kl);
  same_top_ += same_top;
}

double KlStats::mean() const {
  if (kl_.empty()) return 0.0;
  double s = 0;
  for (double k : kl_) s += k;
  return s / (double)kl_.size();
}

double KlStats::quantile(double q) const {
  if (kl_.empty()) return 0.0;
  std::vector<double> v = kl_;
  const size_t k = (size_t)std::clamp<double>(std::ceil(q * (double)v.size()) - 1, 0.0, (double)v.size() - 1);
  std::nth_element(v.begin(), v.begin() + (ptrdiff_t)k, v.end());
  return v[k];
}

}  // namespace tandem
