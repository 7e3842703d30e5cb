#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

namespace tandem::cpu {

void rmsnorm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  // double: a 4096-wide sum of squares loses digits in float. Eight partial sums in a fixed
  // order: one chain of dependent double adds took ~0.8 us a row at 576 wide (2% of a
  // 16-stream serving step, 1% of decode); eight let the adds overlap.
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) part[k] += (double)x[i + k] * x[i + k];
  for (; i < n; i++) part[0] += (double)x[i] * x[i];
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float scale = 1.0f / std::sqrt((float)(ss / n) + eps);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

void rope_angles(int64_t pos, const double* inv_freq, int rope_dim, float* cos_sin) {
  for (int i = 0; i < rope_dim / 2; i++) {
    const double theta = (double)pos * inv_freq[i];
    cos_sin[2 * i] = (float)std::cos(theta);
    cos_sin[2 * i + 1] = (float)std::sin(theta);
  }
}

void rope(float* x, int n_heads, int head_dim, int rope_dim, const float* cos_sin) {
  // Head by head, so the inner loop walks memory in order (the compiler vectorises it).
  for (int h = 0; h < n_heads; h++) {
    float* v = x + h * head_dim;
    for (int i = 0; i < rope_dim / 2; i++) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c - b * s;
      v[2 * i + 1] = a * s + b * c;
    }
  }
}

void rope_neox(float* x, int n_heads, int head_dim, int rope_dim, const float* cos_sin) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; i++) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    for (int h = 0; h < n_heads; h++) {
      float* v = x + h * head_dim + i;
      const float a = v[0], b = v[half];
      v[0] = a * c - b * s;
      v[half] = a * s + b * c;
    }
  }
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void swiglu_oai_mul(float* gate, const float* up, int64_t n) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  for (int64_t i = 0; i < n; i++) {
    const float g = std::min(gate[i], kLimit), u = std::clamp(up[i], -kLimit, kLimit);
    gate[i] = g / (1.0f + std::exp(-kAlpha * g)) * (u + 1.0f);
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n) {
  const float mx = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void add_scaled_inplace(float* y, const float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += s * x[i];
}

void scale_inplace(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] *= s;
}

void softcap_inplace(float* y, float cap, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = cap * std::tanh(y[i] / cap);
}

}  // namespace tandem::cpu
