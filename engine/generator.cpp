#include "engine/generator.h"

#include <algorithm>

#include "core/timer.h"
#include "engine/scheduler.h"

namespace tandem {

namespace {

constexpr int kBlockTokens = 16;

Status check_prompt(const Model& m, const std::vector<int32_t>& prompt, const GenerationConfig& cfg) {
  if (prompt.empty()) return make_error("the prompt is empty (no tokens)");
  if (cfg.max_new_tokens < 0) return make_error("max_new_tokens {} is negative", cfg.max_new_tokens);
  const int64_t ctx = m.config().n_ctx_train;
  if ((int64_t)prompt.size() > ctx)
    return make_error("prompt of {} tokens is longer than the model's context of {} tokens", prompt.size(), ctx);
  return Status::Ok();
}

// The pool's size in positions: the kept context when set, else prompt plus new tokens within
// the model's context.
Result<int64_t> pool_capacity(const Model& m, int64_t context_tokens, int64_t n_prompt, const GenerationConfig& cfg) {
  int64_t capacity = std::min<int64_t>(n_prompt + cfg.max_new_tokens, m.config().n_ctx_train);
  if (context_tokens > 0) {
    if (n_prompt > context_tokens)
      return make_error("prompt of {} tokens does not fit the KV cache of {} positions", n_prompt, context_tokens);
    capacity = context_tokens;
  }
  return capacity;
}

// One sequence at a time, the config's batch, speculation and masker.
SchedulerOptions scheduler_options(const GenerationConfig& cfg, DraftModel draft) {
  SchedulerOptions so;
  so.max_batch_tokens = std::max<int64_t>(1, cfg.max_batch_tokens);
  so.max_running = 1;
  so.no_kv_cache = !cfg.use_kv_cache;
  so.speculative = cfg.speculative;
  so.masker = cfg.masker;
  so.draft_model = draft;
  return so;
}

RequestParams request_params(const std::vector<int32_t>& prompt, const GenerationConfig& cfg, int64_t capacity) {
  RequestParams rp;
  rp.prompt = prompt;
  // Generation ends where the pool (the context) is full, as it always has.
  rp.max_tokens = (int)std::min<int64_t>(cfg.max_new_tokens, std::max<int64_t>(0, capacity - (int64_t)prompt.size()));
  rp.sampling = cfg.sampling;
  rp.grammar = cfg.grammar;
  if (cfg.stop_at_eog) rp.stop_tokens = cfg.stop_tokens;
  return rp;
}

// The counts from the last event and the scheduler's totals, once the request has finished.
void finish_stats(const SeqEvent& last, const SchedulerStats& ss, GenerationStats* st) {
  st->n_reused = last.n_cached;
  st->stopped_by_eog = last.finish == FinishReason::Stop && last.by_stop_token;
  st->grammar_complete = last.finish == FinishReason::Stop && !last.by_stop_token;
  st->n_generated = last.n_generated + (st->stopped_by_eog ? 1 : 0);
  // Every token after the first came from a decode step (the end-of-generation one included).
  st->n_decode_tokens = std::max(0, st->n_generated - 1);
  st->n_drafted = ss.drafted_tokens;
  st->n_accepted = ss.accepted_tokens;
  st->n_verify_steps = ss.verify_steps;
  st->n_masks = ss.masks;
  st->mask_s = ss.mask_s;
  st->n_draft_passes = ss.draft_passes - ss.draft_prefill_passes;
  st->draft_s = ss.draft_pass_s - ss.draft_prefill_s;
  st->n_draft_prefill_passes = ss.draft_prefill_passes;
  st->draft_prefill_s = ss.draft_prefill_s;
}

}  // namespace

Generator::Generator(Model& model, int64_t context_tokens) : model_(model), context_tokens_(context_tokens) {}
Generator::~Generator() = default;

Status Generator::ensure_pool(int64_t tokens, DType dtype) {
  const int64_t blocks = std::max<int64_t>(1, (tokens + kBlockTokens - 1) / kBlockTokens);
  if (pool_ && pool_->shape().dtype == dtype && pool_->n_blocks() >= blocks) return Status::Ok();
  pool_.reset();
  auto p = model_.new_kv_pool(blocks, dtype, kBlockTokens);
  if (!p.ok()) return p.error();
  pool_ = std::move(p.value());
  return Status::Ok();
}

// Mode Draft: the draft model's pool, rebuilt only when the model or the target pool changed.
Result<DraftModel> Generator::ensure_draft_pool(const GenerationConfig& cfg) {
  if (cfg.speculative.mode != SpeculativeMode::Draft) return DraftModel{};
  if (!cfg.draft_model) return make_error("speculative mode 'draft' needs a draft model (--draft-model FILE)");
  if (draft_pool_model_ != cfg.draft_model || !draft_pool_ || draft_pool_->n_blocks() != pool_->n_blocks() ||
      draft_pool_->shape().dtype != pool_->shape().dtype) {
    TANDEM_TRY(check_draft_vocabulary(model_, *cfg.draft_model));
    draft_pool_.reset();
    auto p = new_draft_pool(*cfg.draft_model, *pool_);
    if (!p.ok()) return p.error();
    draft_pool_ = std::move(p.value());
    draft_pool_model_ = cfg.draft_model;
  }
  return DraftModel{cfg.draft_model, draft_pool_.get()};
}

Result<GenerationStats> Generator::generate(const std::vector<int32_t>& prompt, const GenerationConfig& cfg,
                                            const TokenCallback& on_token) {
  TANDEM_TRY(check_prompt(model_, prompt, cfg));
  const int64_t n_prompt = (int64_t)prompt.size();
  auto capacity = pool_capacity(model_, context_tokens_, n_prompt, cfg);
  if (!capacity.ok()) return capacity.error();
  // One position past the capacity: the scheduler admits a prompt with room for its next token.
  TANDEM_TRY(ensure_pool(*capacity + 1, cfg.kv_dtype));
  auto draft = ensure_draft_pool(cfg);
  if (!draft.ok()) return draft.error();

  const SchedulerOptions so = scheduler_options(cfg, *draft);
  Scheduler sched(model_, *pool_, so);
  GenerationStats st;
  st.n_prompt = (int)n_prompt;
  st.kv_bytes = pool_->bytes();
  st.kv_tokens = pool_->n_blocks() * pool_->block_tokens();
  bool first = true;
  SeqEvent last;
  const Backend& be = model_.backend();
  const double attention0 = be.attention_seconds();
  double prefill_attention = -1;
  Timer t;
  auto added = sched.add(request_params(prompt, cfg, *capacity), [&](const SeqEvent& e) {
    if (first && (e.finish == FinishReason::None || e.by_stop_token)) {
      // The first token sampled; when it is a stop token no token event comes, but prefill ran
      // all the same and its time and TTFT are recorded.
      first = false;
      st.prefill_s = sched.stats().pass_s;
      st.ttft_s = t.seconds();
      prefill_attention = be.attention_seconds();
    }
    if (e.finish != FinishReason::None) {
      last = e;
      return true;
    }
    return on_token(e.token);
  });
  if (!added.ok()) return added.error();
  while (sched.has_work()) {
    const bool decoding = !first;
    Timer step;
    const Status s = sched.step();
    if (!s.ok()) return s.error();
    if (decoding) {
      st.decode_s += step.seconds();
      st.n_decode_steps++;
    }
  }
  if (last.finish == FinishReason::Error) return make_error("{}", last.error);
  finish_stats(last, sched.stats(), &st);
  if (first && cfg.max_new_tokens == 0) st.prefill_s = sched.stats().pass_s, st.ttft_s = 0;
  if (attention0 >= 0 && !draft.value() && !first) {
    st.prefill_attention_s = prefill_attention - attention0;
    st.decode_attention_s = be.attention_seconds() - prefill_attention;
  }
  return st;
}

}  // namespace tandem
