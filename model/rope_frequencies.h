// RoPE's frequencies for one RopeSet: base^(-2i / rope_dim), divided by linear scaling and the
// file's rope_freqs factors, or stretched by YaRN (interpolating the low frequencies by the
// factor, keeping the high ones, with a linear ramp between), as llama.cpp computes them.
#pragma once

#include <span>
#include <vector>

#include "model/arch_spec.h"

namespace tandem {

// inv_freq[i] for the rope_dim / 2 pairs of a head (freq_factors: rope_freqs.weight, or empty).
std::vector<double> rope_inv_freq(const RopeSet& set, int rope_dim, std::span<const float> freq_factors);

// YaRN multiplies both the cos and the sin of every rotation by this gain, (1 + 0.1 ln factor)
// times the file's attn_factor: a query-key product of fully rotated heads grows by its square.
double yarn_gain(double factor, double attn_factor);

}  // namespace tandem
