// How a user judges a model or a quantization on a text, as llama-perplexity does it:
// - perplexity: the text split into windows of ctx tokens (each after a BOS, when the
//   vocabulary has one), every window's logits from one pass, and the negative log-likelihood
//   of each next token scored over the second half of each window (the first half is context,
//   so every scored token sees at least ctx/2 tokens before it); PPL = exp(mean NLL).
// - KL divergence: on the same windows, each scored position's next-token distribution under
//   a configuration (8-bit activations, a q8_0 KV cache, ...) against a base one (the exact
//   configuration): KL(base || config), and how often both pick the same top token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// Windows of ctx tokens over the text: [bos] + ctx - 1 text tokens each when bos >= 0, else
// ctx text tokens; consecutive windows do not overlap; a last partial window is dropped.
// max_windows > 0 keeps only the first that many.
std::vector<std::vector<int32_t>> perplexity_windows(std::span<const int32_t> text, int64_t ctx, int32_t bos,
                                                     int64_t max_windows = 0);
// The first position of a window whose prediction is scored (it predicts the token after it).
inline int64_t first_scored(int64_t ctx) { return ctx / 2; }

// log softmax(row)[id], in double.
double log_softmax_at(std::span<const float> row, int32_t id);
// KL(P || Q) with P = softmax(base), Q = softmax(row), in nats; never negative.
double kl_divergence(std::span<const float> base, std::span<const float> row);

// Running negative log-likelihood: perplexity and its standard error (by the delta method,
// as llama-perplexity reports it).
class NllStats {
 public:
  void add(double nll);
  int64_t count() const { return n_; }
  double mean() const { return n_ ? sum_ / (double)n_ : 0.0; }
  double perplexity() const;
  double perplexity_error() const;

 private:
  int64_t n_ = 0;
  double sum_ = 0, sum_sq_ = 0;
};

// Per-position KL divergences and top-1 agreement: mean, median, p99, max.
class KlStats {
 public:
  void add(double kl, bool same_top);
  int64_t count() const { return (int64_t)kl_.size(); }
  double mean() const;
  double quantile(double q) const;  // q in [0, 1], nearest rank
  double max() const { return quantile(1.0); }
  double same_top_fraction() const { return kl_.empty() ? 0.0 : (double)same_top_ / (double)kl_.size(); }

 private:
  std::vector<double> kl_;
  int64_t same_top_ = 0;
};

}  // namespace tandem
