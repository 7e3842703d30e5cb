#include "model/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem {

namespace {

// The pair index at which a rotation of wavelength-count `rotations` over the original
// context falls (YaRN's "correction dimension").
double yarn_corr_dim(int rope_dim, int orig_ctx, double base, double rotations) {
  return rope_dim * std::log(orig_ctx / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

}  // namespace

std::vector<double> rope_inv_freq(const RopeSet& set, int rope_dim, std::span<const float> freq_factors) {
  std::vector<double> inv((size_t)(rope_dim / 2));
  // YaRN: pairs below `lo` rotate many times over the original context and keep their
  // frequency; pairs above `hi` are interpolated by the factor; a linear ramp in between.
  const bool yarn = set.yarn_factor > 0.0;
  double lo = 0, hi = 0;
  if (yarn) {
    lo = std::max(0.0, std::floor(yarn_corr_dim(rope_dim, set.yarn_orig_ctx, set.base, set.yarn_beta_fast)));
    hi = std::min(rope_dim - 1.0, std::ceil(yarn_corr_dim(rope_dim, set.yarn_orig_ctx, set.base, set.yarn_beta_slow)));
  }
  for (int i = 0; i < rope_dim / 2; i++) {
    double f = std::pow(set.base, -2.0 * i / rope_dim) / set.linear_scale;
    if (set.freq_factors && !freq_factors.empty()) f /= freq_factors[(size_t)i];
    if (yarn) {
      const double ramp = 1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
      f *= ramp + (1.0 - ramp) / set.yarn_factor;
    }
    inv[(size_t)i] = f;
  }
  return inv;
}

double yarn_gain(double factor, double attn_factor) { return attn_factor * (1.0 + 0.1 * std::log(factor)); }

}  // namespace tandem
