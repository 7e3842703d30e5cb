#include "model/model_config.h"

#include "model/arch_readers.h"

#include <array>
#include <charconv>
#include <cmath>
#include <set>
#include <string_view>

namespace tandem {

namespace {

Result<int> required_int(const GgufFile& f, const std::string& key) {
  auto v = f.get_uint(key);
  if (!v.ok()) return v.error();
  if (!v->has_value()) return make_error("missing metadata key '{}'", key);
  if (**v == 0 || **v > (1u << 30)) return make_error("metadata '{}' = {} is out of range", key, **v);
  return (int)**v;
}

Result<int> optional_int(const GgufFile& f, const std::string& key, int fallback) {
  auto v = f.get_uint(key);
  if (!v.ok()) return v.error();
  if (!v->has_value()) return fallback;
  if (**v == 0 || **v > (1u << 30)) return make_error("metadata '{}' = {} is out of range", key, **v);
  return (int)**v;
}

// The layer index of a per-layer tensor ("blk.12.attn_q.weight" -> 12), or -1.
int64_t block_index(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  name.remove_prefix(4);
  int64_t i = -1;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), i);
  if (ec != std::errc() || end == name.data() + name.size() || *end != '.') return -1;
  return i;
}

// block_count must match the blk.N tensors: every layer has some, and none lies past the last.
// (Missing single tensors inside a layer are named by the weight loader.)
Status check_block_count(const GgufFile& f, const std::string& key, int n_layer) {
  std::set<int64_t> seen;
  for (const GgufTensor& t : f.tensors()) {
    const int64_t i = block_index(t.name);
    if (i >= n_layer)
      return make_error("metadata '{}' = {}, but the file has a tensor for block {} ({})", key, n_layer, i, t.name);
    if (i >= 0) seen.insert(i);
  }
  if ((int64_t)seen.size() == n_layer) return Status::Ok();
  int64_t i = 0;  // the first block without tensors
  for (int64_t s : seen)
    if (s == i) i++;
  return make_error("metadata '{}' = {}, but the file has no tensors for block {} (blk.{}.*; {} of the blocks have tensors)",
                    key, n_layer, i, i, seen.size());
}

// A float hyper-parameter that must be finite and inside (low, high].
Status check_range(const std::string& key, double v, double low, double high, const char* why) {
  if (!std::isfinite(v) || !(v > low) || v > high)
    return make_error("metadata '{}' = {:g} is out of range: {} (must be > {:g} and <= {:g})", key, v, why, low, high);
  return Status::Ok();
}

// YaRN's factor, the context it stretches and its attention factor.
Status read_yarn(const GgufFile& f, const std::string& p, ModelConfig& c) {
  if (c.rope_dim != c.head_dim)  // its gain is carried by the score scale (arch_readers.cpp)
    return make_error("YaRN rope scaling on {} of {} dims of a head is not supported", c.rope_dim, c.head_dim);
  auto factor = f.get_float(p + "rope.scaling.factor");
  if (!factor.ok()) return factor.error();
  c.rope_yarn_factor = factor->value_or(1.0);
  TANDEM_TRY(check_range(p + "rope.scaling.factor", c.rope_yarn_factor, 0.0, 1e6, "YaRN's context factor"));
  auto orig = optional_int(f, p + "rope.scaling.original_context_length", c.n_ctx_train);
  if (!orig.ok()) return orig.error();
  c.rope_yarn_orig_ctx = *orig;
  auto attn = f.get_float(p + "rope.scaling.attn_factor");
  if (!attn.ok()) return attn.error();
  c.rope_yarn_attn_factor = attn->value_or(1.0);
  return check_range(p + "rope.scaling.attn_factor", c.rope_yarn_attn_factor, 0.0, 1e3, "YaRN's attention factor");
}

Status set_int(int& field, Result<int> r) {
  if (!r.ok()) return r.error();
  field = *r;
  return Status::Ok();
}

// general.architecture (one tandem runs) and general.name.
Status read_architecture(const GgufFile& f, ModelConfig& c) {
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.error();
  if (!arch->has_value()) return make_error("missing metadata key 'general.architecture'");
  c.arch = std::string(**arch);
  if (!is_supported_architecture(c.arch))
    return make_error("architecture '{}' is not supported (tandem runs: {})", c.arch, supported_architectures());
  auto name = f.get_string("general.name");
  if (name.ok() && name->has_value()) c.name = std::string(**name);
  return Status::Ok();
}

// The sizes: embedding, layers (as many as the blk.N tensors), heads and their dims, the
// feed-forward, and the training context. p: the architecture's key prefix.
Status read_shape(const GgufFile& f, const std::string& p, ModelConfig& c) {
  TANDEM_TRY(set_int(c.n_embd, required_int(f, p + "embedding_length")));
  TANDEM_TRY(set_int(c.n_layer, required_int(f, p + "block_count")));
  TANDEM_TRY(set_int(c.n_head, required_int(f, p + "attention.head_count")));
  TANDEM_TRY(set_int(c.n_ff, required_int(f, p + "feed_forward_length")));
  TANDEM_TRY(set_int(c.n_ctx_train, optional_int(f, p + "context_length", 2048)));
  TANDEM_TRY(set_int(c.n_kv_head, optional_int(f, p + "attention.head_count_kv", c.n_head)));
  TANDEM_TRY(set_int(c.head_dim, optional_int(f, p + "attention.key_length", 0)));
  if (c.head_dim == 0) {  // no key_length: heads split the embedding
    if (c.n_embd % c.n_head != 0)
      return make_error("embedding_length {} is not divisible by head_count {}", c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  // key_length is independent of embedding_length (Gemma 3: 256 x 4 heads on 640): bound the
  // products the pass allocates by.
  if (c.head_dim > 65536 || (int64_t)c.n_head * c.head_dim > (1 << 28))
    return make_error("attention.key_length {} x head_count {} is out of range", c.head_dim, c.n_head);
  TANDEM_TRY(set_int(c.rope_dim, optional_int(f, p + "rope.dimension_count", c.head_dim)));
  if (c.n_head % c.n_kv_head != 0)
    return make_error("head_count {} is not a multiple of head_count_kv {}", c.n_head, c.n_kv_head);
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    return make_error("rope.dimension_count {} must be even and at most the head dim {}", c.rope_dim, c.head_dim);

  auto value_length = f.get_uint(p + "attention.value_length");
  if (!value_length.ok()) return value_length.error();
  if (value_length->has_value() && **value_length != (uint64_t)c.head_dim)
    return make_error("metadata '{}attention.value_length' = {} differs from the key length {} (tandem needs them equal)", p,
                      **value_length, c.head_dim);
  return check_block_count(f, p + "block_count", c.n_layer);
}

// RoPE's base and linear scaling, and RMSNorm's epsilon, each in its range.
Status read_rope_and_norm(const GgufFile& f, const std::string& p, ModelConfig& c) {
  auto base = f.get_float(p + "rope.freq_base");
  if (!base.ok()) return base.error();
  if (base->has_value()) c.rope_base = **base;
  TANDEM_TRY(check_range(p + "rope.freq_base", c.rope_base, 1.0, 1e12, "RoPE's wavelength base"));

  auto scaling = f.get_string(p + "rope.scaling.type");
  if (!scaling.ok()) return scaling.error();
  if (scaling->has_value() && **scaling == "yarn") {
    TANDEM_TRY(read_yarn(f, p, c));
  } else if (scaling->has_value() && **scaling != "none") {
    if (**scaling != "linear")
      return make_error("rope scaling '{}' is not supported (tandem supports none, linear and yarn)", **scaling);
    auto factor = f.get_float(p + "rope.scaling.factor");
    if (!factor.ok()) return factor.error();
    if (factor->has_value()) c.rope_linear_scale = **factor;
    TANDEM_TRY(check_range(p + "rope.scaling.factor", c.rope_linear_scale, 0.0, 1e6, "positions are divided by it"));
  }

  auto eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.error();
  if (eps->has_value()) c.rms_eps = (float)**eps;
  // RMSNorm divides by sqrt(mean(x^2) + eps): eps only guards against zero (real models use
  // 1e-6 to 1e-5); one near the activations' scale would flatten them.
  return check_range(p + "attention.layer_norm_rms_epsilon", c.rms_eps, 0.0, 1e-2, "RMSNorm's epsilon");
}

// The vocabulary's size (token_embd's rows, which the tokenizer and vocab_size must match),
// and whether the output projection is token_embd's.
Status read_vocabulary(const GgufFile& f, const std::string& p, ModelConfig& c) {
  const GgufTensor* embd = f.find_tensor("token_embd.weight");
  if (!embd) return make_error("missing tensor token_embd.weight");
  if (embd->dims.size() != 2) return make_error("token_embd.weight has {} dims, expected 2", embd->dims.size());
  c.n_vocab = (int)embd->dims[1];
  // The tokenizer's vocabulary and the embedding's rows must be the same tokens (llama.cpp
  // refuses a mismatch too): ids past the embedding would read outside it, and rows past
  // the vocabulary are logits no token spells.
  if (const GgufArray* tokens = f.get_array("tokenizer.ggml.tokens"); tokens && tokens->count != embd->dims[1])
    return make_error("tokenizer.ggml.tokens has {} tokens, but token_embd.weight has {} rows", tokens->count, embd->dims[1]);
  auto vocab_size = f.get_uint(p + "vocab_size");
  if (!vocab_size.ok()) return vocab_size.error();
  if (vocab_size->has_value() && **vocab_size != embd->dims[1])
    return make_error("metadata '{}vocab_size' = {}, but token_embd.weight has {} rows", p, **vocab_size, embd->dims[1]);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  auto pooling = f.get_uint(p + "pooling_type");
  if (!pooling.ok()) return pooling.error();
  if (pooling->has_value()) {
    if (**pooling > 3) return make_error("metadata '{}pooling_type' = {}: tandem knows 0 (none), 1 (mean), 2 (cls) and 3 (last)", p, **pooling);
    c.pooling = (ModelConfig::Pooling)**pooling;
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  TANDEM_TRY(read_architecture(f, c));
  const std::string p = c.arch + ".";
  TANDEM_TRY(read_shape(f, p, c));
  TANDEM_TRY(read_rope_and_norm(f, p, c));
  TANDEM_TRY(read_vocabulary(f, p, c));
  auto spec = read_arch_spec(f, c);
  if (!spec.ok()) return spec.error();
  c.spec = std::move(spec.value());
  return c;
}

}  // namespace tandem
