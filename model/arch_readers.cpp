// One short reader per family: each fills an ArchSpec from the GGUF keys and tensor names that
// llama.cpp's converters write for it (keys prefixed by the architecture, "gemma3.rope.freq_base").
#include "model/arch_readers.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "model/rope_frequencies.h"

namespace tandem {

namespace {

// A float key that must be finite and > 0 when present.
Result<double> positive_float(const GgufFile& f, const std::string& key, double fallback) {
  auto v = f.get_float(key);
  if (!v.ok()) return v.error();
  if (!v->has_value()) return fallback;
  if (!std::isfinite(**v) || !(**v > 0.0) || **v > 1e12)
    return make_error("metadata '{}' = {:g} is out of range (must be finite and > 0)", key, **v);
  return **v;
}

bool has_tensor(const GgufFile& f, const std::string& name) { return f.find_tensor(name) != nullptr; }

// What every family shares: RoPE set 0 from rope.freq_base and linear scaling, one per layer,
// no window, scores scaled by 1 / sqrt(head_dim), and q/k/v as separate or fused matrices.
ArchSpec base_spec(const GgufFile& f, const ModelConfig& c, std::string family) {
  ArchSpec s;
  s.family = std::move(family);
  s.rope_sets = {RopeSet{c.rope_base, c.rope_linear_scale, true, c.rope_yarn_factor, c.rope_yarn_orig_ctx}};
  s.layers.assign((size_t)c.n_layer, LayerSpec{});
  s.attention_scale = 1.0f / std::sqrt((float)c.head_dim);
  // YaRN scales every rotation by a gain (rope_frequencies.h): q . k of fully rotated heads
  // grows by its square, which the score scale carries (readers refuse partial rotation).
  if (c.rope_yarn_factor > 0.0) s.attention_scale *= (float)std::pow(yarn_gain(c.rope_yarn_factor, c.rope_yarn_attn_factor), 2);
  s.fused_qkv = has_tensor(f, "blk.0.attn_qkv.weight");  // unambiguous whoever writes it
  return s;
}

// Llama; with expert_count > 0 a Mixtral: softmax routing, top-k renormalised.
Result<ArchSpec> read_llama(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "llama");
  auto experts = f.get_uint(c.arch + ".expert_count");
  if (!experts.ok()) return experts.error();
  if (experts->value_or(0) > 0) TANDEM_TRY(read_experts(f, c, {.normalize = true, .read_width = false}, s));
  return s;
}

// Granite is Llama's layout with four multipliers: embeddings, each residual branch, the
// attention scores (instead of 1 / sqrt(head_dim)), and the logits (divided by logit_scale).
Result<ArchSpec> read_granite(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "granite");
  const std::string p = c.arch + ".";
  auto embedding = positive_float(f, p + "embedding_scale", 1.0);
  auto residual = positive_float(f, p + "residual_scale", 1.0);
  auto logit = positive_float(f, p + "logit_scale", 1.0);
  auto raw_attention = f.get_float(p + "attention.scale");  // absent or 0: 1 / sqrt(head_dim)
  if (!raw_attention.ok()) return raw_attention.error();
  auto attention = raw_attention->value_or(0.0) == 0.0 ? Result<double>(s.attention_scale)
                                                        : positive_float(f, p + "attention.scale", 0.0);
  for (auto* r : {&embedding, &residual, &attention, &logit})
    if (!r->ok()) return r->error();
  s.embedding_scale = (float)*embedding;
  s.residual_scale = (float)*residual;
  s.attention_scale = (float)*attention;
  s.logit_scale = (float)(1.0 / *logit);
  // Granite's converters use rope.scaling.finetuned as RoPE's on/off switch (llama.cpp reads
  // it so): false means no rotary embedding at all.
  auto rope = f.get_bool(p + "rope.scaling.finetuned");
  if (!rope.ok()) return rope.error();
  s.use_rope = rope->value_or(true);
  return s;
}

// Qwen2: biases on q, k and v; RoPE on NeoX halves.
Result<ArchSpec> read_qwen2(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "qwen2");
  s.rope_style = RopeStyle::NeoxHalves;
  s.qkv_bias = true;
  return s;
}

// Qwen3: no biases; RMSNorm over each head of q and k before RoPE (QK-norm); NeoX halves.
Result<ArchSpec> read_qwen3(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "qwen3");
  s.rope_style = RopeStyle::NeoxHalves;
  s.qk_norm = true;
  return s;
}

// Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention; every layer's FFN is routed experts,
// softmax over all, top-k renormalised.
Result<ArchSpec> read_qwen3moe(const GgufFile& f, const ModelConfig& c) {
  auto s = read_qwen3(f, c);
  if (!s.ok()) return s;
  s->family = "qwen3moe";
  TANDEM_TRY(read_experts(f, c, {.normalize = true}, *s));
  return s;
}

// OLMoE: NeoX halves, QK-norm over the whole q and k rows (not per head), softmax top-k not
// renormalised.
Result<ArchSpec> read_olmoe(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "olmoe");
  s.rope_style = RopeStyle::NeoxHalves;
  s.qk_norm = true;
  s.qk_norm_rows = true;
  TANDEM_TRY(read_experts(f, c, {.read_width = false}, s));
  return s;
}

// Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention; routed experts, softmax
// top-k not renormalised, plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).
Result<ArchSpec> read_qwen2moe(const GgufFile& f, const ModelConfig& c) {
  auto s = read_qwen2(f, c);
  if (!s.ok()) return s;
  s->family = "qwen2moe";
  TANDEM_TRY(read_experts(f, c, {.shared_expert = true}, *s));
  return s;
}

// Phi-3: q, k, v in one attn_qkv matrix and gate, up in one ffn_up (both split at load); NeoX
// halves. Files for the 128k-context variants carry per-frequency "LongRoPE" factors chosen by
// context length, which tandem does not implement: refused, not run wrongly. The file's
// sliding_window key is ignored, as llama.cpp ignores it (the converters fill it with the
// training context, so it never binds inside the 4k context anyway).
Result<ArchSpec> read_phi3(const GgufFile& f, const ModelConfig& c) {
  if (has_tensor(f, "rope_factors_long.weight") || has_tensor(f, "rope_factors_short.weight"))
    return make_error("this Phi-3 file uses LongRoPE factors (rope_factors_long/short), which tandem does not support");
  ArchSpec s = base_spec(f, c, "phi3");
  s.rope_style = RopeStyle::NeoxHalves;
  // Only Phi-3 stacks gate and up in ffn_up: elsewhere a missing ffn_gate is a broken file.
  s.fused_gate_up = !has_tensor(f, "blk.0.ffn_gate.weight");
  return s;
}

// Which layers of a sliding-window model are windowed: the file's per-layer array, or a
// period n (every n-th layer, the last of each period, attends globally; 0: every layer is
// windowed), by default `period`. A period longer than the model (a cut-down file) leaves
// every layer windowed, as llama.cpp reads it.
Result<std::vector<bool>> read_windowed_layers(const GgufFile& f, const std::string& key, int n_layer, uint64_t period) {
  std::vector<bool> windowed((size_t)n_layer);
  if (const GgufArray* a = f.get_array(key)) {
    if (a->count != (uint64_t)n_layer)
      return make_error("metadata '{}' has {} entries for {} layers", key, a->count, n_layer);
    const GgufType t = a->elem_type;
    if (t == GgufType::STRING || t == GgufType::ARRAY || t == GgufType::FLOAT32 || t == GgufType::FLOAT64)
      return make_error("metadata '{}' must be an array of booleans or integers", key);
    for (int i = 0; i < n_layer; i++) windowed[(size_t)i] = a->integer((uint64_t)i) != 0;
    return windowed;
  }
  auto v = f.get_uint(key);
  if (!v.ok()) return v.error();
  if (v->has_value()) period = **v;
  if (period > (1u << 30)) return make_error("metadata '{}' = {} is out of range", key, period);
  for (int i = 0; i < n_layer; i++) windowed[(size_t)i] = period == 0 || (uint64_t)i % period < period - 1;
  return windowed;
}

// Gemma 3: sandwich norms, GELU-tanh gate, QK-norm, NeoX halves, embeddings times
// sqrt(n_embd). Local layers see a sliding window with their own RoPE base (10000 unless the
// file says); every sixth layer is global, with rope.freq_base and the file's scaling.
// Scores are scaled by 1 / sqrt(head_dim), except the 27B (62 layers), whose query scale is
// 1 / sqrt(n_embd / n_head) (Google's gemma_pytorch config; llama.cpp does the same).
Result<ArchSpec> read_gemma3(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "gemma3");
  const std::string p = c.arch + ".";
  s.norms = NormPlacement::Sandwich;
  s.activation = GateActivation::GeluTanh;
  s.rope_style = RopeStyle::NeoxHalves;
  s.qk_norm = true;
  s.embedding_scale = std::sqrt((float)c.n_embd);
  if (c.n_layer == 62) s.attention_scale = 1.0f / std::sqrt((float)(c.n_embd / c.n_head));
  auto softcap = f.get_float(p + "final_logit_softcapping");  // absent or 0: none
  if (!softcap.ok()) return softcap.error();
  if (softcap->has_value() && **softcap != 0.0) {
    if (!std::isfinite(**softcap) || !(**softcap > 0.0))
      return make_error("metadata '{}final_logit_softcapping' = {:g} must be > 0", p, **softcap);
    s.logit_softcap = (float)**softcap;
  }

  auto window = f.get_uint(p + "attention.sliding_window");
  if (!window.ok()) return window.error();
  if (!window->has_value() || **window == 0) return s;  // no sliding window: every layer global
  if (**window > (1u << 30)) return make_error("metadata '{}attention.sliding_window' = {} is out of range", p, **window);
  auto local_base = positive_float(f, p + "rope.freq_base_swa", 10000.0);
  if (!local_base.ok()) return local_base.error();
  s.rope_sets.push_back(RopeSet{*local_base, 1.0, false});
  auto windowed = read_windowed_layers(f, p + "attention.sliding_window_pattern", c.n_layer, 6);
  if (!windowed.ok()) return windowed.error();
  for (int i = 0; i < c.n_layer; i++)
    if ((*windowed)[(size_t)i]) s.layers[(size_t)i] = LayerSpec{1, (int64_t)**window};
  return s;
}

// gpt-oss (20b, 120b): q/k/v/o biases, one attention sink per head, a sliding window on the
// even layers (sliding_window_pattern, by default 2), YaRN, the FFN's input norm named
// post_attention_norm; experts chosen by the top-k of the raw (biased) router logits and
// weighed by a softmax over those k, with biases and the clamped SwiGLU.
Result<ArchSpec> read_gptoss(const GgufFile& f, const ModelConfig& c) {
  ArchSpec s = base_spec(f, c, "gpt-oss");
  const std::string p = c.arch + ".";
  s.rope_style = RopeStyle::NeoxHalves;
  s.qkv_bias = true;
  s.attn_output_bias = true;
  s.attn_sinks = true;
  s.ffn_norm = "post_attention_norm";
  s.activation = GateActivation::SwigluOai;
  TANDEM_TRY(read_experts(f, c, {.softmax_over_top_k = true}, s));
  s.moe.router_bias = s.moe.expert_bias = true;
  auto window = f.get_uint(p + "attention.sliding_window");
  if (!window.ok()) return window.error();
  if (!window->has_value() || **window == 0 || **window > (1u << 30))
    return make_error("metadata '{}attention.sliding_window' is missing or out of range", p);
  auto windowed = read_windowed_layers(f, p + "attention.sliding_window_pattern", c.n_layer, 2);
  if (!windowed.ok()) return windowed.error();
  auto local_base = positive_float(f, p + "rope.freq_base_swa", c.rope_base);
  if (!local_base.ok()) return local_base.error();
  if (*local_base != c.rope_base) {  // windowed layers rotate by their own base, with the same YaRN
    RopeSet local = s.rope_sets[0];
    local.base = *local_base;
    s.rope_sets.push_back(local);
  }
  for (int i = 0; i < c.n_layer; i++)
    if ((*windowed)[(size_t)i]) {
      s.layers[(size_t)i].rope_set = (int)s.rope_sets.size() - 1;
      s.layers[(size_t)i].window = (int64_t)**window;
    }
  return s;
}

struct Family {
  std::string_view arch;  // general.architecture
  Result<ArchSpec> (*read)(const GgufFile&, const ModelConfig&);
};

constexpr std::array<Family, 11> kFamilies = {{
    {"llama", read_llama},
    {"mistral", read_llama},
    {"granite", read_granite},
    {"qwen2", read_qwen2},
    {"qwen3", read_qwen3},
    {"qwen2moe", read_qwen2moe},
    {"qwen3moe", read_qwen3moe},
    {"olmoe", read_olmoe},
    {"gemma3", read_gemma3},
    {"phi3", read_phi3},
    {"gpt-oss", read_gptoss},
}};

}  // namespace

std::string supported_architectures() {
  std::string s;
  for (const Family& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.arch);
  return s;
}

bool is_supported_architecture(std::string_view arch) {
  for (const Family& f : kFamilies)
    if (f.arch == arch) return true;
  return false;
}

Result<ArchSpec> read_arch_spec(const GgufFile& f, const ModelConfig& c) {
  for (const Family& fam : kFamilies)
    if (fam.arch == c.arch) return fam.read(f, c);
  return make_error("architecture '{}' is not supported (tandem runs: {})", c.arch, supported_architectures());
}

std::string ArchSpec::describe() const {
  std::string s = family + ": ";
  s += norms == NormPlacement::Sandwich ? "sandwich norms" : "pre-norm";
  s += activation == GateActivation::GeluTanh    ? ", GELU-tanh gate"
       : activation == GateActivation::SwigluOai ? ", clamped SwiGLU gate"
                                                 : ", SiLU gate";
  if (!use_rope)
    s += ", no RoPE";
  else
    s += rope_style == RopeStyle::NeoxHalves ? ", RoPE on NeoX halves" : ", RoPE on adjacent pairs";
  for (size_t i = 0; i < rope_sets.size(); i++)
    s += fmt::format("{}{:g}{}", i == 0 ? " (base " : ", local layers' base ", rope_sets[i].base,
                     i + 1 == rope_sets.size() ? ")" : "");
  if (fused_qkv) s += ", fused qkv";
  if (fused_gate_up) s += ", fused gate/up";
  if (qkv_bias) s += ", qkv bias";
  if (attn_output_bias) s += ", output bias";
  if (attn_sinks) s += ", attention sinks";
  if (rope_sets[0].yarn_factor > 0) s += fmt::format(", YaRN x{:g} of {}", rope_sets[0].yarn_factor, rope_sets[0].yarn_orig_ctx);
  if (qk_norm) s += qk_norm_rows ? ", QK-norm over whole rows" : ", QK-norm";
  s += fmt::format(", score scale {:.4g}", attention_scale);
  if (const int n = windowed_layers()) s += fmt::format(", sliding window {} on {} of {} layers", max_window(), n, layers.size());
  if (embedding_scale != 1.0f) s += fmt::format(", embeddings x{:.4g}", embedding_scale);
  if (residual_scale != 1.0f) s += fmt::format(", residuals x{:.4g}", residual_scale);
  if (logit_scale != 1.0f) s += fmt::format(", logits x{:.4g}", logit_scale);
  if (logit_softcap > 0.0f) s += fmt::format(", logit soft-cap {:g}", logit_softcap);
  if (moe.active()) {
    const MoeRouting& r = moe.routing;
    s += fmt::format(", {} experts of width {} ({} used, {}{})", r.n_expert, moe.n_ff, r.n_used,
                     r.softmax_over_top_k ? "softmax over the top-k" : "softmax, top-k",
                     r.normalize ? " renormalised" : "");
    if (r.scale != 1.0f) s += fmt::format(", expert weights x{:g}", r.scale);
    if (moe.n_ff_shared > 0) s += fmt::format(", a shared expert of width {}", moe.n_ff_shared);
    if (moe.leading_dense > 0) s += fmt::format(", the first {} layers dense", moe.leading_dense);
  }
  return s;
}

int64_t ArchSpec::max_window() const {
  int64_t w = 0;
  for (const LayerSpec& l : layers) w = std::max(w, l.window);
  return w;
}

int ArchSpec::windowed_layers() const {
  int n = 0;
  for (const LayerSpec& l : layers) n += l.window > 0;
  return n;
}

}  // namespace tandem
