#include "engine/generator.h"

#include <algorithm>

#include "core/timer.h"

namespace tandem {

namespace {

bool is_stop(const GenerationConfig& cfg, int32_t tok) {
  return cfg.stop_at_eog && std::find(cfg.stop_tokens.begin(), cfg.stop_tokens.end(), tok) != cfg.stop_tokens.end();
}

Status check_prompt(const LlamaModel& m, const std::vector<int32_t>& prompt, const GenerationConfig& cfg) {
  if (prompt.empty()) return make_error("the prompt is empty (no tokens)");
  if (cfg.max_new_tokens < 0) return make_error("max_new_tokens {} is negative", cfg.max_new_tokens);
  const int64_t ctx = m.config().n_ctx_train;
  if ((int64_t)prompt.size() > ctx)
    return make_error("prompt of {} tokens is longer than the model's context of {} tokens", prompt.size(), ctx);
  return Status::Ok();
}

}  // namespace

Result<GenerationStats> Generator::generate(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                            const TokenCallback& on_token) {
  TANDEM_TRY(check_prompt(model_, prompt, cfg));
  if (!cfg.use_kv_cache) return generate_no_cache(prompt, cfg, on_token);
  const int64_t need = std::min<int64_t>((int64_t)prompt.size() + cfg.max_new_tokens, model_.config().n_ctx_train);
  auto kv = model_.new_kv_cache(need, cfg.kv_dtype);
  if (!kv.ok()) return kv.error();
  std::vector<int32_t> history;
  return generate_in(kv.value(), history, prompt, cfg, on_token);
}

Result<GenerationStats> Generator::generate_in(KvCache& kv, std::vector<int32_t>& history,
                                               const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                               const TokenCallback& on_token) {
  TANDEM_TRY(check_prompt(model_, prompt, cfg));
  if ((int64_t)prompt.size() > kv.capacity())
    return make_error("prompt of {} tokens does not fit the KV cache of {} positions", prompt.size(), kv.capacity());
  GenerationStats st;
  st.n_prompt = (int)prompt.size();
  st.kv_bytes = kv.allocated_bytes();

  // Keep the cached prefix that matches; the last prompt token always runs so there are logits.
  size_t keep = 0;
  while (keep < history.size() && keep + 1 < prompt.size() && history[keep] == prompt[keep] &&
         (int64_t)keep < kv.size())
    keep++;
  kv.truncate((int64_t)keep);
  history.resize(keep);
  st.n_reused = (int)keep;

  Sampler sampler(cfg.sampling);
  Timer t;
  auto logits = model_.prefill(kv, std::span<const int32_t>(prompt).subspan(keep));
  if (!logits.ok()) return logits.error();
  st.prefill_s = t.seconds();
  history.insert(history.end(), prompt.begin() + keep, prompt.end());
  if (cfg.max_new_tokens == 0) return st;
  int32_t tok = sampler.sample(logits.value(), history);
  st.ttft_s = t.seconds();

  while (true) {
    st.n_generated++;
    if (is_stop(cfg, tok)) {
      st.stopped_by_eog = true;
      break;
    }
    if (!on_token(tok) || st.n_generated >= cfg.max_new_tokens || kv.size() >= kv.capacity()) break;
    history.push_back(tok);
    Timer step;
    auto next = model_.decode(kv, tok);
    if (!next.ok()) return next.error();
    tok = sampler.sample(next.value(), history);
    st.decode_s += step.seconds();
    st.n_decode_steps++;
  }
  return st;
}

Result<GenerationStats> Generator::generate_no_cache(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                                     const TokenCallback& on_token) {
  GenerationStats st;
  st.n_prompt = (int)prompt.size();
  std::vector<int32_t> seq = prompt;
  Sampler sampler(cfg.sampling);
  Timer t;
  auto logits = model_.forward_no_cache(seq, cfg.kv_dtype);
  if (!logits.ok()) return logits.error();
  st.prefill_s = t.seconds();
  if (cfg.max_new_tokens == 0) return st;
  int32_t tok = sampler.sample(logits.value(), seq);
  st.ttft_s = t.seconds();
  const int64_t ctx = model_.config().n_ctx_train;
  while (true) {
    st.n_generated++;
    if (is_stop(cfg, tok)) {
      st.stopped_by_eog = true;
      break;
    }
    if (!on_token(tok) || st.n_generated >= cfg.max_new_tokens || (int64_t)seq.size() >= ctx) break;
    seq.push_back(tok);
    Timer step;
    // The naive step: K and V of every earlier position are computed again.
    auto next = model_.forward_no_cache(seq, cfg.kv_dtype);
    if (!next.ok()) return next.error();
    tok = sampler.sample(next.value(), seq);
    st.decode_s += step.seconds();
    st.n_decode_steps++;
  }
  return st;
}

}  // namespace tandem
