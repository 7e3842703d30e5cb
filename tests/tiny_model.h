// A tiny GGUF of any family tandem runs (llama by default), with seeded random weights, built in
// memory, so model tests run without any downloaded file. Quantized blocks get random quants
// with small scales. Each family gets its own tensors and keys: qwen2's q/k/v biases, qwen3's
// and gemma3's QK-norms, gemma3's sandwich norms and sliding window, phi3's fused matrices,
// granite's four scales.
#pragma once

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "gguf/gguf_file.h"
#include "gguf_builder.h"

namespace tandem::test {

struct TinyShape {
  int n_vocab = 96, n_embd = 64, n_layer = 2, n_head = 4, n_kv_head = 2, n_ff = 128, n_ctx = 64;
  std::string family = "llama";  // general.architecture
  int head_dim = 0;               // > 0: attention.key_length (else n_embd / n_head)
  int64_t window = 0;             // gemma3: attention.sliding_window (0: no key)
  float granite_attention_scale = 0.2f;  // granite: attention.scale (0: the default)
  bool granite_rope = true;              // granite: rope.scaling.finetuned (false: no RoPE)
  DType weight_type = DType::F32;
  bool tied = false;
  int n_tokens = 0;  // tokens in the tokenizer's vocabulary; 0: n_vocab (a mismatch is a bad file)
  float output_scale = 0.2f;  // output.weight's spread: larger, sharper next-token distributions
  // Spread of attn_output and ffn_down relative to the default: near 0, the residual stream is
  // the current token's embedding, so the model is a bigram model (its next token depends on
  // the current token only).
  float branch_scale = 1.0f;
  int pooling = -1;  // >= 0: <arch>.pooling_type (1 mean, 2 cls, 3 last: an embedding model)
  // The tokenizer's tokens (all normal ones); empty: the byte-ish vocabulary below. A model
  // with another model's tokens (and n_vocab their count) can draft for it.
  std::vector<std::string> tokens;
  // > 0: a mixture of experts (the family's reader must take one, e.g. qwen3moe): every
  // layer's FFN is n_expert experts of width n_ff_expert, n_expert_used per token.
  int n_expert = 0, n_expert_used = 2, n_ff_expert = 32;
};

inline std::vector<uint8_t> random_weights(DType type, int64_t rows, int64_t cols, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::uniform_int_distribution<int> byte(0, 255);
  const auto info = *dtype_info(static_cast<uint32_t>(type));
  std::vector<uint8_t> out(rows * cols / info.block_elems * info.block_bytes);
  auto put_half = [&](size_t at, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(&out[at], &h, 2);
  };
  const size_t nblocks = out.size() / info.block_bytes;
  if (type == DType::F32) {
    for (size_t i = 0; i < out.size() / 4; i++) {
      const float v = nd(rng);
      std::memcpy(&out[i * 4], &v, 4);
    }
    return out;
  }
  if (type == DType::F16 || type == DType::BF16) {
    for (size_t i = 0; i < out.size() / 2; i++) {
      float v = nd(rng);
      uint16_t h;
      if (type == DType::F16) {
        h = fp32_to_fp16(v);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        h = (uint16_t)(bits >> 16);
      }
      std::memcpy(&out[i * 2], &h, 2);
    }
    return out;
  }
  for (auto& b : out) b = (uint8_t)byte(rng);
  for (size_t bi = 0; bi < nblocks; bi++) {
    const size_t at = bi * info.block_bytes;
    switch (type) {
      case DType::Q4_0: put_half(at, scale / 4); break;
      case DType::Q4_1: put_half(at, scale / 4), put_half(at + 2, -scale * 2); break;
      case DType::Q8_0: put_half(at, scale / 64); break;
      case DType::Q4_K: put_half(at, scale / 64), put_half(at + 2, scale / 32); break;
      case DType::Q6_K: put_half(at + 208, scale / 512); break;
      default: break;
    }
  }
  return out;
}

inline std::vector<uint8_t> f32_vector(int64_t n, std::mt19937& rng, float mean, float sd) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<uint8_t> out(n * 4);
  for (int64_t i = 0; i < n; i++) {
    const float v = nd(rng);
    std::memcpy(&out[i * 4], &v, 4);
  }
  return out;
}

// The GGUF bytes of a tiny model with a byte-ish BPE vocabulary (token i is the i-th character).
inline std::vector<uint8_t> tiny_model_bytes(const TinyShape& s, uint32_t seed = 42) {
  std::mt19937 rng(seed);
  GgufBuilder b;
  const std::string& fam = s.family;
  const std::string a = fam + ".";
  b.kv_str("general.architecture", fam);
  b.kv_str("general.name", "tiny-random");
  b.kv_u32(a + "context_length", s.n_ctx);
  b.kv_u32(a + "embedding_length", s.n_embd);
  b.kv_u32(a + "block_count", s.n_layer);
  b.kv_u32(a + "feed_forward_length", s.n_ff);
  b.kv_u32(a + "attention.head_count", s.n_head);
  b.kv_u32(a + "attention.head_count_kv", s.n_kv_head);
  if (s.head_dim > 0) b.kv_u32(a + "attention.key_length", s.head_dim);
  b.kv_f32(a + "rope.freq_base", 10000.0f);
  b.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (fam == "granite") {
    b.kv_f32(a + "embedding_scale", 4.0f);
    b.kv_f32(a + "residual_scale", 0.5f);
    b.kv_f32(a + "attention.scale", s.granite_attention_scale);
    if (!s.granite_rope) b.kv_bool(a + "rope.scaling.finetuned", false);
    b.kv_f32(a + "logit_scale", 3.0f);
  }
  if (fam == "gemma3" && s.window > 0) b.kv_u32(a + "attention.sliding_window", (uint32_t)s.window);
  if (s.pooling >= 0) b.kv_u32(a + "pooling_type", (uint32_t)s.pooling);
  if (s.n_expert > 0) {
    b.kv_u32(a + "expert_count", (uint32_t)s.n_expert);
    b.kv_u32(a + "expert_used_count", (uint32_t)s.n_expert_used);
    b.kv_u32(a + "expert_feed_forward_length", (uint32_t)s.n_ff_expert);
  }
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (const std::string& t : s.tokens) tokens.push_back(t), types.push_back(1);
  for (int i = 0; s.tokens.empty() && i < (s.n_tokens ? s.n_tokens : s.n_vocab); i++) {
    tokens.push_back(i == 0 ? "<|endoftext|>" : std::string(1, (char)('!' + (i - 1) % 90)) + (i > 90 ? "x" : ""));
    types.push_back(i == 0 ? 3 : 1);
  }
  b.kv_str("tokenizer.ggml.model", "gpt2");
  b.kv_str("tokenizer.ggml.pre", "gpt-2");
  b.kv_str_array("tokenizer.ggml.tokens", tokens);
  b.kv_i32_array("tokenizer.ggml.token_type", types);
  b.kv_str_array("tokenizer.ggml.merges", {});
  b.kv_u32("tokenizer.ggml.eos_token_id", 0);
  const int hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head, kvd = hd * s.n_kv_head, qd = hd * s.n_head;
  const DType t = s.weight_type;
  const uint64_t E = s.n_embd, F = s.n_ff, V = s.n_vocab, Q = qd, KV = kvd;
  auto norm = [&](const std::string& name, uint64_t n) { b.tensor(name, DType::F32, {n}, f32_vector(n, rng, 1.0f, 0.1f)); };
  b.tensor("token_embd.weight", t, {E, V}, random_weights(t, V, E, rng, fam == "gemma3" ? 0.15f : 1.0f));
  norm("output_norm.weight", E);
  if (!s.tied) b.tensor("output.weight", t, {E, V}, random_weights(t, V, E, rng, s.output_scale));
  for (int l = 0; l < s.n_layer; l++) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", E);
    if (fam == "phi3") {
      b.tensor(p + "attn_qkv.weight", t, {E, Q + 2 * KV}, random_weights(t, Q + 2 * KV, E, rng, 0.3f));
    } else {
      b.tensor(p + "attn_q.weight", t, {E, Q}, random_weights(t, Q, E, rng, 0.3f));
      b.tensor(p + "attn_k.weight", t, {E, KV}, random_weights(t, KV, E, rng, 0.3f));
      b.tensor(p + "attn_v.weight", t, {E, KV}, random_weights(t, KV, E, rng, 0.3f));
    }
    if (fam == "qwen2") {
      b.tensor(p + "attn_q.bias", DType::F32, {Q}, f32_vector(Q, rng, 0.0f, 0.5f));
      b.tensor(p + "attn_k.bias", DType::F32, {KV}, f32_vector(KV, rng, 0.0f, 0.5f));
      b.tensor(p + "attn_v.bias", DType::F32, {KV}, f32_vector(KV, rng, 0.0f, 0.5f));
    }
    if (fam == "qwen3" || fam == "qwen3moe" || fam == "gemma3") {
      norm(p + "attn_q_norm.weight", (uint64_t)hd);
      norm(p + "attn_k_norm.weight", (uint64_t)hd);
    }
    b.tensor(p + "attn_output.weight", t, {Q, E}, random_weights(t, E, Q, rng, 0.1f * s.branch_scale));
    norm(p + "ffn_norm.weight", E);
    if (s.n_expert > 0) {  // the router (f32, as converters keep it) and the experts, stacked
      const uint64_t X = (uint64_t)s.n_expert, FE = (uint64_t)s.n_ff_expert;
      b.tensor(p + "ffn_gate_inp.weight", DType::F32, {E, X}, random_weights(DType::F32, X, E, rng, 1.0f));
      b.tensor(p + "ffn_gate_exps.weight", t, {E, FE, X}, random_weights(t, X * FE, E, rng, 0.2f));
      b.tensor(p + "ffn_up_exps.weight", t, {E, FE, X}, random_weights(t, X * FE, E, rng, 0.2f));
      b.tensor(p + "ffn_down_exps.weight", t, {FE, E, X}, random_weights(t, X * E, FE, rng, 0.2f * s.branch_scale));
    } else if (fam == "phi3") {
      b.tensor(p + "ffn_up.weight", t, {E, 2 * F}, random_weights(t, 2 * F, E, rng, 0.2f));
    } else {
      b.tensor(p + "ffn_gate.weight", t, {E, F}, random_weights(t, F, E, rng, 0.2f));
      b.tensor(p + "ffn_up.weight", t, {E, F}, random_weights(t, F, E, rng, 0.2f));
    }
    if (s.n_expert == 0) b.tensor(p + "ffn_down.weight", t, {F, E}, random_weights(t, E, F, rng, 0.1f * s.branch_scale));
    if (fam == "gemma3") {
      norm(p + "post_attention_norm.weight", E);
      norm(p + "post_ffw_norm.weight", E);
    }
  }
  return b.build();
}

inline std::unique_ptr<GgufFile> tiny_model_file(const TinyShape& s, uint32_t seed = 42) {
  const auto bytes = tiny_model_bytes(s, seed);
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  return f.ok() ? std::move(f.value()) : nullptr;
}

}  // namespace tandem::test
