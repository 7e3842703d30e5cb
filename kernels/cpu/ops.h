// Element-wise and per-row operations of the transformer block.
#pragma once

#include <cstdint>


namespace tandem::cpu {

// out[n] = x / rms(x) * weight.
void rmsnorm(const float* x, const float* weight, float* out, int64_t n, float eps);

// cos_sin[2i], cos_sin[2i + 1] = cos, sin of pos * inv_freq[i] for i < rope_dim / 2: one
// position's RoPE rotation, computed once and shared by every layer and head. The angle is in
// double: pos * freq reaches thousands of radians at long contexts.
void rope_angles(int64_t pos, const double* inv_freq, int rope_dim, float* cos_sin);

// Rotates pairs (x[2i], x[2i+1]) of the first rope_dim dims of each head by the angles of
// rope_angles (GGUF Llama weights are stored for this adjacent-pair layout).
void rope(float* x, int n_heads, int head_dim, int rope_dim, const float* cos_sin);

// Rotates pairs (x[i], x[i + rope_dim/2]) of each head (the NeoX layout: Qwen, Gemma, Phi)
// by the same angles; cos_sin as for rope().
void rope_neox(float* x, int n_heads, int head_dim, int rope_dim, const float* cos_sin);

// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float* gate, const float* up, int64_t n);
// gate[i] = gelu(gate[i]) * up[i], GELU in its tanh approximation
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (GeGLU, Gemma's "gelu_pytorch_tanh").
void gelu_tanh_mul(float* gate, const float* up, int64_t n);
// gpt-oss's clamped SwiGLU (backend.h's GateActivation::SwigluOai), in place on gate.
void swiglu_oai_mul(float* gate, const float* up, int64_t n);
constexpr float kSqrt2OverPi = 0.7978845608028654f;
using SiluMulFn = void (*)(float* gate, const float* up, int64_t n);
// The AVX2 and AVX-512 levels (ops_avx2.cpp, ops_avx512.cpp) evaluate exp with a polynomial
// (relative error ~1e-7, as llama.cpp's vector SiLU does), GELU as g * sigmoid(2u) with it.

// In-place softmax over n values.
void softmax(float* x, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);
// y[i] += s * x[i].
void add_scaled_inplace(float* y, const float* x, float s, int64_t n);
// y[i] *= s.
void scale_inplace(float* y, float s, int64_t n);
// y[i] = cap * tanh(y[i] / cap): a soft limit on the logits' magnitude.
void softcap_inplace(float* y, float cap, int64_t n);

}  // namespace tandem::cpu
