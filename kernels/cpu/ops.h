// Element-wise and per-row operations of the transformer block.
#pragma once

#include <cstdint>

namespace tandem::cpu {

// out[n] = x / rms(x) * weight.
void rmsnorm(const float* x, const float* weight, float* out, int64_t n, float eps);

// Rotates pairs (x[2i], x[2i+1]) of the first rope_dim dims of each head by pos * inv_freq[i]
// (GGUF Llama weights are stored for this adjacent-pair layout). inv_freq: [rope_dim / 2].
void rope(float* x, int n_heads, int head_dim, int rope_dim, int64_t pos, const double* inv_freq);

// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float* gate, const float* up, int64_t n);

// In-place softmax over n values.
void softmax(float* x, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace tandem::cpu
