#include "model/llama_config.h"

#include <array>
#include <string_view>

namespace tandem {

namespace {

// Architectures whose GGUF tensors and keys follow the Llama layout.
constexpr std::array<std::string_view, 3> kLlamaLikeArchs = {"llama", "mistral", "granite"};

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

}  // namespace

Result<LlamaConfig> LlamaConfig::from_gguf(const GgufFile& f) {
  LlamaConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.error();
  if (!arch->has_value()) return make_error("missing metadata key 'general.architecture'");
  c.arch = std::string(**arch);
  bool known = false;
  for (auto a : kLlamaLikeArchs) known |= (a == c.arch);
  if (!known) return make_error("architecture '{}' is not supported (tandem runs: llama, mistral, granite)", c.arch);
  auto name = f.get_string("general.name");
  if (name.ok() && name->has_value()) c.name = std::string(**name);

  const std::string p = c.arch + ".";
  auto set = [&](int& field, Result<int> r) -> Status {
    if (!r.ok()) return r.error();
    field = *r;
    return Status::Ok();
  };
  TANDEM_TRY(set(c.n_embd, required_int(f, p + "embedding_length")));
  TANDEM_TRY(set(c.n_layer, required_int(f, p + "block_count")));
  TANDEM_TRY(set(c.n_head, required_int(f, p + "attention.head_count")));
  TANDEM_TRY(set(c.n_ff, required_int(f, p + "feed_forward_length")));
  TANDEM_TRY(set(c.n_ctx_train, optional_int(f, p + "context_length", 2048)));
  TANDEM_TRY(set(c.n_kv_head, optional_int(f, p + "attention.head_count_kv", c.n_head)));
  if (c.n_embd % c.n_head != 0)
    return make_error("embedding_length {} is not divisible by head_count {}", c.n_embd, c.n_head);
  TANDEM_TRY(set(c.head_dim, optional_int(f, p + "attention.key_length", c.n_embd / c.n_head)));
  TANDEM_TRY(set(c.rope_dim, optional_int(f, p + "rope.dimension_count", c.head_dim)));
  if (c.n_head % c.n_kv_head != 0)
    return make_error("head_count {} is not a multiple of head_count_kv {}", c.n_head, c.n_kv_head);
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    return make_error("rope.dimension_count {} must be even and at most the head dim {}", c.rope_dim, c.head_dim);

  auto base = f.get_float(p + "rope.freq_base");
  if (!base.ok()) return base.error();
  if (base->has_value()) c.rope_base = **base;
  if (!(c.rope_base > 1.0)) return make_error("rope.freq_base {} must be > 1", c.rope_base);

  auto scaling = f.get_string(p + "rope.scaling.type");
  if (!scaling.ok()) return scaling.error();
  if (scaling->has_value() && **scaling != "none") {
    if (**scaling != "linear")
      return make_error("rope scaling '{}' is not supported (tandem supports none and linear)", **scaling);
    auto factor = f.get_float(p + "rope.scaling.factor");
    if (!factor.ok()) return factor.error();
    if (factor->has_value()) c.rope_linear_scale = **factor;
    if (!(c.rope_linear_scale > 0.0)) return make_error("rope.scaling.factor {} must be > 0", c.rope_linear_scale);
  }

  auto eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.error();
  if (eps->has_value()) c.rms_eps = (float)**eps;

  const GgufTensor* embd = f.find_tensor("token_embd.weight");
  if (!embd) return make_error("missing tensor token_embd.weight");
  if (embd->dims.size() != 2) return make_error("token_embd.weight has {} dims, expected 2", embd->dims.size());
  c.n_vocab = (int)embd->dims[1];
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace tandem
