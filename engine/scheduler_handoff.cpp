// The scheduler's two ends of a KV hand-off in disaggregated serving (engine/disaggregation.h):
// on a prefill rank, a prefill_only sequence ends when its prompt is computed, its finish event
// carrying the last logits row; on the decode rank, a prepared sequence whose prompt K,V
// arrived from a prefill rank joins the running ones as if it had prefilled here, its first
// token sampled from that row by its own sampler, grammar and logprobs.
#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

void Scheduler::finish_prefill(Seq& s, std::span<const float> row) {
  s.finished = true;
  release_blocks(s);
  SeqEvent e;
  e.id = s.id;
  e.finish = FinishReason::Stop;
  e.n_prompt = s.n_prompt;
  e.n_cached = s.n_cached;
  e.n_preemptions = s.n_preemptions;
  e.last_logits.assign(row.begin(), row.begin() + (ptrdiff_t)model_.config().n_vocab);
  s.cb(e);
}

void Scheduler::admit_prefilled(std::unique_ptr<Seq> sp, std::span<const float> last_row, int n_cached) {
  Seq& s = *sp;
  s.n_computed = s.n_prompt;
  s.n_cached = n_cached;
  s.n_cached_now = 0;
  s.admitted = true;
  stats_.prompt_tokens += s.n_prompt;
  stats_.cached_prompt_tokens += n_cached;
  running_.push_back(std::move(sp));
  std::vector<Seq*> done;
  if (s.n_generated >= s.params.max_tokens) {
    done.push_back(&s);
  } else if (const int32_t tok = sample_next(s, last_row); tok >= 0) {
    emit(s, tok, last_row, done);
  }
  for (Seq* d : done) finish(*d, FinishReason::Length);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& r) { return r->finished; }), running_.end());
}

void Scheduler::drop_prepared(Seq& s, FinishReason r, const std::string& error) { finish(s, r, error); }

}  // namespace tandem
